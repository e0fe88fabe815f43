"""Helper process for self-healing tests: serve one model; print JSON on start and after each restart.

Arguments: ``HTTP GRPC METRICS MAX_SERVER_RESTARTS``. Each line printed is the state the test needs
to check for leftovers: the server pid, shared-memory prefix, socket directory, workspace, the
backend's scratch directory and the restart count.
"""

import json
import os
import sys
import threading

import numpy as np

from pytriton.model_config import Tensor
from pytriton.triton import Triton, TritonConfig


def _report(triton: Triton) -> None:
    info = {
        "server_pid": triton._backend.server.pid,
        "shm_prefix": triton._shm_prefix,
        "socket_dir": str(triton._socket_dir),
        "workspace": str(triton._workspace.path),
        "scratch": triton._backend.scratch.path,
        "restarts": triton.server_restarts,
        "repository": str(triton._repository),
    }
    print(json.dumps(info), flush=True)


def _watch_restarts(triton: Triton, stop: threading.Event) -> None:
    seen = 0
    while not stop.wait(0.05):
        if triton.server_restarts != seen and triton.is_alive():
            seen = triton.server_restarts
            _report(triton)


def main() -> None:
    http, grpc, metrics, max_restarts = (int(value) for value in sys.argv[1:5])
    triton = Triton(
        config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics), max_server_restarts=max_restarts
    )
    if os.environ.get("PYTRITON_TEST_FAST_RETRIES") == "1":
        # Only that the program gives up is tested with it; the retries' delays are the unit tests'
        # (tests/unit/test_restarts.py, a fake clock): 0.05 s doubling to 0.2 s instead of 0.5 to 4 s.
        triton._supervisor.policy._retry_base_s = 0.05
        triton._supervisor.policy._retry_cap_s = 0.2
    triton.bind(
        "Echo",
        lambda requests: [dict(r.items()) for r in requests],
        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
    )
    triton.run()
    _report(triton)
    stop = threading.Event()
    threading.Thread(target=_watch_restarts, args=(triton, stop), daemon=True).start()
    try:
        triton.serve(monitoring_period_sec=0.2)
    finally:
        stop.set()
    print("served", flush=True)


if __name__ == "__main__":
    main()
