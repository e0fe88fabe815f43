"""Quick start: serve a Python function with Triton and call it over HTTP and gRPC.

Run with ``make demo`` (sets everything up first) or ``python examples/quickstart.py``.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def add_sub(requests):
    """Receives a list of requests; returns one dict of outputs per request."""
    return [{"add": request["a"] + request["b"], "sub": request["a"] - request["b"]} for request in requests]


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    started = time.monotonic()
    config = TritonConfig(http_port=8000, grpc_port=8001, metrics_port=8002)
    with Triton(config=config) as triton:
        triton.bind(
            model_name="AddSub",
            infer_func=add_sub,
            inputs=[Tensor(name="a", shape=(-1,), dtype=np.float32), Tensor(name="b", shape=(-1,), dtype=np.float32)],
            outputs=[
                Tensor(name="add", shape=(-1,), dtype=np.float32),
                Tensor(name="sub", shape=(-1,), dtype=np.float32),
            ],
            config=ModelConfig(max_batch_size=8),
        )
        triton.run()
        print(f"Server ready in {time.monotonic() - started:.2f} s at {triton.http_url} and {triton.grpc_url}")

        a = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
        b = np.array([[0.5, 0.5, 0.5]], dtype=np.float32)

        http = httpclient.InferenceServerClient("127.0.0.1:8000")
        inputs = [httpclient.InferInput("a", a.shape, "FP32"), httpclient.InferInput("b", b.shape, "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = http.infer("AddSub", inputs)
        print("HTTP  add:", result.as_numpy("add"), " sub:", result.as_numpy("sub"))
        http.close()

        grpc = grpcclient.InferenceServerClient("127.0.0.1:8001")
        inputs = [grpcclient.InferInput("a", a.shape, "FP32"), grpcclient.InferInput("b", b.shape, "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = grpc.infer("AddSub", inputs)
        print("gRPC  add:", result.as_numpy("add"), " sub:", result.as_numpy("sub"))
        grpc.close()
        stopping = time.monotonic()
    print(f"Server stopped in {time.monotonic() - stopping:.2f} s")


if __name__ == "__main__":
    main()
