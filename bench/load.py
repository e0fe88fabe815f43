"""Load generators, run as separate processes so that clients never share the server's GIL.

``python -m bench.load '<json spec>'`` prints one JSON object with the measurements. Every loop is
bounded in count and in time; all traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import random
import statistics
import sys
import time
from typing import Any, Dict, List, Tuple

import numpy as np


def _percentiles(samples: List[float]) -> Dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": ordered[len(ordered) // 2] * 1e3,
        "p90_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))] * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3,
        "mean_ms": statistics.fmean(ordered) * 1e3,
        "count": len(ordered),
    }


class LeanHttp:
    """Keep-alive HTTP client sending binary tensors: little client overhead, like perf_analyzer."""

    def __init__(self, port: int, model: str, array: np.ndarray, datatype: str):
        header = json.dumps({
            "inputs": [{"name": "INPUT", "shape": list(array.shape), "datatype": datatype,
                        "parameters": {"binary_data_size": array.nbytes}}],
            "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}],
        }).encode()  # fmt: skip
        self.body = header + array.tobytes()
        self.headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
        self.path = f"/v2/models/{model}/infer"
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.expected = array.nbytes

    def call(self) -> None:
        self.connection.request("POST", self.path, body=self.body, headers=self.headers)
        response = self.connection.getresponse()
        data = response.read()
        if response.status != 200 or len(data) < self.expected:
            raise RuntimeError(f"bad response {response.status}: {data[:200]!r}")


def _sequential_call(protocol: str, port: int, model: str) -> Any:
    """One sequential ``[1,16]`` float32 request to ``model`` per call, with little client overhead."""
    if protocol == "http":
        return LeanHttp(port, model, np.ones((1, 16), np.float32), "FP32").call
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = grpcclient.InferInput("INPUT", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    outputs = [grpcclient.InferRequestedOutput("OUTPUT")]
    return lambda: client.infer(model, [tensor], outputs=outputs)


def latency_interleaved(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Sequential latency of several models, measured in alternating blocks of ``block`` requests.

    A virtual machine's speed drifts within seconds; alternating short blocks (in reversed order
    every other round) exposes every model to the same drift, so their ratio measures the models
    rather than the moment each was measured. Returns percentiles per model.
    """
    calls = {model: _sequential_call(spec["protocol"], spec["port"], model) for model in spec["models"]}
    for call in calls.values():
        for _ in range(spec.get("warmup", 200)):
            call()
    samples: Dict[str, List[float]] = {model: [] for model in calls}
    order = list(calls)
    block, count = spec.get("block", 50), spec.get("count", 3000)
    deadline = time.monotonic() + spec.get("max_s", 60.0)
    while min(len(s) for s in samples.values()) < count and time.monotonic() < deadline:
        for model in order:
            call, sink = calls[model], samples[model]
            for _ in range(block):
                started = time.perf_counter()
                call()
                sink.append(time.perf_counter() - started)
        order.reverse()
    return {model: _percentiles(s) for model, s in samples.items()}


class _CpuClock:
    """CPU time (ns) the threads of the processes ``pids`` have run, as read so far.

    Per thread (``/proc/<pid>/task/<tid>/schedstat``): a process's own ``schedstat`` is its main
    thread's alone, and tritonserver works in its other threads. A thread that ends keeps the time
    last read for it, so its earlier work never vanishes from the total (gRPC's thread pools start
    and end threads between blocks); only what it ran after the last reading is lost.
    """

    def __init__(self, pids: List[int]):
        self._pids = pids
        self._threads: Dict[Tuple[int, str], int] = {}

    def read(self) -> int:
        threads = self._threads
        for pid in self._pids:
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for task in tasks:
                try:
                    with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as stat:
                        threads[pid, task] = int(stat.read().split()[0])
                except (OSError, ValueError, IndexError):
                    continue
        return sum(threads.values())


def cpu_interleaved(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Server-side CPU per sequential request of several models, measured in alternating blocks.

    ``pids``: the server's processes (tritonserver, its stubs, the user's process and its worker
    processes). Before and after each block of ``block`` requests to one model this process reads
    their CPU time (``/proc/<pid>/schedstat``, nanoseconds) and charges the difference to that
    model; models alternate (in reversed order every other pass), so a VM whose speed drifts
    charges the drift to every model alike, as in :func:`latency_interleaved`. The load generator
    itself is not among the pids. Returns microseconds of CPU per request for each model.
    """
    clock = _CpuClock([int(pid) for pid in spec["pids"]])
    calls = {model: _sequential_call(spec.get("protocol", "http"), spec["port"], model) for model in spec["models"]}
    for call in calls.values():
        for _ in range(spec.get("warmup", 50)):
            call()
    spent = {model: 0 for model in calls}
    done = {model: 0 for model in calls}
    order = list(calls)
    block, count = spec.get("block", 200), spec.get("count", 2000)
    deadline = time.monotonic() + spec.get("max_s", 120.0)
    while min(done.values()) < count and time.monotonic() < deadline:
        for model in order:
            call = calls[model]
            before = clock.read()
            for _ in range(block):
                call()
            spent[model] += clock.read() - before
            done[model] += block
        order.reverse()
    return {model: {"cpu_us_per_request": spent[model] / done[model] / 1e3, "count": done[model]} for model in calls}


def large_http(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Identity requests of ``bytes`` bytes to one model: percentiles and MB/s at the p50."""
    model = spec["model"]
    return large_http_interleaved({"max_s": 10.0, **spec, "models": [model]})[model]


