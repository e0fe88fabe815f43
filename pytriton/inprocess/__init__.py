"""In-process Triton: embed the bundled Triton server library in this Python process.

Use it as ``import pytriton.inprocess as tritonserver``; the names follow Triton's in-process Python
API (``Server``, ``Options``, ``Model``, ``InferenceRequest``, ``Tensor``, the enums and the error
classes). See ``docs/inprocess.md``.
"""

# For maintainers (kept out of the API reference):
# Unit test: tests/unit/test_inprocess.py (the public names and the modules without a server).

from __future__ import annotations

import os

# Triton's Python backend forks a stub process per model instance, from several of the server's
# threads at once. gRPC's core (loaded by tritonclient) installs fork handlers that abort the
# process on two concurrent forks in grpcio 1.67, the last release for Python 3.9 ("forkable.cc:
# Check failed: !std::exchange(is_forking_, true)"); grpcio 1.85 does not. gRPC reads this
# variable when it first initialises, so it takes effect when this module is imported before any
# gRPC client is used; docs/inprocess.md says what else to do. gRPC's Python layer already
# defaults to no fork support, so this only makes its core agree.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

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
from pytriton.inprocess._options import ModelLoadDeviceLimit, Options, RateLimiterResource
from pytriton.inprocess._request import (
    AsyncResponseIterator,
    InferenceRequest,
    InferenceResponse,
    ResponseIterator,
)
from pytriton.inprocess._server import Model, ModelDictionary, Server
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
