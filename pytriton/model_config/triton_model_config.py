"""``TritonModelConfig``: the complete, typed configuration of one model as Triton sees it.

Built by ``Triton.bind`` from the user's ``Tensor``s and ``ModelConfig``, turned into Triton's
config by :mod:`pytriton.model_config.generator`, and parsed back from a server's config for
clients and decorators.

Unit test: tests/unit/test_model_config.py.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import numpy as np
import numpy.typing as npt

from pytriton.model_config.common import DeviceKind, DynamicBatcher, SequenceBatcher


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output with a resolved name and a numpy scalar type."""

    name: str
    shape: Tuple[int, ...]
    dtype: type
    optional: bool = False

    def mismatch(self, array: npt.NDArray[np.generic], batch_axis: bool) -> Optional[str]:
        """Why ``array`` does not fit this declaration (dtype, then shape), or None if it does.

        ``batch_axis``: the array carries a leading batch axis that the declaration does not.
        """
        declared_bytes = self.dtype is np.bytes_
        if declared_bytes != (array.dtype.kind in "SUO") or (
            not declared_bytes and array.dtype != np.dtype(self.dtype)
        ):
            return f"has dtype {array.dtype}, declared {'bytes' if declared_bytes else np.dtype(self.dtype)}"
        shape = array.shape[1:] if batch_axis else array.shape
        if (
            (batch_axis and array.ndim == 0)
            or len(shape) != len(self.shape)
            or any(want not in (-1, got) for want, got in zip(self.shape, shape))
        ):
            axis = " after the batch axis" if batch_axis else ""
            return f"has shape {array.shape}, declared {self.shape}{axis}"
        return None


@dataclasses.dataclass
class TritonModelConfig:
    """Everything needed to write (or read back) a Triton model configuration."""

    model_name: str
    model_version: int = 1
    max_batch_size: int = 4
    batching: bool = True
    batcher: Optional[DynamicBatcher] = None
    instance_group: Dict[DeviceKind, int] = dataclasses.field(default_factory=dict)
    decoupled: bool = False
    backend_parameters: Dict[str, str] = dataclasses.field(default_factory=dict)
    inputs: List[TensorSpec] = dataclasses.field(default_factory=list)
    outputs: List[TensorSpec] = dataclasses.field(default_factory=list)
    response_cache: bool = False
    backend: str = "python"
    # The versions Triton serves (``version_policy { specific ... }``); None: Triton's default, the latest.
    versions: Optional[List[int]] = None
    # The ``model_warmup`` section in protobuf JSON form (pytriton.model_config.warmup); None: no warmup.
    model_warmup: Optional[List[Dict[str, object]]] = None
    # Triton's sequence batcher in place of the dynamic one (docs/sequences.md); None: not a sequence model.
    sequence_batcher: Optional[SequenceBatcher] = None

    @property
    def instance_count(self) -> int:
        """Total number of model instances across instance groups."""
        return sum(self.instance_group.values()) or 1
