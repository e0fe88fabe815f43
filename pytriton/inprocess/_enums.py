"""Enumerations of the in-process API, numbered as in Triton's C API (``tritonserver.h``).

The values are passed to and read from the server library unchanged, so they must never be
renumbered. Every enum is an :class:`enum.IntEnum`, so ``DataType.FP32 == 11`` holds.

Unit test: tests/unit/test_inprocess.py.
"""

from __future__ import annotations

import enum
from typing import Dict

import numpy as np


class DataType(enum.IntEnum):
    """Tensor element type (``TRITONSERVER_DataType``)."""

    INVALID = 0
    BOOL = 1
    UINT8 = 2
    UINT16 = 3
    UINT32 = 4
    UINT64 = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FP16 = 10
    FP32 = 11
    FP64 = 12
    BYTES = 13
    BF16 = 14


class MemoryType(enum.IntEnum):
    """Where a buffer lives (``TRITONSERVER_MemoryType``)."""

    CPU = 0
    CPU_PINNED = 1
    GPU = 2


class ModelControlMode(enum.IntEnum):
    """How the server decides which models to load (``TRITONSERVER_ModelControlMode``)."""

    NONE = 0
    POLL = 1
    EXPLICIT = 2


class RateLimitMode(enum.IntEnum):
    """Rate limiter mode (``TRITONSERVER_RateLimitMode``)."""

    OFF = 0
    EXEC_COUNT = 1


class LogFormat(enum.IntEnum):
    """Log line format (``TRITONSERVER_LogFormat``)."""

    DEFAULT = 0
    ISO8601 = 1


class MetricFormat(enum.IntEnum):
    """Format of :meth:`Server.metrics` (``TRITONSERVER_MetricFormat``)."""

    PROMETHEUS = 0


class InstanceGroupKind(enum.IntEnum):
    """Kind of device a model instance runs on (``TRITONSERVER_InstanceGroupKind``)."""

    AUTO = 0
    CPU = 1
    GPU = 2
    MODEL = 3


class ModelBatchFlag(enum.IntEnum):
    """Batching property of a model (``TRITONSERVER_ModelBatchFlag``)."""

    UNKNOWN = 1
    FIRST_DIM = 2


class ModelTxnPropertyFlag(enum.IntEnum):
    """Transaction property of a model (``TRITONSERVER_ModelTxnPropertyFlag``)."""

    ONE_TO_ONE = 1
    DECOUPLED = 2


class ModelIndexFlag(enum.IntEnum):
    """Filter for the model index (``TRITONSERVER_ModelIndexFlag``)."""

    READY = 1


class ErrorCode(enum.IntEnum):
    """Error category of a ``TRITONSERVER_Error``."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class RequestFlag(enum.IntFlag):
    """Flags of an inference request (``TRITONSERVER_RequestFlag``)."""

    SEQUENCE_START = 1
    SEQUENCE_END = 2


class ResponseCompleteFlag(enum.IntFlag):
    """Flags passed with a completed response (``TRITONSERVER_ResponseCompleteFlag``)."""

    FINAL = 1


class RequestReleaseFlag(enum.IntFlag):
    """Flags passed when Triton releases a request (``TRITONSERVER_RequestReleaseFlag``)."""

    ALL = 1
    RESCHEDULE = 2


class ParameterType(enum.IntEnum):
    """Type of a request, response or load parameter (``TRITONSERVER_ParameterType``)."""

    STRING = 0
    INT = 1
    BOOL = 2
    DOUBLE = 3
    BYTES = 4


class LogLevel(enum.IntEnum):
    """Log level (``TRITONSERVER_LogLevel``)."""

    INFO = 0
    WARN = 1
    ERROR = 2
    VERBOSE = 3


class DLDeviceType(enum.IntEnum):
    """DLPack device types used to name a memory location (a subset of ``DLDeviceType``)."""

    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3


_NUMPY_OF: Dict[DataType, np.dtype[np.generic]] = {
    DataType.BOOL: np.dtype(np.bool_),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.UINT32: np.dtype(np.uint32),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.INT8: np.dtype(np.int8),
    DataType.INT16: np.dtype(np.int16),
    DataType.INT32: np.dtype(np.int32),
    DataType.INT64: np.dtype(np.int64),
    DataType.FP16: np.dtype(np.float16),
    DataType.FP32: np.dtype(np.float32),
    DataType.FP64: np.dtype(np.float64),
}
_DATA_TYPE_OF: Dict[str, DataType] = {dtype.str: data_type for data_type, dtype in _NUMPY_OF.items()}


def numpy_dtype(data_type: DataType) -> np.dtype[np.generic]:
    """numpy dtype holding elements of ``data_type``; ``ValueError`` for BYTES, BF16 and INVALID."""
    try:
        return _NUMPY_OF[DataType(data_type)]
    except KeyError:
        raise ValueError(f"{DataType(data_type).name} has no fixed-size numpy dtype") from None


def data_type_of(dtype: np.dtype[np.generic]) -> DataType:
    """Triton data type of a numpy dtype (object, bytes and str dtypes map to BYTES)."""
    dtype = np.dtype(dtype)
    if dtype.kind in ("O", "S", "U"):
        return DataType.BYTES
    found = _DATA_TYPE_OF.get(dtype.newbyteorder("=").str)
    if found is None:
        raise ValueError(f"numpy dtype {dtype} has no Triton data type")
    return found


def data_type_name(data_type: DataType) -> str:
    """Name Triton uses in configs and metadata (``FP32``, ``BYTES``, ...)."""
    return DataType(data_type).name
