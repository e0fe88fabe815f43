"""Quick start: serve a Python function with Triton and call it over HTTP and gRPC.

Run with ``make demo`` (sets everything up first) or ``python examples/quickstart.py``.
"""

from __future__ import annotations

import time

import numpy as np
import tritonclient.http as httpclient

from pytriton.client import ModelClient
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig  # ports: 8000-8002, or PYTRITON_TRITON_CONFIG_*_PORT


@batch
def add_sub(a, b):
    """Receives whole batches as arrays; returns one array per output."""
    return {"add": a + b, "sub": a - b}


def main() -> None:
    started = time.monotonic()
    with Triton(config=TritonConfig()) as triton:
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
        print(f"Server ready in {time.monotonic() - started:.2f} s ({triton.http_url}, {triton.grpc_url})")

        a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
        b = np.array([0.5, 0.5, 0.5], dtype=np.float32)
        for url in (triton.http_url, triton.grpc_url):
            with ModelClient(url, "AddSub") as client:
                result = client.infer_sample(a, b)
            print(f"{url:24s} a + b = {result['add']}   a - b = {result['sub']}")

        # Any KServe v2 client works too, e.g. raw tritonclient:
        raw = httpclient.InferenceServerClient(triton.http_url.split("://")[1])
        inputs = [httpclient.InferInput("a", [1, 3], "FP32"), httpclient.InferInput("b", [1, 3], "FP32")]
        inputs[0].set_data_from_numpy(a[None])
        inputs[1].set_data_from_numpy(b[None])
        print(f"{'raw tritonclient':24s} a + b = {raw.infer('AddSub', inputs).as_numpy('add')[0]}")
        raw.close()
        stopping = time.monotonic()
    print(f"Server stopped in {time.monotonic() - stopping:.2f} s")


if __name__ == "__main__":
    main()
