"""In-process load: serve the models inside this process and call them from this process.

``python -m bench.inprocess_child '<json spec>'`` prints one JSON object with, for each call path,
the sequential latency (all paths interleaved in blocks, as ``bench.load.latency_interleaved`` does)
and the throughput with ``concurrency`` requests in flight (one thread per request in flight):

* ``plain_inprocess``: the plain Python-backend identity (bench/models.py) in a
  ``pytriton.inprocess.Server``, called with ``Model.infer``;
* ``bound_embedded``: the bound ``@batch`` identity in a ``Triton(embedded=True)``, called with
  ``Model.infer`` (``triton.model(name)``);
* ``bound_embedded_client``: the same model through ``triton.client(name).infer_batch``.

Both servers live in this one process, so the paths share its drift. The embedded ``Triton`` starts
first: Triton's Python backend, shared by the two servers, keeps its shared-memory prefix. Every loop
is bounded in count and in time. Run by bench/inprocess.py.
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List

import numpy as np

from bench.load import _percentiles
from bench.models import bind_batch_identity, write_plain_models

INPUT = np.ones((1, 16), np.float32)


def infer_call(model: Any) -> Callable[[], None]:
    """One lean request through ``Model.infer``: the analogue of bench.load's lean HTTP client."""

    def call() -> None:
        (response,) = list(model.infer(inputs={"INPUT": INPUT}))
        if np.from_dlpack(response.outputs["OUTPUT"]).shape != INPUT.shape:
            raise RuntimeError("bad response")

    return call


def client_call(client: Any) -> Callable[[], None]:
    """One request through ``InProcessModelClient.infer_batch`` (the ``ModelClient``-shaped API)."""

    def call() -> None:
        if client.infer_batch(INPUT)["OUTPUT"].shape != INPUT.shape:
            raise RuntimeError("bad response")

    return call


def sequential_interleaved(
    calls: Dict[str, Callable[[], None]], count: int, block: int = 50, warmup: int = 200, max_s: float = 60.0
) -> Dict[str, Dict[str, float]]:
    """Sequential latency of each call, in alternating blocks of ``block`` calls (reversed every round)."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    samples: Dict[str, List[float]] = {name: [] for name in calls}
    order = list(calls)
    deadline = time.monotonic() + max_s
    while min(len(s) for s in samples.values()) < count and time.monotonic() < deadline:
        for name in order:
            call, sink = calls[name], samples[name]
            for _ in range(block):
                started = time.perf_counter()
                call()
                sink.append(time.perf_counter() - started)
        order.reverse()
    return {name: _percentiles(s) for name, s in samples.items()}


def in_flight(call: Callable[[], None], concurrency: int, duration_s: float, warmup_s: float = 0.5) -> Dict[str, float]:
    """Throughput with ``concurrency`` threads calling back to back; latencies after the warm-up only.

    A failing call stops every thread and is raised here.
    """
    latencies: List[float] = []
    errors: List[BaseException] = []
    lock = threading.Lock()
    measure_from = time.monotonic() + warmup_s
    stop_at = measure_from + duration_s

    def worker() -> None:
        mine: List[float] = []
        try:
            while time.monotonic() < stop_at and not errors:
                started = time.perf_counter()
                call()
                if time.monotonic() >= measure_from:
                    mine.append(time.perf_counter() - started)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller's thread
            errors.append(exc)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(duration_s + warmup_s + 60.0)
    if errors:
        raise errors[0]
    if not latencies:
        raise RuntimeError("no request completed in the measured window")
    result = _percentiles(latencies)
    result["requests_per_s"] = len(latencies) / duration_s
    return result


def measure(spec: Dict[str, Any]) -> Dict[str, Any]:
    import pytriton.inprocess as tritonserver
    from pytriton.triton import Triton

    with tempfile.TemporaryDirectory(prefix="pytriton-bench-inproc-") as directory:
        repository = pathlib.Path(directory)
        write_plain_models(repository)
        triton = Triton(embedded=True)
        server = None
        try:
            bind_batch_identity(triton)
            triton.run()
            server = tritonserver.Server(
                model_repository=str(repository),
                model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
                startup_models=["plain_identity"],
                exit_timeout=10,
            )
            server.start(wait_until_ready=True, timeout=120)
            calls = {
                "plain_inprocess": infer_call(server.model("plain_identity")),
                "bound_embedded": infer_call(triton.model("batch_identity")),
                "bound_embedded_client": client_call(triton.client("batch_identity")),
            }
            sequential = sequential_interleaved(calls, spec.get("count", 3000), max_s=spec.get("max_s", 60.0))
            throughput = {
                name: in_flight(call, spec.get("concurrency", 32), spec.get("duration_s", 3.0))
                for name, call in calls.items()
            }
        finally:
            if server is not None:
                server.stop()
            triton.stop()
    return {"sequential": sequential, "throughput": throughput}


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
