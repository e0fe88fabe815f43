"""What a string (BYTES) tensor costs through the proxy: ``python -m bench.bytes_roundtrip [COUNT]``.

Binds a BYTES identity model (``[-1]`` strings in, the same strings out), then sends COUNT
sequential HTTP requests (tritonclient, binary data) for each payload and prints one JSON object
with the client-side p50 and p90 in milliseconds and the Python/numpy versions:

- ``small``: 16 strings of 32 bytes (travels inside the proxy's message),
- ``large``: 4096 strings of 64 bytes, about 280 KB serialized (through the shared-memory arena).

Each reply is checked against the request. Every loop is bounded by COUNT (default 300). Compare
runs taken on one host in one time window only (e.g. a baseline checkout and this one, alternately).
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from typing import Dict, List

import numpy as np

from bench.__main__ import free_ports
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

PAYLOADS = {"small": (16, 32), "large": (4096, 64)}


def identity(requests):
    return [{"OUTPUT": r["INPUT"]} for r in requests]


def _strings(count: int, length: int) -> np.ndarray:
    rng = np.random.default_rng(count)
    raw = rng.integers(ord("a"), ord("z") + 1, size=(count, length), dtype=np.uint8)
    return np.array([row.tobytes() for row in raw], dtype=object)


def measure(url: str, count: int) -> Dict[str, Dict[str, float]]:
    """p50/p90 (ms) of ``count`` sequential requests per payload, after 20 warm-up requests."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url)
    results: Dict[str, Dict[str, float]] = {}
    try:
        for label, (items, length) in PAYLOADS.items():
            data = _strings(items, length)
            infer_input = httpclient.InferInput("INPUT", list(data.shape), "BYTES")
            infer_input.set_data_from_numpy(data, binary_data=True)
            output = httpclient.InferRequestedOutput("OUTPUT", binary_data=True)
            samples: List[float] = []
            for index in range(20 + count):
                started = time.perf_counter()
                reply = client.infer("bytes_identity", [infer_input], outputs=[output])
                elapsed = time.perf_counter() - started
                if index < 20:
                    if not np.array_equal(reply.as_numpy("OUTPUT"), data):
                        raise AssertionError(f"{label}: the reply differs from the request")
                    continue
                samples.append(elapsed * 1e3)
            cuts = statistics.quantiles(samples, n=10)
            results[label] = {"p50_ms": round(statistics.median(samples), 3), "p90_ms": round(cuts[-1], 3)}
    finally:
        client.close()
    return results


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    http, grpc, metrics = free_ports(3)
    config = TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics, log_verbose=0)
    with Triton(config=config) as triton:
        triton.bind(
            "bytes_identity",
            identity,
            [Tensor(name="INPUT", shape=(-1,), dtype=bytes)],
            [Tensor(name="OUTPUT", shape=(-1,), dtype=bytes)],
            config=ModelConfig(batching=False),
        )
        triton.run()
        results = measure(f"127.0.0.1:{http}", count)
    print(json.dumps({"python": platform.python_version(), "numpy": np.__version__, "results": results}))


if __name__ == "__main__":
    main()
