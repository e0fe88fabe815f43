"""Model configuration API: declare tensors and how Triton should schedule a bound model."""

# For maintainers (kept out of the API reference):
# Unit tests: tests/unit/test_model_config.py, tests/unit/test_public_api.py.

from pytriton.model_config.common import (
    DeviceKind,
    DynamicBatcher,
    QueuePolicy,
    SequenceBatcher,
    SequenceStrategy,
    TimeoutAction,
)
from pytriton.model_config.model_config import ModelConfig
from pytriton.model_config.tensor import Tensor

__all__ = [
    "DeviceKind",
    "DynamicBatcher",
    "ModelConfig",
    "QueuePolicy",
    "SequenceBatcher",
    "SequenceStrategy",
    "Tensor",
    "TimeoutAction",
]
