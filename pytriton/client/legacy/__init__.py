"""Compatibility layer for code written against the legacy ``tensorrtserver.api`` client.

The names, arguments and return shapes of the old API, implemented with ``tritonclient`` over
today's KServe v2 protocol (HTTP and gRPC), so old client code runs against any current Triton
server. The same names are importable as ``tensorrtserver.api``; shared-memory helpers live in
:mod:`pytriton.client.legacy.shared_memory` (``tensorrtserver.shared_memory``).
See docs/legacy-client.md for what maps to what and what differs.
"""

# For maintainers (kept out of the API reference):
# Unit tests: tests/unit/test_public_api.py (the exported names), tests/unit/test_legacy_client.py.

from pytriton.client.legacy._contexts import (
    ModelControlContext,
    ModelRepositoryContext,
    ServerHealthContext,
    ServerStatusContext,
    SharedMemoryControlContext,
)
from pytriton.client.legacy._errors import InferenceServerException
from pytriton.client.legacy._infer import InferContext
from pytriton.client.legacy._messages import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelReadyState,
    ModelRepositoryIndex,
    ModelStatus,
    ServerReadyState,
    ServerStatus,
    SharedMemoryStatus,
)
from pytriton.client.legacy._requests import InferRequestHeader, ResultFormat, serialize_string_tensor
from pytriton.client.legacy._transport import ProtocolType

__all__ = [
    "DataType",
    "InferContext",
    "InferRequestHeader",
    "InferenceServerException",
    "ModelConfig",
    "ModelControlContext",
    "ModelInput",
    "ModelOutput",
    "ModelReadyState",
    "ModelRepositoryContext",
    "ModelRepositoryIndex",
    "ModelStatus",
    "ProtocolType",
    "ResultFormat",
    "ServerHealthContext",
    "ServerReadyState",
    "ServerStatus",
    "ServerStatusContext",
    "SharedMemoryControlContext",
    "SharedMemoryStatus",
    "serialize_string_tensor",
]
