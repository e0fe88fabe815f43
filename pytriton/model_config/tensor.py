"""``Tensor``: the declaration of one model input or output."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config.dtypes import normalize_dtype


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A model input or output.

    Args:
        shape: shape of one sample, *without* the batch axis; ``-1`` marks a dynamic dimension.
        dtype: any dtype form numpy understands, builtin ``bool``/``int``/``float``, or a BYTES
            form (``bytes``, ``object``, ``np.bytes_``); stored normalised to a numpy scalar type.
        name: tensor name; ``None`` lets ``Triton.bind`` name it ``INPUT_<n>`` / ``OUTPUT_<n>``.
        optional: an input the client may omit (inputs only).
    """

    shape: Tuple[int, ...]
    dtype: Any
    name: Optional[str] = None
    optional: Optional[bool] = False

    def __post_init__(self) -> None:
        label = f"Tensor {self.name!r}" if self.name else "Tensor"
        try:
            shape = tuple(int(dim) for dim in self.shape)
        except (TypeError, ValueError):
            raise PyTritonBadParameterError(f"{label}: shape {self.shape!r} must be a sequence of integers.") from None
        if any(dim < -1 or dim == 0 for dim in shape):
            raise PyTritonBadParameterError(
                f"{label}: shape {shape} may only hold positive sizes or -1 for dynamic dimensions."
            )
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype, what=label))
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise PyTritonBadParameterError(f"Tensor name must be a non-empty string, got {self.name!r}.")
