"""A/B runs of proxy settings against each other and the plain baseline, in one server.

Usage::

    python -m bench.ab '{"default": {}, "worker_poll_2ms": {"PYTRITON_WORKER_SPIN_US": "2000"}}' [COUNT]

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
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
import tempfile
from typing import Any, Dict

import numpy as np

from bench.__main__ import ROOT, free_ports, load, load_plain_models
from bench.models import identity, write_plain_models
from pytriton.model_config import ModelConfig, Tensor
from pytriton.server import settings
from pytriton.triton import Triton, TritonConfig


def run(variants: Dict[str, Dict[str, str]], count: int = 3000) -> Dict[str, Any]:
    """Measure every variant and the plain model; returns percentiles and ratios per model."""
    if "plain_identity" in variants:
        raise ValueError("'plain_identity' is the baseline's name; pick another variant name")
    with tempfile.TemporaryDirectory(prefix="pytriton-bench-ab-") as directory:
        measured = _measure(variants, count, pathlib.Path(directory))
    baseline = measured["plain_identity"]["p50_ms"]
    for result in measured.values():
        result["ratio"] = result["p50_ms"] / baseline
    return {"variants": variants, "count": count, "results": measured}


def _measure(variants: Dict[str, Dict[str, str]], count: int, repository: pathlib.Path) -> Dict[str, Any]:
    """Serve the variants and the plain model from ``repository`` and measure them."""
    http_port, grpc_port, metrics_port = free_ports(3)
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
            triton.bind(
                name,
                identity,
                [Tensor(name="INPUT", shape=(16,), dtype=np.float32)],
                [Tensor(name="OUTPUT", shape=(16,), dtype=np.float32)],
                config=ModelConfig(max_batch_size=32),
            )
        load_plain_models(http_port, ["plain_identity"], triton.get_access_token())
        models = [*variants, "plain_identity"]
        measured: Dict[str, Any] = load(
            {"scenario": "latency_interleaved", "protocol": "http", "port": http_port, "models": models,
             "count": count, "max_s": 300.0},
            timeout_s=400.0,
        )  # fmt: skip
    return measured


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    variants = json.loads(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    results = run(variants, count)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "ab.json").write_text(json.dumps(results, indent=2))
    print(f"{'model':24s} {'p50 ms':>8s} {'p90 ms':>8s} {'ratio':>6s}   ({count} requests each)")
    for model, result in results["results"].items():
        print(f"{model:24s} {result['p50_ms']:8.3f} {result['p90_ms']:8.3f} {result['ratio']:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
