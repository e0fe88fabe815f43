"""Helper process for lifecycle tests: serve one model and report what it created, as JSON.

Arguments: http, grpc and metrics ports; an optional fourth, S seconds, also serves ``Slow``
(8 instances, each request takes S seconds) for the drain tests (tests/e2e/test_drain.py). Each
request that enters ``Slow`` prints an ``entered`` line, so the test signals once all are in flight.
"""

import json
import sys
import threading
import time

import numpy as np

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def main() -> None:
    http, grpc, metrics = (int(port) for port in sys.argv[1:4])
    triton = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
    triton.bind(
        "Echo",
        lambda requests: [dict(r.items()) for r in requests],
        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
    )
    if len(sys.argv) > 4:
        slow_s = float(sys.argv[4])

        printing = threading.Lock()

        def slow(requests):
            with printing:  # one write per line: the instances run in parallel threads
                sys.stdout.write("entered\n")
                sys.stdout.flush()
            time.sleep(slow_s)
            return [dict(r.items()) for r in requests]

        triton.bind(
            "Slow",
            [slow] * 8,
            [Tensor(name="x", shape=(2,), dtype=np.float32)],
            [Tensor(name="x", shape=(2,), dtype=np.float32)],
            config=ModelConfig(batching=False),
        )
    triton.run()
    info = {
        "server_pid": triton._backend.server.pid,
        "shm_prefix": triton._shm_prefix,
        "socket_dir": str(triton._socket_dir),
        "workspace": str(triton._workspace.path),
        "watchdog_pid": triton._backend.watchdog.pid,
        "scratch": triton._backend.scratch.path,
    }
    print(json.dumps(info), flush=True)
    triton.serve(monitoring_period_sec=0.2)
    print("served", flush=True)


if __name__ == "__main__":
    main()
