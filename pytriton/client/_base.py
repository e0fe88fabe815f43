"""``BaseModelClient``: what every client shares (URL, model identity, timeouts, the core)."""

from __future__ import annotations

from typing import Any, Optional

from pytriton.client._core import ClientCore
from pytriton.client._url import TritonUrl, parse_url
from pytriton.client.auth import ClientSecurity, PathLike
from pytriton.client.exceptions import PyTritonClientClosedError


class BaseModelClient:
    """What every client shares: URL parsing, the model identity, timeouts, security and the core.

    ``access_token`` (``Triton.get_access_token()``) is sent with every call; ``grpcs://`` URLs use
    TLS, with ``root_certificates`` / ``private_key`` / ``certificate_chain`` PEM files (see
    :mod:`pytriton.client.auth`).
    """

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: Optional[str] = None,
        *,
        lazy_init: bool = True,
        init_timeout_s: Optional[float] = None,
        inference_timeout_s: Optional[float] = None,
        access_token: Optional[str] = None,
        root_certificates: Optional[PathLike] = None,
        private_key: Optional[PathLike] = None,
        certificate_chain: Optional[PathLike] = None,
    ):
        self._url: TritonUrl = parse_url(url)
        self._security = ClientSecurity(access_token, root_certificates, private_key, certificate_chain)
        self._security.check(self._url)
        self._core = ClientCore(self._url, model_name, model_version, init_timeout_s, inference_timeout_s)
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

    def get_lib(self) -> Any:
        """The tritonclient module used for the URL's protocol (``tritonclient.http`` or ``.grpc``)."""
        if self._url.protocol == "grpc":
            import tritonclient.grpc as lib
        else:
            import tritonclient.http as lib  # type: ignore[no-redef]
        return lib
