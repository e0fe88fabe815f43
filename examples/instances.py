"""Several instances of one model, grouped per-request parameters and a futures client.

Run: ``python examples/instances.py`` (after ``make server``).
"""

from __future__ import annotations

import numpy as np

from pytriton.client import FuturesModelClient
from pytriton.decorators import batch, first_value
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig  # ports: 8000-8002, or PYTRITON_TRITON_CONFIG_*_PORT


class Scaler:
    """A callable object; each instance of the model gets its own."""

    def __init__(self, instance: int):
        self.instance = instance

    @batch
    @first_value("factor")
    def __call__(self, x, factor):
        return {"y": x * factor, "instance": np.full((len(x), 1), self.instance, dtype=np.int32)}


def main() -> None:
    with Triton(config=TritonConfig()) as triton:
        triton.bind(
            "Scale",
            [Scaler(index) for index in range(3)],  # three instances, served concurrently
            inputs=[
                Tensor(name="x", shape=(-1,), dtype=np.float32),
                Tensor(name="factor", shape=(1,), dtype=np.float32),
            ],
            outputs=[
                Tensor(name="y", shape=(-1,), dtype=np.float32),
                Tensor(name="instance", shape=(1,), dtype=np.int32),
            ],
            config=ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=1000)),
        )
        triton.run()
        with FuturesModelClient(triton.http_url, "Scale", max_workers=8) as client:
            futures = [
                client.infer_sample(np.arange(3, dtype=np.float32), np.array([2.0], np.float32)) for _ in range(24)
            ]
            results = [future.result() for future in futures]
        print("y =", results[0]["y"], "| instances used:", sorted({int(r["instance"][0]) for r in results}))


if __name__ == "__main__":
    main()
