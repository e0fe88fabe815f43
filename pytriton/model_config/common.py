"""Enums and dataclasses shared by the public and the generated model configuration."""

from __future__ import annotations

import dataclasses
import enum
from typing import Dict, List, Optional


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