def large_http_interleaved(spec: Dict[str, Any]) -> Dict[str, Any]:
    """:func:`large_http` for several models at once, one request to each in turn.

    Each pass sends one request of ``bytes`` bytes to every model, so every model meets the same
    drift of the VM's speed. Each pass takes the models in a new random order (seeded: the same
    sequence every run), and never starts with the model that ended the pass before. Why: a large
    request's time depends on the request before it. One right after another to the same model can
    find that model's memory still in the caches, and the order reversed each pass, as it was
    before, gave that to the first and last models for half of their requests (the first of two
    identical plain models came out 5-6% faster in 2 of 3 rounds of a scratch run); one after a
    thread or process instance's request (more copies of the tensor, another process) finds the
    caches emptier. A random order gives every model the same mix of predecessors. Returns per
    model the percentiles of ``count`` requests and MB/s at the p50.
    """
    size = spec["bytes"]
    array = np.random.default_rng(0).integers(0, 255, size=(1, size), dtype=np.uint8)
    clients = {model: LeanHttp(spec["port"], model, array, "UINT8") for model in spec["models"]}
    for client in clients.values():
        for _ in range(2):
            client.call()
    samples: Dict[str, List[float]] = {model: [] for model in clients}
    order = list(clients)
    shuffle = random.Random(0).shuffle
    deadline = time.monotonic() + spec.get("max_s", 60.0)
    while min(len(s) for s in samples.values()) < spec.get("count", 20) and time.monotonic() < deadline:
        for model in order:
            started = time.perf_counter()
            clients[model].call()
            samples[model].append(time.perf_counter() - started)
        last = order[-1]
        shuffle(order)
        if order[0] == last:  # never the same model twice in a row
            order[0], order[-1] = order[-1], order[0]
    results = {}
    for model, taken in samples.items():
        result = _percentiles(taken)
        result["mb_per_s"] = size / 1e6 / (result["p50_ms"] / 1e3)
        results[model] = result
    return results


