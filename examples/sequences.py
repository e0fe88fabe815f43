"""A stateful sequence model: a running sum kept per sequence, over HTTP and gRPC.

Each client sends the steps of its sequence with a ``sequence_id``; the first step carries
``sequence_start=True``, the last ``sequence_end=True``. Triton's sequence batcher (direct strategy)
sends every step of a sequence to the same instance, so the callable may keep the state in a plain
dict keyed by ``Request.sequence_id``. docs/sequences.md.

Run with ``python examples/sequences.py``.
"""

from __future__ import annotations

import threading
from typing import Dict, List

import numpy as np

from pytriton.client import ModelClient
from pytriton.model_config import ModelConfig, SequenceBatcher, Tensor
from pytriton.proxy.types import Request
from pytriton.triton import Triton, TritonConfig  # ports: 8000-8002, or PYTRITON_TRITON_CONFIG_*_PORT


class RunningSum:
    """The state of every open sequence of one instance: its total so far."""

    def __init__(self) -> None:
        self.totals: Dict[object, float] = {}

    def __call__(self, requests: List[Request]) -> List[Dict[str, np.ndarray]]:
        responses = []
        for request in requests:
            if request.sequence_start:
                self.totals[request.sequence_id] = 0.0
            total = self.totals.get(request.sequence_id, 0.0) + float(request["value"].sum())
            if request.sequence_end:
                self.totals.pop(request.sequence_id, None)  # the sequence is over: drop its state
            else:
                self.totals[request.sequence_id] = total
            responses.append({"total": np.array([[total]], dtype=np.float32)})
        return responses


def run_sequence(url: str, sequence_id: int, values: List[float], totals: Dict[int, float]) -> None:
    with ModelClient(url, "RunningSum") as client:
        for step, value in enumerate(values):
            result = client.infer_sample(
                np.array([value], dtype=np.float32),
                sequence_id=sequence_id,
                sequence_start=step == 0,
                sequence_end=step == len(values) - 1,
            )
        totals[sequence_id] = float(result["total"][0])


def main() -> None:
    with Triton(config=TritonConfig()) as triton:
        triton.bind(
            model_name="RunningSum",
            infer_func=RunningSum(),
            inputs=[Tensor(name="value", shape=(1,), dtype=np.float32)],
            outputs=[Tensor(name="total", shape=(1,), dtype=np.float32)],
            config=ModelConfig(
                max_batch_size=4, sequence_batcher=SequenceBatcher(max_sequence_idle_microseconds=5_000_000)
            ),
        )
        triton.run()
        totals: Dict[int, float] = {}
        # Four sequences at once, two over each protocol; their steps interleave on the server.
        threads = [
            threading.Thread(target=run_sequence, args=(url, sid, [float(sid)] * 5, totals))
            for sid, url in ((1, triton.http_url), (2, triton.grpc_url), (3, triton.http_url), (4, triton.grpc_url))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for sid in sorted(totals):
            print(f"sequence {sid}: total {totals[sid]:g}")


if __name__ == "__main__":
    main()
