"""The cost of one pipeline hop, and how long a callable takes to see a cancellation.

Usage::

    python -m bench.pipeline [ROUNDS]

One server (the binary, gRPC on loopback) with an identity model ``Inner`` (``[1,16]`` float32,
``@batch``), a model ``Outer`` whose callable calls ``Inner`` through ``pytriton.pipeline.model``,
and a model ``Watch`` that polls ``Request.is_cancelled()``. In alternating rounds of 200 calls
(ROUNDS, default 5), it times, from this process, one request at a time:

- ``direct``: ``ModelClient(grpc).infer_sample`` on ``Inner`` (what a separate client pays);
- ``raw``: a kept raw ``tritonclient.grpc`` client on ``Inner``;
- ``handle``: ``pipeline.model("Inner").infer_sample`` from a plain thread (the hop a callable makes);
- ``outer``: ``ModelClient(grpc).infer_sample`` on ``Outer`` (client -> Outer -> Inner -> back);
  ``outer - direct`` is what one hop adds to a request.

Then 30 times: a gRPC request to ``Watch`` is cancelled 50 ms after the callable started, and the
time from ``cancel()`` to the callable seeing ``is_cancelled()`` true is recorded (the callable
polls every 0.5 ms). Prints medians and ratios to ``direct``, measured in the same run. Finally the
same three paths in an embedded ``Triton``, where the handle uses the in-process API (``direct``
is then ``Triton.client("Inner")``, also in-process).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import tritonclient.grpc as grpcclient

from pytriton import pipeline
from pytriton.client import ModelClient
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

SEEN: Dict[int, float] = {}
STARTED: Dict[int, threading.Event] = {}


@batch
def identity(x: Any) -> Dict[str, Any]:
    return {"y": x}


def outer(requests: List[Any]) -> List[Dict[str, Any]]:
    handle = pipeline.model("Inner")
    return [{"y": handle.infer_batch(request["x"])["y"]} for request in requests]


def watch(requests: List[Any]) -> List[Dict[str, Any]]:
    tag = int(requests[0]["x"].flat[0])
    STARTED[tag].set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if requests[0].is_cancelled():
            SEEN[tag] = time.perf_counter()
            break
        time.sleep(0.0005)
    return [{"y": requests[0]["x"]}]


def _ports() -> Tuple[int, int, int]:
    """Three free ports, so that the bench runs next to other servers."""
    import socket

    sockets = [socket.socket() for _ in range(3)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        http, grpc, metrics = (int(sock.getsockname()[1]) for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()
    return http, grpc, metrics


def _time(call: Callable[[], object], count: int) -> List[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


def main(rounds: int) -> None:
    inputs = [Tensor(name="x", shape=(16,), dtype=np.float32)]
    outputs = [Tensor(name="y", shape=(16,), dtype=np.float32)]
    http_port, grpc_port, metrics_port = _ports()
    with Triton(config=TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)) as triton:
        triton.bind("Inner", identity, inputs, outputs, config=ModelConfig(max_batch_size=8))
        triton.bind("Outer", outer, inputs, outputs, config=ModelConfig(max_batch_size=8))
        triton.bind("Watch", [watch, watch], inputs, outputs, config=ModelConfig(batching=False))
        triton.run()
        x = np.arange(16, dtype=np.float32)
        address = triton.grpc_url.split("://")[1]
        raw = grpcclient.InferenceServerClient(address)
        tensor = grpcclient.InferInput("x", [1, 16], "FP32")
        tensor.set_data_from_numpy(x[None])
        handle = pipeline.model("Inner")
        samples: Dict[str, List[float]] = {"direct": [], "raw": [], "handle": [], "outer": []}
        with ModelClient(triton.grpc_url, "Inner") as direct, ModelClient(triton.grpc_url, "Outer") as via:
            calls = {
                "direct": lambda: direct.infer_sample(x),
                "raw": lambda: raw.infer("Inner", [tensor]),
                "handle": lambda: handle.infer_sample(x),
                "outer": lambda: via.infer_sample(x),
            }
            for call in calls.values():
                _time(call, 50)  # warm-up
            for _ in range(rounds):
                for name, call in calls.items():
                    samples[name].extend(_time(call, 200))
        base = statistics.median(samples["direct"])
        print(f"{'path':8s} {'p50 ms':>8s} {'p90 ms':>8s} {'/direct':>8s}")
        for name, values in samples.items():
            values.sort()
            p50, p90 = statistics.median(values), values[int(len(values) * 0.9)]
            print(f"{name:8s} {p50 * 1e3:8.3f} {p90 * 1e3:8.3f} {p50 / base:8.2f}")
        print(f"one hop adds (outer - direct, p50): {(statistics.median(samples['outer']) - base) * 1e3:.3f} ms")

        delays = []
        watch_input = grpcclient.InferInput("x", [16], "FP32")
        for tag in range(30):
            STARTED[tag] = threading.Event()
            watch_input.set_data_from_numpy(np.full(16, tag, np.float32))
            call = raw.async_infer("Watch", [watch_input], callback=lambda result, error: None)
            if not STARTED[tag].wait(10):
                raise RuntimeError("Watch did not start")
            time.sleep(0.05)
            cancelled = time.perf_counter()
            call.cancel()
            deadline = time.monotonic() + 10
            while tag not in SEEN and time.monotonic() < deadline:
                time.sleep(0.0002)
            delays.append(SEEN[tag] - cancelled)
        delays.sort()
        print(
            f"cancel() -> callable sees it: p50 {statistics.median(delays) * 1e3:.2f} ms, "
            f"p90 {delays[int(len(delays) * 0.9)] * 1e3:.2f} ms, max {delays[-1] * 1e3:.2f} ms "
            f"(n={len(delays)}; direct call p50 {base * 1e3:.3f} ms in the same run)"
        )
        raw.close()
    _embedded(rounds, inputs, outputs)


def _embedded(rounds: int, inputs: List[Tensor], outputs: List[Tensor]) -> None:
    """The same comparison in an embedded Triton, where the handle takes the in-process API."""
    x = np.arange(16, dtype=np.float32)
    with Triton(embedded=True) as triton:
        triton.bind("Inner", identity, inputs, outputs, config=ModelConfig(max_batch_size=8))
        triton.bind("Outer", outer, inputs, outputs, config=ModelConfig(max_batch_size=8))
        triton.run()
        direct, via, handle = triton.client("Inner"), triton.client("Outer"), pipeline.model("Inner")
        calls = {
            "direct": lambda: direct.infer_sample(x),
            "handle": lambda: handle.infer_sample(x),
            "outer": lambda: via.infer_sample(x),
        }
        samples: Dict[str, List[float]] = {name: [] for name in calls}
        for call in calls.values():
            _time(call, 50)
        for _ in range(rounds):
            for name, call in calls.items():
                samples[name].extend(_time(call, 200))
    base = statistics.median(samples["direct"])
    print(f"embedded ({handle.path}): " + ", ".join(
        f"{name} p50 {statistics.median(values) * 1e3:.3f} ms ({statistics.median(values) / base:.2f}x)"
        for name, values in samples.items()
    ))  # fmt: skip
    print(f"embedded: one hop adds (outer - direct, p50): {(statistics.median(samples['outer']) - base) * 1e3:.3f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
