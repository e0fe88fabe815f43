"""Access tokens and TLS for the clients.

A server started by :class:`pytriton.triton.Triton` restricts its administrative endpoints to
callers that present its access token (``Triton.get_access_token()``). Every client takes
``access_token=``; it is then sent with *every* call: as the ``triton-access-token`` HTTP header, or
as ``triton-grpc-protocol-triton-access-token`` gRPC metadata (Triton's naming for a restricted gRPC
protocol). Raw ``tritonclient`` users can build the same headers with :func:`create_auth_headers`.

gRPC over TLS: a ``grpcs://host:port`` URL; ``root_certificates`` (PEM file of the CA that signed the
server's certificate; the system's roots when omitted) and, for mutual TLS, ``private_key`` and
``certificate_chain`` (PEM files of the client's own key and certificate).
"""

# For maintainers (kept out of the API reference):
# Unit test: tests/unit/test_security.py (headers per protocol, the client plugin, TLS options).

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Dict, Mapping, Optional, Union

from pytriton.client._url import TritonUrl
from pytriton.client.exceptions import PyTritonClientValueError
from pytriton.server.security import GRPC_HEADER_PREFIX, TRITON_ACCESS_HEADER

__all__ = ["create_auth_headers", "extract_access_token_from_headers"]

_GRPC_ACCESS_KEY = GRPC_HEADER_PREFIX + TRITON_ACCESS_HEADER

PathLike = Union[str, pathlib.Path]


def create_auth_headers(access_token: Optional[str], protocol: str) -> Dict[str, str]:
    """The header (``"http"``) or metadata (``"grpc"``) that carries ``access_token``.

    Raises ``ValueError`` for an empty token or an unknown protocol.
    """
    if not access_token:
        raise ValueError("access_token must be a non-empty string (see Triton.get_access_token()).")
    kind = protocol.lower() if isinstance(protocol, str) else protocol
    if kind == "http":
        return {TRITON_ACCESS_HEADER: access_token}
    if kind == "grpc":
        return {GRPC_HEADER_PREFIX + TRITON_ACCESS_HEADER: access_token}
    raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}.")


def extract_access_token_from_headers(headers: Optional[Mapping[str, str]]) -> Optional[str]:
    """The access token found in HTTP- or gRPC-style ``headers`` (``None`` if there is none).

    Raises ``ValueError`` if both forms are present with different tokens.
    """
    if not headers:
        return None
    lowered = {str(key).lower(): value for key, value in headers.items()}
    http_token = lowered.get(TRITON_ACCESS_HEADER)
    grpc_token = lowered.get(GRPC_HEADER_PREFIX + TRITON_ACCESS_HEADER)
    if http_token is not None and grpc_token is not None and http_token != grpc_token:
        raise ValueError(
            f"The headers carry two different access tokens ({TRITON_ACCESS_HEADER!r} and "
            f"{GRPC_HEADER_PREFIX + TRITON_ACCESS_HEADER!r}); send one."
        )
    return http_token if http_token is not None else grpc_token


def grpc_metadata(headers: Optional[Mapping[str, str]]) -> Optional[Dict[str, str]]:
    """``headers`` as gRPC metadata: an HTTP-style ``triton-access-token`` becomes Triton's gRPC key.

    Triton 2.51 reads a restricted gRPC protocol's token only from the metadata key
    ``triton-grpc-protocol-triton-access-token``; the HTTP header name, sent over gRPC, is ignored and
    the call refused. Keys are lower-cased (gRPC metadata keys are); other headers pass unchanged.
    """
    if headers is None:
        return None
    metadata: Dict[str, str] = {}
    for key, value in headers.items():
        name = str(key).lower()
        metadata[_GRPC_ACCESS_KEY if name == TRITON_ACCESS_HEADER else name] = value
    return metadata


@functools.cache
def _header_plugin_class(protocol: str) -> Any:
    """A plugin class that adds fixed headers to every call of a tritonclient client of ``protocol``.

    Its base is tritonclient's public ``InferenceServerClientPlugin`` as ``tritonclient.http`` and
    ``tritonclient.grpc`` export it (the client of that protocol has imported its package already).
    """
    if protocol == "grpc":
        from tritonclient.grpc import InferenceServerClientPlugin
    else:
        from tritonclient.http import InferenceServerClientPlugin

    class HeaderPlugin(InferenceServerClientPlugin):  # type: ignore[misc]  # tritonclient is untyped
        def __init__(self, headers: Dict[str, str]):
            self._headers = headers

        def __call__(self, request: Any) -> None:
            request.headers.update(self._headers)

    return HeaderPlugin


@dataclasses.dataclass(frozen=True)
class ClientSecurity:
    """A client's access token and TLS files, validated against its URL."""

    access_token: Optional[str] = dataclasses.field(default=None, repr=False)
    root_certificates: Optional[PathLike] = None
    private_key: Optional[PathLike] = None
    certificate_chain: Optional[PathLike] = None

    def check(self, url: TritonUrl) -> None:
        """Raise ``PyTritonClientValueError`` for options that cannot work with ``url``."""
        if self.access_token is not None and (not isinstance(self.access_token, str) or not self.access_token):
            raise PyTritonClientValueError("access_token must be a non-empty string (see Triton.get_access_token()).")
        files = {
            "root_certificates": self.root_certificates,
            "private_key": self.private_key,
            "certificate_chain": self.certificate_chain,
        }
        given = {name: path for name, path in files.items() if path is not None}
        if given and not url.tls:
            raise PyTritonClientValueError(
                f"{', '.join(given)} need a TLS connection: use a grpcs://host:port URL instead of {str(url)!r}."
            )
        if (self.private_key is None) != (self.certificate_chain is None):
            raise PyTritonClientValueError(
                "Mutual TLS needs both private_key and certificate_chain (the client's key and certificate)."
            )
        for name, path in given.items():
            if not pathlib.Path(path).is_file():
                raise PyTritonClientValueError(f"{name}={str(path)!r} is not a readable file (PEM expected).")

    def grpc_options(self, url: TritonUrl) -> Dict[str, Any]:
        """Keyword arguments of ``tritonclient.grpc[.aio].InferenceServerClient`` for TLS."""
        if not url.tls:
            return {}
        return {
            "ssl": True,
            "root_certificates": None if self.root_certificates is None else str(self.root_certificates),
            "private_key": None if self.private_key is None else str(self.private_key),
            "certificate_chain": None if self.certificate_chain is None else str(self.certificate_chain),
        }

    def apply(self, client: Any, url: TritonUrl) -> Any:
        """Make ``client`` send the access token on every call; returns ``client``."""
        if self.access_token is not None:
            plugin = _header_plugin_class(url.protocol)
            client.register_plugin(plugin(create_auth_headers(self.access_token, url.protocol)))
        return client

    def as_kwargs(self) -> Dict[str, Any]:
        """The client keyword arguments that recreate these settings."""
        return dataclasses.asdict(self)
