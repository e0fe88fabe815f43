"""Streaming: a decoupled model that yields partial results, consumed with DecoupledModelClient.

Run: ``python examples/streaming.py`` (after ``make server``).
"""

from __future__ import annotations

import time

import numpy as np

from pytriton.client import DecoupledModelClient
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig  # ports: 8000-8002, or PYTRITON_TRITON_CONFIG_*_PORT


@batch
def count_words(text):
    """Yields one response per word, as a token generator would."""
    words = text[0, 0].decode().split()
    for index, word in enumerate(words):
        time.sleep(0.01)  # pretend each step takes a while
        yield {"word": np.array([[word.encode()]], dtype=object), "index": np.array([[index]], dtype=np.int32)}


def main() -> None:
    with Triton(config=TritonConfig()) as triton:
        triton.bind(
            "Words",
            count_words,
            inputs=[Tensor(name="text", shape=(1,), dtype=bytes)],
            outputs=[Tensor(name="word", shape=(1,), dtype=bytes), Tensor(name="index", shape=(1,), dtype=np.int32)],
            config=ModelConfig(max_batch_size=1, decoupled=True),
        )
        triton.run()
        with DecoupledModelClient(triton.grpc_url, "Words") as client:
            for partial in client.infer_sample(np.array([b"streams arrive one word at a time"], dtype=object)):
                print(int(partial["index"][0]), partial["word"][0].decode())


if __name__ == "__main__":
    main()
