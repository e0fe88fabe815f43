"""Clients for models served by Triton: blocking, futures-based and asyncio, plus streaming ones.

Typical use::

    with ModelClient("localhost", "AddSub") as client:
        outputs = client.infer_sample(a, b)                  # positional, in the model's input order
        outputs = client.infer_batch(a=batch_a, b=batch_b)   # or by name (never both)

URLs: ``grpc://host:port``, ``grpcs://host:port`` (TLS), ``http://host:port``, ``host:port`` or
``host`` (HTTP by default; default ports 8000 for HTTP and 8001 for gRPC). ``access_token=`` (from
``Triton.get_access_token()``) is sent with every call; see :mod:`pytriton.client.auth`.

Unit test: tests/unit/test_client_core.py (every client on a fake server).
"""

from pytriton.client._base import BaseModelClient
from pytriton.client._clients import AsyncioModelClient, FuturesModelClient, ModelClient
from pytriton.client._decoupled import AsyncioDecoupledModelClient, DecoupledModelClient

__all__ = [
    "AsyncioDecoupledModelClient",
    "AsyncioModelClient",
    "BaseModelClient",
    "DecoupledModelClient",
    "FuturesModelClient",
    "ModelClient",
]
