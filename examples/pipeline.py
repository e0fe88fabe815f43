"""A two-stage pipeline: pre-processing -> model -> post-processing, without a client in between.

``Pipeline`` is what clients call. Its callable normalises the input, calls the bound model
``Scale`` through ``pytriton.pipeline.model("Scale")`` (Triton's in-process API when embedded,
else gRPC on loopback with a kept connection), and post-processes the result. Errors of ``Scale``
reach the client with its message; cancellation and deadlines of the outer request travel to the
inner one. docs/pipelines.md.

Run with ``python examples/pipeline.py``.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from pytriton import pipeline
from pytriton.client import ModelClient
from pytriton.client.exceptions import PyTritonClientInferenceServerError
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.types import Request
from pytriton.triton import Triton, TritonConfig  # ports: 8000-8002, or PYTRITON_TRITON_CONFIG_*_PORT


@batch
def scale(x):
    """The model stage: refuses negative input, else multiplies by 10."""
    if (x < 0).any():
        raise ValueError("Scale takes non-negative input only")
    return {"y": x * 10}


def preprocess_model_postprocess(requests: List[Request]) -> List[Dict[str, np.ndarray]]:
    scale_model = pipeline.model("Scale")
    responses = []
    for request in requests:
        x = request["x"].astype(np.float32)
        normalised = x / max(float(np.abs(x).max()), 1.0)  # pre-processing
        scaled = scale_model.infer_batch(normalised)["y"]  # the model
        responses.append({"y": np.round(scaled, 2)})  # post-processing
    return responses


def main() -> None:
    tensor = dict(shape=(-1,), dtype=np.float32)
    with Triton(config=TritonConfig()) as triton:
        triton.bind(
            "Scale",
            scale,
            [Tensor(name="x", **tensor)],
            [Tensor(name="y", **tensor)],
            config=ModelConfig(max_batch_size=8),
        )
        triton.bind(
            "Pipeline",
            preprocess_model_postprocess,
            [Tensor(name="x", **tensor)],
            [Tensor(name="y", **tensor)],
            config=ModelConfig(max_batch_size=8),
        )
        triton.run()
        for url in (triton.http_url, triton.grpc_url):
            with ModelClient(url, "Pipeline") as client:
                result = client.infer_sample(np.array([1.0, 2.0, 4.0], np.float32))
                print(f"{url.split(':')[0]}: pipeline([1, 2, 4]) = {result['y']}")
                try:
                    client.infer_sample(np.array([-1.0], np.float32))
                except PyTritonClientInferenceServerError as exc:
                    print(f"{url.split(':')[0]}: inner error reaches the client: {exc}")


if __name__ == "__main__":
    main()
