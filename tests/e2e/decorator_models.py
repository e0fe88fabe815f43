"""The callables of tests/e2e/test_decorators_live.py, one per decorator, served on every instance kind.

Kept apart from the test module (tests/e2e/_kinds.py): each backend instance's stub imports this
module to unpickle its callable, and importing the test module would drag pytest and tritonclient
into every stub.
"""

from __future__ import annotations

import numpy as np

from pytriton.decorators import (
    ConstantPadder,
    batch,
    fill_optionals,
    first_value,
    group_by_keys,
    group_by_values,
    pad_batch,
    triton_context,
)


@batch
def linear(x, w):
    return {"y": x * w}


@batch
@group_by_values("width", pad_fn=ConstantPadder(-1))
def ragged(width):
    size = int(width[0, 0])
    return {"y": np.arange(size * len(width), dtype=np.int32).reshape(len(width), size)}


@fill_optionals(bias=np.array([100.0], dtype=np.float32))
@group_by_keys
@batch
def with_default(x, bias):
    return {"y": x + bias}


@batch
@first_value("scale")
def scaled(x, scale):
    assert np.isscalar(scale)
    return {"y": x * scale}


@batch
@pad_batch
def padded(x):
    # The batch size the callable saw, as an output: a backend instance runs in another process.
    return {"y": x, "seen": np.full((len(x), 1), len(x), np.int32)}


def _config_info(requests, config):
    text = f"{config.model_name}:{config.max_batch_size}:{[o.name for o in config.outputs]}".encode()
    return [{"info": np.array([[text]] * len(r["x"]), dtype=object)} for r in requests]


@triton_context
def reads_config(requests, triton_context):
    return _config_info(requests, triton_context.model_configs[reads_config])
