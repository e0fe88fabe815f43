"""Models the Ray tests and bench/ray_serve.py bind on each replica (imported in the replica processes)."""

from __future__ import annotations

import time

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor

F32 = np.float32


@batch
def _identity(x):
    return {"y": x}


@batch
def _slow_identity(x):
    time.sleep(0.02)  # 20 ms a batch: under load requests wait in Triton's queue (autoscaling test)
    return {"y": x}


def bind_identity(triton):
    """Identity float32 [-1], batching up to 16."""
    triton.bind(
        "Identity",
        _identity,
        inputs=[Tensor(name="x", shape=(-1,), dtype=F32)],
        outputs=[Tensor(name="y", shape=(-1,), dtype=F32)],
        config=ModelConfig(max_batch_size=16),
    )


def bind_slow_identity(triton):
    """Identity that takes 20 ms a batch, batching up to 4: queue time grows with load."""
    triton.bind(
        "Slow",
        _slow_identity,
        inputs=[Tensor(name="x", shape=(-1,), dtype=F32)],
        outputs=[Tensor(name="y", shape=(-1,), dtype=F32)],
        config=ModelConfig(max_batch_size=4),
    )


def bind_identity_backend(triton):
    """The same identity with ``instance_kind="backend"``: the callable runs in Triton's stub process."""
    triton.bind(
        "Identity",
        _identity,
        inputs=[Tensor(name="x", shape=(-1,), dtype=F32)],
        outputs=[Tensor(name="y", shape=(-1,), dtype=F32)],
        config=ModelConfig(max_batch_size=16),
        instance_kind="backend",
    )


def bind_slow_identity_16(triton):
    """Identity that takes 20 ms a batch, batching up to 16 (bench.ray_serve's max_ongoing_requests figure)."""
    triton.bind(
        "Slow16",
        _slow_identity,
        inputs=[Tensor(name="x", shape=(-1,), dtype=F32)],
        outputs=[Tensor(name="y", shape=(-1,), dtype=F32)],
        config=ModelConfig(max_batch_size=16),
    )
