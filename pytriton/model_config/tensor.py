"""``Tensor``: the declaration of one model input or output.

Unit test: tests/unit/test_model_config.py.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import numpy as np

from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config.dtypes import normalize_dtype

_KEPT_BYTES_TYPES = (object, bytes, np.object_, np.bytes_)


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A model input or output.

    Args:
        shape: shape of one sample, *without* the batch axis; ``-1`` marks a dynamic dimension.
            A size of 0 is accepted here, as by NVIDIA PyTriton; ``Triton.bind`` refuses it, because
            Triton's model configuration does not allow it (only sizes >= 1 and -1).
        dtype: any dtype form numpy understands, builtin ``bool``/``int``/``float``, or a BYTES
            form (``bytes``, ``object``, ``np.bytes_``, ``np.object_``). ``object``, ``bytes``,
            ``np.object_`` and ``np.bytes_`` are kept as given (as NVIDIA PyTriton does); every other
            form is stored as its numpy scalar type (``np.dtype("S5")`` and ``"bytes"`` as
            ``np.bytes_``). All of them mean Triton's BYTES.
        name: tensor name; ``None`` lets ``Triton.bind`` name it ``INPUT_<n>`` / ``OUTPUT_<n>``.
        optional: an input the client may omit (inputs only).
    """

    shape: Tuple[int, ...]
    dtype: object
    name: Optional[str] = None
    optional: Optional[bool] = False

    def __post_init__(self) -> None:
        label = f"Tensor {self.name!r}" if self.name else "Tensor"
        try:
            shape = tuple(int(dim) for dim in self.shape)
        except (TypeError, ValueError):
            raise PyTritonBadParameterError(f"{label}: shape {self.shape!r} must be a sequence of integers.") from None
        if any(dim < -1 for dim in shape):
            raise PyTritonBadParameterError(
                f"{label}: shape {shape} may only hold sizes >= 0 or -1 for dynamic dimensions."
            )
        object.__setattr__(self, "shape", shape)
        normalized = normalize_dtype(self.dtype, what=label)  # validates every form
        # As NVIDIA PyTriton: the Python types it names for strings (object, bytes) are kept as
        # given; every other form is stored as its numpy scalar type.
        if isinstance(self.dtype, np.dtype) and self.dtype.kind == "O":
            object.__setattr__(self, "dtype", np.object_)  # a dtype instance becomes its scalar type
        elif not (normalized is np.bytes_ and any(self.dtype is kept for kept in _KEPT_BYTES_TYPES)):
            object.__setattr__(self, "dtype", normalized)
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise PyTritonBadParameterError(f"Tensor name must be a non-empty string, got {self.name!r}.")
