"""What tracing costs the user's process per batch: untraced, traced, and against older code.

Usage::

    python -m bench.tracing_cost [BASE_DIR] [ROUNDS]

Drives one ``InstanceWorker`` in this process directly (no socket, no server) with a one-request
``[1,16]`` float32 batch through an ``@batch`` identity callable, in alternating rounds of 2,000
batches, and prints the minimum, 10th percentile and median time per batch of each variant:

- ``untraced``: an INFER message without the trace field (a server not in OpenTelemetry mode);
- ``traced``: the same batch with Triton's trace context, spans recorded by an OpenTelemetry SDK
  tracer provider with no exporter (the span work itself; exporting is the SDK's business), two
  spans per traced request (the request's and ``@batch``'s); one bare SDK span is timed for scale;
- ``base``: with ``BASE_DIR``, the untraced batch through the worker and decorators of another
  pytriton tree (``git archive <commit> pytriton | tar -x -C BASE_DIR``), in the same process, so
  that the default path's cost of the tracing code shows up against the code without it.

The stub side is not here: an untraced server's stub checks one flag per batch; a traced request
costs the stub Triton's ``request.trace().get_context()`` (docs/tracing.md gives the figure).
Loops are bounded by ROUNDS (default 40).
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from pytriton import decorators
from pytriton.model_config.tensor import Tensor
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy import _worker
from pytriton.proxy._binding import _resolve_tensors
from pytriton.proxy.stubside import _arena, _messages, _tensors

BATCHES = 2000
CONTEXT = json.dumps({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})


def _load(name: str, path: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _variant(worker_module: Any, decorators_module: Any, message: Any) -> Tuple[Any, Callable[[], Any]]:
    config = TritonModelConfig(
        model_name="cost",
        batching=True,
        max_batch_size=8,
        inputs=_resolve_tensors([Tensor(name="x", shape=(16,), dtype=np.float32)], "INPUT", "cost"),
        outputs=_resolve_tensors([Tensor(name="y", shape=(16,), dtype=np.float32)], "OUTPUT", "cost"),
    )

    @decorators_module.batch  # type: ignore[untyped-decorator,misc]
    def identity(x: Any) -> Dict[str, Any]:
        return {"y": x}

    worker = worker_module.InstanceWorker(
        path="/nonexistent/cost.sock",  # never started: batches go straight to the session
        infer_func=identity,
        config=config,
        strict=False,
        shm_prefix=f"pytriton-{os.getpid()}-cost",
        on_unrecoverable=lambda exc: None,
        name="cost",
    )
    session = worker._direct_session()
    return worker, lambda: worker._infer_on(session, message)


def _measure(calls: Dict[str, Callable[[], Any]], rounds: int) -> None:
    times: Dict[str, List[float]] = {name: [] for name in calls}
    for call in calls.values():
        for _ in range(BATCHES):
            call()
    for _ in range(rounds):
        for name, call in calls.items():
            started = time.perf_counter()
            for _ in range(BATCHES):
                call()
            times[name].append((time.perf_counter() - started) / BATCHES * 1e6)
    for name, samples in times.items():
        samples.sort()
        print(
            f"{name:>9}: min {samples[0]:.2f} us, p10 {samples[len(samples) // 10]:.2f} us, "
            f"median {statistics.median(samples):.2f} us per batch"
        )


def main(argv: List[str]) -> None:
    base_dir = argv[0] if argv and not argv[0].isdigit() else None
    rounds = int(argv[-1]) if argv and argv[-1].isdigit() else 40
    segment, metas = _tensors.write_tensors(
        _arena.SharedArena("pytriton-cost-unused"), [[("x", np.ones((1, 16), np.float32))]]
    )  # inline: no segment
    untraced = _messages.Infer(segment, [_messages.Entry(metas[0])])
    traced = _messages.Infer(segment, [_messages.Entry(metas[0])], (time.time_ns(), [CONTEXT]))
    variants = {"untraced": _variant(_worker, decorators, untraced)}
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            trace.set_tracer_provider(TracerProvider())
        variants["traced"] = _variant(_worker, decorators, traced)
        tracer = trace.get_tracer("bench")
        started = time.perf_counter()
        for _ in range(BATCHES):
            tracer.start_span("reference").end()
        print(f"one bare SDK span (start and end): {(time.perf_counter() - started) / BATCHES * 1e6:.2f} us")
    except ImportError:
        print("opentelemetry-sdk is not installed: no traced variant")
    if base_dir is not None:
        base_worker = _load("base_pytriton_worker", os.path.join(base_dir, "pytriton/proxy/_worker.py"))
        base_decorators = _load("base_pytriton_decorators", os.path.join(base_dir, "pytriton/decorators.py"))
        variants["base"] = _variant(base_worker, base_decorators, untraced)
    # Untraced first: once a traced batch has been seen, @batch also looks for spans (see _tracing.State).
    phases = [[name for name in variants if name != "traced"], ["traced"] if "traced" in variants else []]
    for phase in phases:
        _measure({name: variants[name][1] for name in phase}, rounds)
    for worker, _ in variants.values():
        worker.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
