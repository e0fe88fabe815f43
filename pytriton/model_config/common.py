"""Enums and dataclasses shared by the public and the generated model configuration.

Unit tests: tests/unit/test_model_config.py (batcher and queue policy in generated configs),
tests/unit/test_api_drift.py (warmup types).
"""

from __future__ import annotations

import dataclasses
import enum
import pathlib
from typing import Any, Dict, List, Optional, Sequence, Union


class DeviceKind(enum.Enum):
    """Where Triton places a model instance. The proxy model always runs on the CPU."""

    KIND_AUTO = "KIND_AUTO"
    KIND_CPU = "KIND_CPU"
    KIND_GPU = "KIND_GPU"


class TimeoutAction(enum.Enum):
    """What the dynamic batcher does with a request whose queue timeout expired."""

    REJECT = "REJECT"
    DELAY = "DELAY"


@dataclasses.dataclass
class QueuePolicy:
    """Queue policy of the dynamic batcher (see Triton's ``ModelQueuePolicy``)."""

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclasses.dataclass
class DynamicBatcher:
    """Dynamic batcher settings (see Triton's ``ModelDynamicBatching``)."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: Optional[List[int]] = None
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: Optional[QueuePolicy] = None
    priority_queue_policy: Optional[Dict[int, QueuePolicy]] = None


@dataclasses.dataclass
class WarmupInput:
    """One input of a warmup request (Triton's ``ModelWarmup.Input``).

    Args:
        dtype: the input's dtype, in any form ``Tensor`` accepts.
        shape: the shape of one sample, without the batch axis (as in ``Tensor``); no ``-1``.
        zero_data: fill the input with zeros (empty strings for BYTES).
        random_data: fill the input with random values (Triton's generator; zeros for BYTES).
        input_data_file: take the input's content from this file: a ``.npy`` file (its array is
            converted to ``dtype``, holding one sample's elements or a whole batch's) or raw
            bytes in Triton's layout (little-endian values; for BYTES, each element as a 4-byte
            length and its bytes). The file is copied into the model's repository at bind time.

    Exactly one of ``zero_data``, ``random_data`` and ``input_data_file`` must be set.
    """

    dtype: Any
    shape: Sequence[int]
    zero_data: bool = False
    random_data: bool = False
    input_data_file: Optional[Union[str, pathlib.Path]] = None


@dataclasses.dataclass
class ModelWarmup:
    """A warmup Triton sends to each instance of the model while loading it, before it is ready.

    Args:
        name: a label, shown in Triton's log and in errors.
        batch_size: the batch size of each warmup request (1 for a model without batching).
        inputs: the warmup data by input name, at least one. Data for only some required inputs is
            accepted; pytriton then sends the model's warmups itself (docs/configuration.md, "Warmup").
        count: how many times the request is sent (at least 1).
    """

    name: str
    batch_size: int
    inputs: Dict[str, WarmupInput]
    count: int = 1
