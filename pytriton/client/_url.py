"""Parsing of server URLs: ``grpc://host:port``, ``grpcs://`` (gRPC over TLS), ``http://host:port``, ``host[:port]``.

Unit tests: tests/unit/test_client_url.py, tests/unit/test_client_core.py.
"""

from __future__ import annotations

import dataclasses
import re

from pytriton.client.exceptions import PyTritonClientInvalidUrlError

DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "grpcs": 8001}
_URL = re.compile(
    r"^(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^:/\s\[\]]+)(?::(?P<port>\d+))?/?$"
)


@dataclasses.dataclass(frozen=True)
class TritonUrl:
    """A parsed server address."""

    scheme: str
    host: str
    port: int

    @property
    def protocol(self) -> str:
        """``"grpc"`` (also for ``grpcs``) or ``"http"``: which tritonclient module speaks to it."""
        return "grpc" if self.scheme in ("grpc", "grpcs") else "http"

    @property
    def tls(self) -> bool:
        """True for ``grpcs://`` (gRPC over TLS)."""
        return self.scheme == "grpcs"

    @property
    def address(self) -> str:
        """``host:port`` as tritonclient expects it (also ``without_scheme``)."""
        return f"{self.host}:{self.port}"

    without_scheme = address  # NVIDIA PyTriton's name for it

    @property
    def hostname(self) -> str:
        """The host part (same as ``host``)."""
        return self.host

    @property
    def with_scheme(self) -> str:
        """``scheme://host:port`` (also ``str(url)``)."""
        return f"{self.scheme}://{self.address}"

    @classmethod
    def from_url(cls, url: str) -> TritonUrl:
        """Parse ``url`` (see :func:`parse_url`); ``PyTritonClientInvalidUrlError`` when it is unusable."""
        return parse_url(url)

    def __str__(self) -> str:
        return self.with_scheme


def parse_url(url: str) -> TritonUrl:
    """Parse ``url``; no scheme means HTTP, no port means the scheme's default (8000 / 8001 / 8001)."""
    if not isinstance(url, str):
        raise PyTritonClientInvalidUrlError(f"The server URL must be a string, got {type(url).__name__}.")
    match = _URL.match(url.strip())
    if match is None:
        raise PyTritonClientInvalidUrlError(
            f"Invalid server URL {url!r}: expected [http://|grpc://|grpcs://]host[:port], e.g. grpc://localhost:8001."
        )
    scheme = (match.group("scheme") or "http").lower()
    if scheme not in DEFAULT_PORTS:
        raise PyTritonClientInvalidUrlError(
            f"Invalid server URL {url!r}: scheme must be http, grpc or grpcs, not {scheme!r}."
        )
    port = int(match.group("port")) if match.group("port") else DEFAULT_PORTS[scheme]
    if not 0 < port < 65536:
        raise PyTritonClientInvalidUrlError(f"Invalid server URL {url!r}: port {port} is out of range.")
    return TritonUrl(scheme=scheme, host=match.group("host"), port=port)
