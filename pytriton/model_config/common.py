"""Enums and dataclasses shared by the public and the generated model configuration."""

# For maintainers (kept out of the API reference):
# Unit tests: tests/unit/test_model_config.py (batcher and queue policy in generated configs),
# tests/unit/test_api_drift.py (warmup types).

from __future__ import annotations

import dataclasses
import enum
import pathlib
from typing import Dict, List, Optional, Sequence, Union


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


class SequenceStrategy(enum.Enum):
    """How the sequence batcher assigns sequences to model instances (Triton's ``ModelSequenceBatching``).

    ``DIRECT``: each sequence keeps one batch slot of one instance for its whole life, so that
    instance sees every request of the sequence (state kept in the instance is safe).
    ``OLDEST``: requests of the oldest sequences are batched dynamically, at most one per sequence
    per batch; a sequence may move between instances of the model, so state must be shared by them.
    """

    DIRECT = "direct"
    OLDEST = "oldest"


@dataclasses.dataclass
class SequenceBatcher:
    """Sequence batcher settings: a *stateful* model whose requests belong to sequences.

    Each request carries a sequence id and start/end flags (client keyword arguments
    ``sequence_id``, ``sequence_start``, ``sequence_end``); the callable reads them as
    ``Request.sequence_id``, ``Request.sequence_start`` and ``Request.sequence_end``. pytriton
    declares Triton's START, END, READY and CORRID control inputs itself under reserved names and
    hands their values over as those attributes, so the callable never sees them as inputs.
    docs/sequences.md.

    Args:
        strategy: ``SequenceStrategy.DIRECT`` (default) or ``SequenceStrategy.OLDEST``.
        max_sequence_idle_microseconds: a sequence that gets no request for this long is ended
            by Triton, which frees its slot; its next request then fails (0: Triton's default, 1 s).
        string_ids: sequence ids may be strings (then integers are accepted too; without it only
            unsigned 64-bit integers are, declared through Triton's CORRID control).
        max_candidate_sequences: OLDEST only: sequences the batcher chooses among (0: Triton's default).
        max_queue_delay_microseconds: OLDEST only: how long a batch may wait to fill up.
        preferred_batch_size: OLDEST only: batch sizes the batcher aims for.
        max_open_sequences: OLDEST only: the most sequences one instance keeps open (started, neither
            ended nor idle for ``max_sequence_idle_microseconds``); a start beyond it is refused with
            503 (gRPC ``UNAVAILABLE``), and so are that sequence's later requests, so the callable never
            sees them, while open sequences go on. 0: no bound. Counted in pytriton's stub, not written
            to config.pbtxt; keep ``max_candidate_sequences`` at least this. (``DIRECT``: Triton's
            slots bound an instance to ``max_batch_size`` open sequences.) docs/sequences.md.
        owner_header: opt-in isolation of callers: the name of a request header (or gRPC metadata
            key) that carries each caller's credential, e.g. ``"authorization"``. A sequence is then
            owned by the credential its start carried: a request of it with another credential, or
            none, is refused with 400 (gRPC ``INVALID_ARGUMENT``) before the callable, so a caller can
            only continue, end or restart its own sequences. The server must forward that header to
            the model (``TritonConfig(http_header_forward_pattern=..., grpc_header_forward_pattern=...)``,
            checked by ``Triton.bind``); the callable never sees it. ``OLDEST`` needs one instance
            (owners are kept per instance). None (default): any caller that knows an id may use it.
            docs/sequences.md, "Sequence ids and who may use them".
    """

    strategy: SequenceStrategy = SequenceStrategy.DIRECT
    max_sequence_idle_microseconds: int = 0
    string_ids: bool = False
    max_candidate_sequences: int = 0
    max_queue_delay_microseconds: int = 0
    preferred_batch_size: Optional[List[int]] = None
    max_open_sequences: int = 4096
    owner_header: Optional[str] = None


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

    dtype: object
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
