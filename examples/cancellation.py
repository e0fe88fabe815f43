"""Cancellation and deadlines that reach the callable.

A slow model works in steps and checks ``Request.is_cancelled()`` between them. A client whose
timeout is shorter than the work gives up; the callable sees it and stops, over HTTP (Triton's
request timeout) and over gRPC (the deadline, which Triton reports as a cancellation). A second
model has an execution timeout: its client gets a clear error and the instance serves on.
docs/cancellation.md.

Run with ``python examples/cancellation.py``.
"""

from __future__ import annotations

import time
from typing import Dict, List

import numpy as np

from pytriton.client import ModelClient
from pytriton.client.exceptions import PyTritonClientInferenceServerError, PyTritonClientTimeoutError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.types import Request
from pytriton.triton import Triton, TritonConfig  # ports: 8000-8002, or PYTRITON_TRITON_CONFIG_*_PORT

STEPS = 100
DONE: Dict[str, int] = {}


def slow(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """100 steps of 20 ms each, unless nobody waits any more."""
    request = requests[0]
    step = 0
    while step < STEPS and not request.is_cancelled():
        time.sleep(0.02)
        step += 1
    DONE[str(int(request["tag"][0]))] = step
    return [{"steps": np.array([step], np.int32)}]


def stuck(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    """Pure-Python work that never checks for cancellation (for a negative input)."""
    if requests[0]["tag"][0] < 0:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pass
    return [{"steps": np.array([0], np.int32)}]


def main() -> None:
    tensors = dict(
        inputs=[Tensor(name="tag", shape=(1,), dtype=np.int32)],
        outputs=[Tensor(name="steps", shape=(1,), dtype=np.int32)],
    )
    with Triton(config=TritonConfig()) as triton:
        triton.bind("Slow", slow, config=ModelConfig(batching=False), **tensors)
        triton.bind("Stuck", stuck, config=ModelConfig(batching=False, execution_timeout_s=0.5), **tensors)
        triton.run()
        for tag, url in enumerate((triton.http_url, triton.grpc_url)):
            with ModelClient(url, "Slow", inference_timeout_s=0.3) as client:
                client.wait_for_model(30)
                try:
                    client.infer_sample(np.array([tag], np.int32))
                except PyTritonClientTimeoutError:
                    pass
            deadline = time.monotonic() + 5
            while str(tag) not in DONE and time.monotonic() < deadline:
                time.sleep(0.01)
            print(
                f"{url.split(':')[0]}: client gave up after 0.3 s; the callable stopped at step {DONE[str(tag)]} of {STEPS}"
            )
        with ModelClient(triton.grpc_url, "Stuck") as client:
            try:
                client.infer_sample(np.array([-1], np.int32))
            except PyTritonClientInferenceServerError as exc:
                print(f"execution timeout: {exc}")
            client.infer_sample(np.array([1], np.int32))
            print("the instance serves again")


if __name__ == "__main__":
    main()
