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


def test_hop_floor_measures_the_prepared_reply_next_to_the_thread_kind_and_the_plain_model():
    from bench import hop_floor
    from pytriton.proxy import _worker

    real = _worker.InstanceWorker._infer_on
    before = _leftovers()
    result = hop_floor.run(count=100, rounds=2)  # raises if the prepared-reply model never answered
    assert _worker.InstanceWorker._infer_on is real, "the prepared reply outlived the run"
    assert len(result["rounds"]) == 2
    for row in result["rounds"]:
        assert set(row) == {"thread", "thread_prepared", "plain_identity"}
        assert row["plain_identity"]["ratio"] == 1.0
        for name in row:
            assert row[name]["p50_us"] > 0
            assert row[name]["ratio"] == row[name]["p50_us"] / row["plain_identity"]["p50_us"]
    assert result["median"]["thread"]["p50_us"] == statistics.median(
        row["thread"]["p50_us"] for row in result["rounds"]
    )
    assert result["budget_1_2x_us"] == 0.2 * result["median"]["plain_identity"]["p50_us"]
    assert len(result["host"]) == 2
    assert _leftovers() == before, "the run left its model repository behind"
