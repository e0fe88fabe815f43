"""Helper process for tests/e2e/test_process_instances.py: serve a model with two process instances.

Prints, as one JSON line, the pids of the worker processes and what the clean-up must remove, then
serves until SIGINT/SIGTERM (and prints "served") or until it is killed.
"""

import json
import sys

import numpy as np

from pytriton.model_config import Tensor
from pytriton.triton import Triton, TritonConfig
from tests.e2e.process_models import pid_echo


def main() -> None:
    http, grpc, metrics = (int(port) for port in sys.argv[1:4])
    triton = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
    triton.bind(
        "Pid",
        [pid_echo, pid_echo],
        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
        [Tensor(name="x", shape=(-1,), dtype=np.float32), Tensor(name="pid", shape=(1,), dtype=np.int64)],
        instance_kind="process",
    )
    triton.run()
    info = {
        "workers": [worker.pid for model in triton._models.values() for worker in model._workers],
        "shm_prefix": triton._shm_prefix,
        "socket_dir": str(triton._socket_dir),
    }
    print(json.dumps(info), flush=True)
    triton.serve(monitoring_period_s=0.2)
    print("served", flush=True)


if __name__ == "__main__":
    main()
