"""Clients for models served by Triton (HTTP and gRPC), blocking, futures, asyncio and streaming."""

# For maintainers (kept out of the API reference):
# Unit tests: tests/unit/test_public_api.py (the exported names), tests/unit/test_client_core.py (the
# clients).

from pytriton.client.client import (
    AsyncioDecoupledModelClient,
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)

__all__ = [
    "AsyncioDecoupledModelClient",
    "AsyncioModelClient",
    "DecoupledModelClient",
    "FuturesModelClient",
    "ModelClient",
]
