"""A/B runs of proxy settings against each other and the plain baseline, in one server.

Usage::

    python -m bench.ab '{"default": {}, "worker_poll_2ms": {"PYTRITON_WORKER_SPIN_US": "2000"}}' [COUNT]
    python -m bench.ab --stream '{"default": {}, "stub_poll": {"PYTRITON_PROXY_SPIN_US": "1000"}}' [ROUNDS]

Each key names a variant: the same ``[1,16]`` float32 identity callable bound with the polling
windows that the given environment variables (``PYTRITON_PROXY_SPIN_US``, ``PYTRITON_WORKER_SPIN_US``,
over the current environment) resolve to, and with the callables' metrics on or off as
``PYTRITON_TRITON_CONFIG_CALLABLE_METRICS`` says (docs/metrics.md).
For example ``'{"on": {}, "off": {"PYTRITON_TRITON_CONFIG_CALLABLE_METRICS": "0"}}'``. ``Triton`` resolves them once, at construction; this
script swaps the resolved windows in before each bind, so that one server serves every variant.
Models are bound after the server started, so every variant gets its own worker threads and stubs. One client process then measures every variant and ``plain_identity`` in
alternating blocks of 50 sequential HTTP requests (``bench.load.latency_interleaved``) and the
script prints p50, p90 and the ratio to the plain model, and writes them to
``bench/results/ab.json``.

With ``--stream`` each variant is instead the decoupled generator of the full benchmark's streaming
scenario (``bench.models.stream``: 200 one-element responses per request, over gRPC), and the
variants take turns, one round of 10 streams each (``bench.load.stream_grpc``), for ROUNDS rounds
(default 8) in an order that alternates each round. It prints the median responses per second,
each round's figure and the median time to the first response, and writes
``bench/results/ab_stream.json``. There is no plain baseline: the comparison is between variants.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Tuple

from bench._common import ROOT, free_ports, load, load_plain_models
from bench.models import bind_identity, bind_stream, write_plain_models
from pytriton.server import settings
from pytriton.triton import Triton, TritonConfig


def run(variants: Dict[str, Dict[str, str]], count: int = 3000) -> Dict[str, Any]:
    """Measure every variant and the plain model; returns percentiles and ratios per model."""
    if "plain_identity" in variants:
        raise ValueError("'plain_identity' is the baseline's name; pick another variant name")
    with _served(variants, bind_identity, plain=True) as (triton, http_port, _):
        load_plain_models(http_port, ["plain_identity"], triton.get_access_token())
        measured: Dict[str, Any] = load(
            {"scenario": "latency_interleaved", "protocol": "http", "port": http_port,
             "models": [*variants, "plain_identity"], "count": count, "max_s": 300.0},
            timeout_s=400.0,
        )  # fmt: skip
    baseline = measured["plain_identity"]["p50_ms"]
    for result in measured.values():
        result["ratio"] = result["p50_ms"] / baseline
    return {"variants": variants, "count": count, "results": measured}


def run_stream(variants: Dict[str, Dict[str, str]], rounds: int = 8, responses: int = 200) -> Dict[str, Any]:
    """Stream from every variant in turns; returns the responses per second and time to first response."""
    rates: Dict[str, List[float]] = {name: [] for name in variants}
    first: Dict[str, List[float]] = {name: [] for name in variants}
    with _served(variants, bind_stream, plain=False) as (_, _http_port, grpc_port):
        for number in range(rounds):
            order = list(variants) if number % 2 == 0 else list(reversed(list(variants)))
            for name in order:
                result = load(
                    {"scenario": "stream_grpc", "port": grpc_port, "model": name, "responses": responses,
                     "repeats": 10},
                )  # fmt: skip
                rates[name].append(result["responses_per_s"])
                first[name].append(result["time_to_first_ms"])
    measured = {
        name: {
            "responses_per_s": statistics.median(rates[name]),
            "rounds_responses_per_s": rates[name],
            "time_to_first_ms": statistics.median(first[name]),
        }
        for name in variants
    }
    return {"variants": variants, "rounds": rounds, "responses": responses, "results": measured}


@contextlib.contextmanager
def _served(
    variants: Dict[str, Dict[str, str]], bind: Callable[[Triton, str], None], plain: bool
) -> Iterator[Tuple[Triton, int, int]]:
    """A running server with each variant bound by ``bind`` (and the plain models if ``plain``).

    Yields the server and its HTTP and gRPC ports; the model repository is a temporary directory,
    removed with the server.
    """
    with tempfile.TemporaryDirectory(prefix="pytriton-bench-ab-") as directory:
        repository = pathlib.Path(directory)
        http_port, grpc_port, metrics_port = free_ports(3)
        if plain:
            write_plain_models(repository)
        config = TritonConfig(
            http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, model_repository=repository
        )
        with Triton(config=config) as triton:
            triton.run()
            for name, environment in variants.items():
                # What Triton(...) would have resolved with these variables set (see the module docstring).
                variant = settings.resolve(config, environ={**os.environ, **environment})
                triton._settings = dataclasses.replace(
                    triton._settings, polling=variant.polling, callable_metrics=variant.callable_metrics
                )
                bind(triton, name)
            yield triton, http_port, grpc_port


def main() -> int:
    arguments = sys.argv[1:]
    streaming = arguments[:1] == ["--stream"]
    if streaming:
        arguments = arguments[1:]
    if not arguments:
        print(__doc__)
        return 2
    variants = json.loads(arguments[0])
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    if streaming:
        rounds = int(arguments[1]) if len(arguments) > 1 else 8
        streamed = run_stream(variants, rounds)
        (out / "ab_stream.json").write_text(json.dumps(streamed, indent=2))
        print(f"{'model':24s} {'responses/s':>12s} {'first ms':>9s}   per round ({rounds} rounds of 10 streams)")
        for model, result in streamed["results"].items():
            each = " ".join(f"{rate:.0f}" for rate in result["rounds_responses_per_s"])
            print(f"{model:24s} {result['responses_per_s']:12.0f} {result['time_to_first_ms']:9.2f}   {each}")
        return 0
    count = int(arguments[1]) if len(arguments) > 1 else 3000
    results = run(variants, count)
    (out / "ab.json").write_text(json.dumps(results, indent=2))
    print(f"{'model':24s} {'p50 ms':>8s} {'p90 ms':>8s} {'ratio':>6s}   ({count} requests each)")
    for model, result in results["results"].items():
        print(f"{model:24s} {result['p50_ms']:8.3f} {result['p90_ms']:8.3f} {result['ratio']:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
