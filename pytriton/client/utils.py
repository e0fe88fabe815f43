"""Helpers for plain ``tritonclient`` clients: URLs, readiness, model state and config.

Every function takes a *blocking* ``tritonclient.http`` or ``tritonclient.grpc``
``InferenceServerClient`` (for example from :func:`create_client_from_url`) and runs the same
operations the pytriton clients use (``pytriton.client._core``) on it, so waits, timeouts and
error mapping are identical. The caller keeps ownership of the client.
"""

# For maintainers (kept out of the API reference):
# Unit test: tests/unit/test_client_core.py (these helpers on a fake server,
# ``create_client_from_url``).

from __future__ import annotations

from typing import Any, Optional

from pytriton.client._base import BaseModelClient
from pytriton.client._core import (
    DEFAULT_INIT_TIMEOUT_S,
    DEFAULT_SERVER_READY_TIMEOUT_S,
    LATEST_MODEL_VERSION,
    ModelState,
    model_state,
    read_config,
)
from pytriton.client._core import wait_for_model as _wait_for_model_operation
from pytriton.client._core import wait_for_server as _wait_for_server_operation
from pytriton.client._drivers import run_sync
from pytriton.client._url import TritonUrl
from pytriton.model_config.triton_model_config import TritonModelConfig

__all__ = [
    "LATEST_MODEL_VERSION",
    "ModelState",
    "TritonUrl",
    "create_client_from_url",
    "get_model_config",
    "get_model_state",
    "wait_for_model_ready",
    "wait_for_server_ready",
]


def _is_grpc(client: object) -> bool:
    return type(client).__module__.startswith("tritonclient.grpc")


def _version(model_version: Optional[str]) -> str:
    return "" if model_version in (None, LATEST_MODEL_VERSION) else str(model_version)


def create_client_from_url(url: str, network_timeout_s: Optional[float] = None) -> Any:
    """A blocking ``tritonclient`` client for ``url`` (``grpc://``, ``grpcs://``, ``http://``, ``host[:port]``).

    HTTP: connecting and every call are bounded by ``network_timeout_s`` (default 60 s). gRPC takes
    deadlines per call, so a given ``network_timeout_s`` is ignored with a
    ``NotSupportedTimeoutWarning``. ``PyTritonClientInvalidUrlError`` for an unusable URL.
    """
    return BaseModelClient.create_client_from_url(url, network_timeout_s)


def wait_for_server_ready(client: object, timeout_s: Optional[float] = None) -> None:
    """Poll until the server reports ready; ``PyTritonClientTimeoutError`` after ``timeout_s`` (default 60 s)."""
    timeout = DEFAULT_SERVER_READY_TIMEOUT_S if timeout_s is None else float(timeout_s)
    run_sync(_wait_for_server_operation(timeout, _is_grpc(client)), client, client)


def wait_for_model_ready(
    client: object, model_name: str, model_version: Optional[str] = None, timeout_s: Optional[float] = None
) -> None:
    """Poll until the server and the model (its latest version when ``model_version`` is None) are ready.

    ``PyTritonClientTimeoutError`` after ``timeout_s`` (default 300 s) for both waits together. Unlike
    the model clients, this plain poll waits for a model name the server does not know, too (as in
    NVIDIA PyTriton, whose callers expect only the timeout error from it).
    """
    timeout = DEFAULT_INIT_TIMEOUT_S if timeout_s is None else float(timeout_s)
    operation = _wait_for_model_operation(
        timeout, _is_grpc(client), model_name, _version(model_version), "the server", fail_unknown=False
    )
    run_sync(operation, client, client)


def get_model_state(client: object, model_name: str, model_version: Optional[str] = None) -> ModelState:
    """The model's :class:`ModelState` from the repository index (``UNAVAILABLE`` when it is not listed).

    Without ``model_version`` the numerically highest listed version is reported. One call, bounded
    like the client's other calls (HTTP: its network timeout; gRPC: 60 s).
    """
    operation = model_state(_is_grpc(client), DEFAULT_SERVER_READY_TIMEOUT_S, model_name, model_version)
    return run_sync(operation, client, client)  # type: ignore[no-any-return]


def get_model_config(
    client: object, model_name: str, model_version: Optional[str] = None, timeout_s: Optional[float] = None
) -> TritonModelConfig:
    """The model's config as a ``TritonModelConfig``, after waiting for it to be ready.

    ``timeout_s`` (default 300 s) bounds the wait and the read; ``PyTritonClientTimeoutError`` past it,
    ``PyTritonClientModelUnavailableError`` / ``PyTritonClientInferenceServerError`` when the server refuses,
    ``PyTritonClientRuntimeError`` for a config the client cannot use (e.g. a tensor type without a numpy dtype).
    """
    timeout = DEFAULT_INIT_TIMEOUT_S if timeout_s is None else float(timeout_s)
    grpc = _is_grpc(client)
    version = _version(model_version)

    def operation() -> Any:
        yield from _wait_for_model_operation(timeout, grpc, model_name, version, "the server", fail_unknown=False)
        return (yield from read_config(timeout, grpc, model_name, version))

    return run_sync(operation(), client, client)  # type: ignore[no-any-return]
