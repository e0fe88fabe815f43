"""Helper script for tests/e2e/test_process_instances.py: a main module with a callable of its own.

Run by path (as ``__main__``). Every process that runs this file appends its pid to the file named
by ``PYTRITON_TEST_MAIN_MARKER`` (a module-level side effect). It serves ``square``, defined here,
on a process instance and a backend instance, and ``pid_echo`` from a module on a process instance;
calls each once and prints one JSON line: the answers and the pids of the worker processes.
"""

import json
import os
import sys

import numpy as np

with open(os.environ["PYTRITON_TEST_MAIN_MARKER"], "a") as _marker:
    _marker.write(f"{os.getpid()}\n")


def square(requests):
    return [{"y": request["x"] ** 2} for request in requests]


def main() -> None:
    from pytriton.client import ModelClient
    from pytriton.model_config import Tensor
    from pytriton.triton import Triton, TritonConfig
    from tests.e2e.process_models import pid_echo

    http, grpc, metrics = (int(port) for port in sys.argv[1:4])
    x = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
    with Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)) as triton:
        triton.bind("Square", square, x, [Tensor(name="y", shape=(-1,), dtype=np.float32)], instance_kind="process")
        triton.bind(
            "SquareBackend", square, x, [Tensor(name="y", shape=(-1,), dtype=np.float32)], instance_kind="backend"
        )
        triton.bind(
            "Module",
            pid_echo,
            x,
            [Tensor(name="x", shape=(-1,), dtype=np.float32), Tensor(name="pid", shape=(1,), dtype=np.int64)],
            instance_kind="process",
        )
        triton.run()
        data = np.array([[1.0, 2.0, 3.0]], np.float32)
        answers = {}
        for name, output in (("Square", "y"), ("SquareBackend", "y"), ("Module", "x")):
            with ModelClient(f"http://127.0.0.1:{http}", name, init_timeout_s=60) as client:
                answers[name] = client.infer_batch(x=data)[output].tolist()
        workers = {
            model.name: [worker.pid for worker in model._workers]
            for model in triton._models.values()
            if model.name != "SquareBackend"
        }
        print(json.dumps({"answers": answers, "workers": workers, "pid": os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
