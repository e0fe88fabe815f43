"""``ModelConfig``: how Triton schedules a bound model."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from pytriton.model_config.common import DynamicBatcher, ModelWarmup, SequenceBatcher


@dataclasses.dataclass
class ModelConfig:
    """Scheduling settings of a bound model.

    Args:
        batching: the model accepts a leading batch axis (``max_batch_size > 0`` in Triton).
        max_batch_size: largest batch Triton sends to the callable.
        batcher: dynamic batcher settings (used when ``batching`` is on).
        response_cache: let Triton cache responses (needs ``TritonConfig(cache_config=[...])``).
        decoupled: streaming model; the callable yields any number of responses per request.
        model_warmup: requests Triton sends to every instance while loading the model, before it
            reports ready (:class:`~pytriton.model_config.common.ModelWarmup`); they reach the
            callable like any other batch. A warmup that fails makes the load fail: ``run()`` (or a
            ``bind`` after it) raises with Triton's message, and the model is not served.
        execution_timeout_s: if set (seconds, > 0), a batch whose callable has not answered within
            this time fails with an error naming the timeout, and the instance is freed for the
            next batch (the hung call keeps running on its own thread; its result is discarded).
            For a decoupled model it bounds the wait for each next response. ``None``: no limit.
            docs/cancellation.md says what happens to the hung call.
        sequence_batcher: make the model stateful: Triton's sequence batcher routes the requests
            of each sequence (:class:`~pytriton.model_config.common.SequenceBatcher`) in place of
            the dynamic batcher (``batcher`` must then be left at its default). docs/sequences.md.
    """

    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = dataclasses.field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False
    model_warmup: Optional[List[ModelWarmup]] = None
    execution_timeout_s: Optional[float] = None
    sequence_batcher: Optional[SequenceBatcher] = None
