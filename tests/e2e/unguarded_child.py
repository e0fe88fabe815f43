"""Helper script for tests/e2e/test_process_instances.py: a main module without ``if __name__ == "__main__":``.

Run by path (as ``__main__``), configured by the environment (a stub does not get this script's
``sys.argv``): ``PYTRITON_TEST_KIND`` and ``PYTRITON_TEST_PORTS`` (http,grpc,metrics). It binds
``double``, defined here, with that instance kind and starts Triton at module level, so every
process that imports it to find the callable (a worker process, a backend instance's stub) reaches
``Triton.run()`` too. Appends its pid to ``PYTRITON_TEST_MAIN_MARKER`` each time it runs; prints
``served`` if ``run()`` returns.
"""

import os

import numpy as np

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

with open(os.environ["PYTRITON_TEST_MAIN_MARKER"], "a") as _marker:
    _marker.write(f"{os.getpid()}\n")


def double(requests):
    return [{"y": request["x"] * 2} for request in requests]


http, grpc, metrics = (int(port) for port in os.environ["PYTRITON_TEST_PORTS"].split(","))
x, y = [Tensor(name="x", shape=(-1,), dtype=np.float32)], [Tensor(name="y", shape=(-1,), dtype=np.float32)]
with Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics)) as triton:
    triton.bind(
        "Double", double, x, y, config=ModelConfig(max_batch_size=4), instance_kind=os.environ["PYTRITON_TEST_KIND"]
    )
    triton.run()
    print("served", flush=True)