async def _throughput(spec: Dict[str, Any]) -> Dict[str, Any]:
    if spec["protocol"] == "grpc":
        import tritonclient.grpc.aio as lib
    else:
        import tritonclient.http.aio as lib  # type: ignore[no-redef]
    port, model, concurrency = spec["port"], spec["model"], spec["concurrency"]
    client = lib.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = lib.InferInput("INPUT", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    latencies: List[float] = []
    stop_at = time.monotonic() + spec.get("warmup_s", 0.5) + spec.get("duration_s", 3.0)
    measure_from = time.monotonic() + spec.get("warmup_s", 0.5)

    async def worker() -> None:
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            await client.infer(model, [tensor])
            if time.monotonic() >= measure_from:
                latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    result = _percentiles(latencies)
    result["requests_per_s"] = len(latencies) / spec.get("duration_s", 3.0)
    return result


def throughput(spec: Dict[str, Any]) -> Dict[str, Any]:
    return asyncio.run(_throughput(spec))


async def _window(client: Any, model: str, tensor: Any, concurrency: int, settle_s: float, window_s: float) -> int:
    """Requests to ``model`` with ``concurrency`` in flight that completed within one window.

    The first ``settle_s`` lets the load reach its steady state (the previous model's batches
    are done, the dynamic batcher fills up) and is not counted. Requests still in flight when the
    window closes are awaited and not counted, so the next window starts with nothing queued.
    """
    measure_from = time.monotonic() + settle_s
    stop_at = measure_from + window_s
    completed = 0

    async def worker() -> None:
        nonlocal completed
        while time.monotonic() < stop_at:
            await client.infer(model, [tensor])
            if measure_from <= time.monotonic() < stop_at:
                completed += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return completed


async def _throughput_interleaved(spec: Dict[str, Any]) -> Dict[str, Any]:
    import tritonclient.grpc.aio as grpc_aio

    port, concurrency = spec["port"], spec.get("concurrency", 32)
    settle_s, window_s = spec.get("settle_s", 0.2), spec.get("window_s", 0.5)
    client = grpc_aio.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = grpc_aio.InferInput("INPUT", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    order = list(spec["models"])
    rates: Dict[str, List[float]] = {model: [] for model in order}
    try:
        for _ in range(max(1, spec.get("windows", 6))):
            for model in order:
                rates[model].append(await _window(client, model, tensor, concurrency, settle_s, window_s) / window_s)
            order.reverse()
    finally:
        await client.close()
    return {model: {"requests_per_s": statistics.mean(r), "windows": r} for model, r in rates.items()}


def throughput_interleaved(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Throughput of several models with ``concurrency`` gRPC requests in flight, in alternating windows.

    As :func:`latency_interleaved` does for latency: each pass gives every model one window of
    ``window_s`` seconds (after ``settle_s`` of the same load, not counted), in reversed order
    every other pass, so a drift of the VM's speed reaches every model alike instead of whichever
    was measured at that moment. One raw ``tritonclient`` asyncio gRPC client. Returns per model
    the mean rate over the ``windows`` windows and each window's rate.
    """
    return asyncio.run(_throughput_interleaved(spec))


def stream_grpc(spec: Dict[str, Any]) -> Dict[str, Any]:
    import queue

    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{spec['port']}")
    responses: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((time.perf_counter(), result, error)))
    tensor = grpcclient.InferInput("N", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[spec["responses"]]], dtype=np.int32))
    first_response: List[float] = []
    rates: List[float] = []
    deadline = time.monotonic() + spec.get("max_s", 20.0)
    for _ in range(spec.get("repeats", 20)):
        if time.monotonic() > deadline:
            break
        started = time.perf_counter()
        client.async_stream_infer(spec["model"], [tensor], enable_empty_final_response=True)
        received = 0
        first = None
        while True:
            stamp, result, error = responses.get(timeout=30)
            if error is not None:
                raise RuntimeError(str(error))
            parameters = result.get_response().parameters
            if len(result.get_response().outputs):
                received += 1
                first = first or stamp
            if "triton_final_response" in parameters and parameters["triton_final_response"].bool_param:
                break
        end = time.perf_counter()
        assert received == spec["responses"], received
        first_response.append((first or end) - started)
        rates.append(received / (end - started))
    client.stop_stream()
    client.close()
    return {
        "time_to_first_ms": statistics.median(first_response) * 1e3,
        "responses_per_s": statistics.median(rates),
        "streams": len(rates),
    }


def client_overhead(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Sequential p50 of raw tritonclient vs pytriton's ModelClient on the same model, interleaved."""
    from pytriton.client import ModelClient

    protocol, port, model = spec["protocol"], spec["port"], spec["model"]
    if protocol == "grpc":
        import tritonclient.grpc as lib
    else:
        import tritonclient.http as lib  # type: ignore[no-redef]
    raw = lib.InferenceServerClient(f"127.0.0.1:{port}")
    array = np.ones((1, 16), np.float32)

    def raw_call() -> None:
        tensor = lib.InferInput("INPUT", [1, 16], "FP32")
        if protocol == "grpc":
            tensor.set_data_from_numpy(array)
            outputs = [lib.InferRequestedOutput("OUTPUT")]
        else:
            tensor.set_data_from_numpy(array, binary_data=True)
            outputs = [lib.InferRequestedOutput("OUTPUT", binary_data=True)]
        raw.infer(model, [tensor], outputs=outputs).as_numpy("OUTPUT")

    client = ModelClient(f"{protocol}://127.0.0.1:{port}", model, lazy_init=False)
    sample = array[0]
    timings: Dict[str, List[float]] = {"raw": [], "model_client": []}
    calls = {"raw": raw_call, "model_client": lambda: client.infer_sample(sample)}
    for name in calls:
        for _ in range(200):
            calls[name]()
    deadline = time.monotonic() + spec.get("max_s", 10.0)
    for _ in range(spec.get("count", 2000)):
        if time.monotonic() > deadline:
            break
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            timings[name].append(time.perf_counter() - started)
    client.close()
    raw.close()
    raw_p50 = _percentiles(timings["raw"])["p50_ms"]
    ours_p50 = _percentiles(timings["model_client"])["p50_ms"]
    return {"raw_p50_ms": raw_p50, "model_client_p50_ms": ours_p50, "overhead_us": (ours_p50 - raw_p50) * 1e3}


SCENARIOS = {
    "client_overhead": client_overhead,
    "cpu_interleaved": cpu_interleaved,
    "latency_interleaved": latency_interleaved,
    "large_http": large_http,
    "large_http_interleaved": large_http_interleaved,
    "throughput": throughput,
    "throughput_interleaved": throughput_interleaved,
    "stream_grpc": stream_grpc,
}


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    print(json.dumps(SCENARIOS[request["scenario"]](request)))
