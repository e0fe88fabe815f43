"""``BaseModelClient``: what every client shares (URL, model identity, timeouts, security, the core).

Also :class:`ClosesOnExit`, the ``with`` protocol of the blocking clients and the legacy contexts.

Unit tests: tests/unit/test_client_core.py (``from_existing_client``, ``create_client_from_url``,
``with``), tests/unit/test_security.py (token and TLS keywords), tests/unit/test_legacy_client.py
(``ClosesOnExit`` of ``InferContext``).
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional, Type, TypeVar

from pytriton.client._core import DEFAULT_NETWORK_TIMEOUT_S, ClientCore
from pytriton.client._url import TritonUrl, parse_url
from pytriton.client.auth import ClientSecurity, PathLike
from pytriton.client.exceptions import PyTritonClientClosedError
from pytriton.client.warnings import NotSupportedTimeoutWarning
from pytriton.model_config.triton_model_config import TritonModelConfig

_Client = TypeVar("_Client", bound="BaseModelClient")
_Closing = TypeVar("_Closing", bound="ClosesOnExit")


class ClosesOnExit:
    """``with resource:`` gives the resource itself and calls its :meth:`close` at the end of the block."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Closing) -> _Closing:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def tritonclient_lib(protocol: str, asyncio: bool) -> Any:
    """The tritonclient module for ``protocol`` (``"http"``/``"grpc"``), blocking or asyncio."""
    if protocol == "grpc":
        if asyncio:
            import tritonclient.grpc.aio as grpc_aio

            return grpc_aio
        import tritonclient.grpc as grpc_sync

        return grpc_sync
    if asyncio:
        import tritonclient.http.aio as http_aio

        return http_aio
    import tritonclient.http as http_sync

    return http_sync


class BaseModelClient:
    """What every client shares: URL parsing, the model identity, timeouts, security and the core.

    ``model_config`` (a ``TritonModelConfig``, e.g. another client's) skips reading the config from
    the server; with ``ensure_model_is_ready=False`` as well, the client sends its first inference
    without checking readiness. ``access_token`` (``Triton.get_access_token()``) is sent with every
    call; ``grpcs://`` URLs use TLS, with ``root_certificates`` / ``private_key`` /
    ``certificate_chain`` PEM files (see :mod:`pytriton.client.auth`).
    """

    _ASYNCIO = False  # True for the clients built on tritonclient's asyncio modules

    def __init__(
        self, url: str, model_name: str, model_version: Optional[str] = None, *, lazy_init: bool = True,
        # start-up and timeouts
        init_timeout_s: Optional[float] = None, inference_timeout_s: Optional[float] = None,
        model_config: Optional[TritonModelConfig] = None, ensure_model_is_ready: bool = True,
        # security (pytriton.client.auth)
        access_token: Optional[str] = None, root_certificates: Optional[PathLike] = None,
        private_key: Optional[PathLike] = None, certificate_chain: Optional[PathLike] = None,
    ):  # fmt: skip
        self._url: TritonUrl = parse_url(url)
        self._security = ClientSecurity(access_token, root_certificates, private_key, certificate_chain)
        self._security.check(self._url)
        self._core = ClientCore(
            self._url, model_name, model_version, init_timeout_s, inference_timeout_s, model_config,
            ensure_model_is_ready,
        )  # fmt: skip
        self._lazy_init = lazy_init
        self._closed = False
        self._open()

    def _open(self) -> None:
        """Create the connections; called once, at the end of ``__init__``.

        Subclasses that do blocking work here (``lazy_init=False``) close themselves if it fails.
        """

    def _check_open(self) -> None:
        if self._closed:
            raise PyTritonClientClosedError("The client is closed.")

    def _clone_kwargs(self) -> Dict[str, Any]:
        """Constructor keyword arguments that recreate this client (used by ``from_existing_client``)."""
        core = self._core
        kwargs: Dict[str, object] = dict(
            init_timeout_s=core.init_timeout_s, inference_timeout_s=core.inference_timeout_s,
            **self._security.as_kwargs(),
        )  # fmt: skip
        if core.config is not None:
            kwargs["model_config"] = core.config
            kwargs["ensure_model_is_ready"] = not core.ready
        return kwargs

    @classmethod
    def from_existing_client(cls: Type[_Client], existing_client: BaseModelClient) -> _Client:
        """A new client of this class for the same server and model, with the same timeouts and security.

        The model config the existing client has already read is reused (no extra requests), and so is
        its knowledge that the model is ready.
        """
        core = existing_client._core
        return cls(
            str(existing_client._url), core.model_name, core.model_version or None, **existing_client._clone_kwargs()
        )

    @classmethod
    def create_client_from_url(cls, url: str, network_timeout_s: Optional[float] = None) -> Any:
        """A plain ``tritonclient`` ``InferenceServerClient`` for ``url`` (blocking or asyncio, like this class).

        HTTP clients bound connecting and every call by ``network_timeout_s`` (default 60 s); gRPC
        clients take deadlines per call only, so for them a given ``network_timeout_s`` is ignored with a
        ``NotSupportedTimeoutWarning``. Raises ``PyTritonClientInvalidUrlError`` for an unusable URL.
        The caller owns (and closes) the returned client; no access token or TLS is applied.
        """
        parsed = parse_url(url)
        lib = tritonclient_lib(parsed.protocol, cls._ASYNCIO)
        timeout_s = DEFAULT_NETWORK_TIMEOUT_S if network_timeout_s is None else float(network_timeout_s)
        if parsed.protocol == "grpc":
            if network_timeout_s is not None:
                warnings.warn(
                    f"gRPC clients take deadlines per call; network_timeout_s={network_timeout_s} is ignored.",
                    NotSupportedTimeoutWarning,
                    stacklevel=2,
                )
            return lib.InferenceServerClient(parsed.address, ssl=parsed.tls)
        if cls._ASYNCIO:
            return lib.InferenceServerClient(parsed.address, conn_timeout=timeout_s)
        return lib.InferenceServerClient(parsed.address, connection_timeout=timeout_s, network_timeout=timeout_s)

    def get_lib(self) -> Any:
        """The tritonclient module this client uses: ``tritonclient.http``/``.grpc``, or their ``.aio`` for asyncio."""
        return tritonclient_lib(self._url.protocol, self._ASYNCIO)
