"""In-process Triton: embed the bundled Triton server library in this Python process.

Use it as ``import pytriton.inprocess as tritonserver``; the names follow Triton's in-process Python
API (``Server``, ``Options``, ``Model``, ``InferenceRequest``, ``Tensor``, the enums and the error
classes). See ``docs/inprocess.md``.
"""

from __future__ import annotations

from pytriton.inprocess._client import InProcessModelClient
from pytriton.inprocess._enums import (
    DataType,
    DLDeviceType,
    InstanceGroupKind,
    LogFormat,
    LogLevel,
    MemoryType,
    MetricFormat,
    ModelBatchFlag,
    ModelControlMode,
    ModelIndexFlag,
    ModelTxnPropertyFlag,
    ParameterType,
    RateLimitMode,
    RequestFlag,
    RequestReleaseFlag,
    ResponseCompleteFlag,
)
from pytriton.inprocess._errors import (
    AlreadyExistsError,
    CancelledError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnknownError,
    UnsupportedError,
)
from pytriton.inprocess._request import (
    AsyncResponseIterator,
    InferenceRequest,
    InferenceResponse,
    ResponseIterator,
)
from pytriton.inprocess._server import (
    Model,
    ModelDictionary,
    ModelLoadDeviceLimit,
    Options,
    RateLimiterResource,
    Server,
)
from pytriton.inprocess._tensor import MemoryAllocator, MemoryBuffer, Tensor

__all__ = [
    "AlreadyExistsError",
    "AsyncResponseIterator",
    "CancelledError",
    "DLDeviceType",
    "DataType",
    "InProcessModelClient",
    "InferenceRequest",
    "InferenceResponse",
    "InstanceGroupKind",
    "InternalError",
    "InvalidArgumentError",
    "LogFormat",
    "LogLevel",
    "MemoryAllocator",
    "MemoryBuffer",
    "MemoryType",
    "MetricFormat",
    "Model",
    "ModelBatchFlag",
    "ModelControlMode",
    "ModelDictionary",
    "ModelIndexFlag",
    "ModelLoadDeviceLimit",
    "ModelTxnPropertyFlag",
    "NotFoundError",
    "Options",
    "ParameterType",
    "RateLimitMode",
    "RateLimiterResource",
    "RequestFlag",
    "RequestReleaseFlag",
    "ResponseCompleteFlag",
    "ResponseIterator",
    "Server",
    "Tensor",
    "TritonError",
    "UnavailableError",
    "UnknownError",
    "UnsupportedError",
]
