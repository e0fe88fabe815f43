"""The A/B tool of the benchmark against a real server (small counts: it checks the tool, not speed)."""

import pathlib
import statistics
import tempfile

import pytest

from bench import ab


def _leftovers():
    return set(pathlib.Path(tempfile.gettempdir()).glob("pytriton-bench-ab-*"))


def test_ab_measures_every_variant_next_to_the_plain_model():
    before = _leftovers()
    result = ab.run({"default": {}, "stub_poll": {"PYTRITON_PROXY_SPIN_US": "1000"}}, count=100)
    measured = result["results"]
    assert set(measured) == {"default", "stub_poll", "plain_identity"}
    for model in measured.values():
        assert model["count"] >= 100
        assert 0 < model["p50_ms"] <= model["p90_ms"] <= model["p99_ms"]
    assert measured["plain_identity"]["ratio"] == 1.0
    assert measured["default"]["ratio"] == measured["default"]["p50_ms"] / measured["plain_identity"]["p50_ms"]
    assert _leftovers() == before, "the A/B run left its model repository behind"


def test_ab_refuses_the_baselines_name():
    with pytest.raises(ValueError, match="plain_identity"):
        ab.run({"plain_identity": {}})


def test_ab_streams_from_every_variant_in_turns():
    before = _leftovers()
    result = ab.run_stream({"default": {}, "stub_poll": {"PYTRITON_PROXY_SPIN_US": "1000"}}, rounds=2, responses=20)
    measured = result["results"]
    assert set(measured) == {"default", "stub_poll"}
    for model in measured.values():
        assert len(model["rounds_responses_per_s"]) == 2
        assert all(rate > 0 for rate in model["rounds_responses_per_s"])
        assert model["responses_per_s"] == statistics.median(model["rounds_responses_per_s"])
        assert model["time_to_first_ms"] > 0
    assert _leftovers() == before, "the A/B run left its model repository behind"
