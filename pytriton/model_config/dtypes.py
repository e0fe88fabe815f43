"""Mapping between the dtype forms users write, numpy dtypes and Triton's type names.

Unit test: tests/unit/test_model_config.py.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from pytriton.exceptions import PyTritonBadParameterError

# Triton type name -> numpy dtype. BYTES (variable-length strings) is represented by np.bytes_.
_TRITON_TO_NUMPY: Dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
_NUMPY_TO_TRITON: Dict[np.dtype[np.generic], str] = {dtype: name for name, dtype in _TRITON_TO_NUMPY.items()}
_BYTES_NAMES = frozenset({"bytes", "object", "str", "string", "bytes_", "object_", "str_", "s", "o", "u"})


def is_bytes_dtype(dtype: object) -> bool:
    """True for every form that means Triton BYTES (bytes, str, object, np.bytes_, 'S'/'U'/'O' dtypes)."""
    if dtype in (bytes, str, object, np.bytes_, np.str_, np.object_):
        return True
    if isinstance(dtype, str):
        return dtype.lower() in _BYTES_NAMES
    if isinstance(dtype, np.dtype):
        return dtype.kind in "SUO"
    return False


def normalize_dtype(dtype: Any, *, what: str = "tensor") -> type:
    """Return the numpy scalar type for a user-written dtype, e.g. ``"float32"`` -> ``np.float32``.

    Accepts numpy scalar types, ``np.dtype`` instances, dtype strings, builtin ``bool``/``int``/
    ``float`` and every BYTES form (normalised to ``np.bytes_``). Raises
    ``PyTritonBadParameterError`` naming ``what`` for anything Triton cannot carry.
    """
    if is_bytes_dtype(dtype):
        return np.bytes_
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise PyTritonBadParameterError(f"{what}: {dtype!r} is not a dtype numpy understands.") from None
    if resolved not in _NUMPY_TO_TRITON:
        supported = ", ".join(sorted(str(d) for d in _NUMPY_TO_TRITON)) + ", bytes"
        raise PyTritonBadParameterError(f"{what}: dtype {resolved} is not supported by Triton. Supported: {supported}.")
    return resolved.type  # type: ignore[no-any-return]


def triton_type(dtype: object) -> str:
    """Triton type name (``"FP32"``, ``"BYTES"``, ...) of a dtype in any accepted form."""
    normalized = normalize_dtype(dtype)
    if normalized is np.bytes_:
        return "BYTES"
    return _NUMPY_TO_TRITON[np.dtype(normalized)]


def numpy_type(triton_name: str) -> type:
    """Numpy scalar type for a Triton type name (``TYPE_`` prefix optional)."""
    name = triton_name[5:] if triton_name.startswith("TYPE_") else triton_name
    if name in ("BYTES", "STRING"):
        return np.bytes_
    dtype: Optional[np.dtype[np.generic]] = _TRITON_TO_NUMPY.get(name)
    if dtype is None:
        raise PyTritonBadParameterError(f"Triton type {triton_name!r} has no numpy equivalent in pytriton.")
    return dtype.type  # type: ignore[no-any-return]
