"""Access control for the server's administrative endpoints: ``TritonSecurityConfig``.

Triton can require a header on chosen groups of endpoints (``--http-restricted-api`` and
``--grpc-restricted-protocol``, format ``<api>[,<api>...]:<header>=<value>``; a flag may repeat, but
each API may appear in one group only). pytriton turns that on by default: the endpoints that change
the server or reveal more than a client needs (``DEFAULT_PROTECTED_ENDPOINTS``) require the header
``triton-access-token`` (gRPC: metadata ``triton-grpc-protocol-triton-access-token``) holding a token
generated per :class:`~pytriton.triton.Triton` (or given by the user). Inference, health, metadata
and model-config stay open, so any client can serve requests and read the model config.

:class:`AccessPolicy` merges that with restrictions the user wrote in ``TritonConfig`` themselves
(the user's group keeps its own header for the APIs it names; the security config covers the rest)
and answers two questions: which flags start the server, and which header an internal call to a
given API must send.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import secrets
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Tuple

from pytriton.exceptions import PyTritonValidationError
from pytriton.server.triton_config import TritonConfig

LOGGER = logging.getLogger(__name__)

TRITON_ACCESS_HEADER = "triton-access-token"
"""Name of the HTTP header (and, with :data:`GRPC_HEADER_PREFIX`, of the gRPC metadata) carrying the token."""

GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
"""Triton expects a restricted gRPC protocol's header key with this prefix in the call's metadata."""

VALID_TRITON_ENDPOINTS: FrozenSet[str] = frozenset(
    {
        "health",
        "metadata",
        "inference",
        "shared-memory",
        "model-config",
        "model-repository",
        "statistics",
        "trace",
        "logging",
    }
)
"""Endpoint groups Triton 2.51 can restrict (the same names for HTTP and gRPC)."""

DEFAULT_PROTECTED_ENDPOINTS: List[str] = ["shared-memory", "model-repository", "statistics", "trace", "logging"]
"""What needs the token unless told otherwise: everything that loads code, changes the server or
exposes other clients' traffic. Copied on use; changing this list changes nothing."""

# Visible ASCII: survives an HTTP header and gRPC metadata unchanged and needs no quoting in argv.
_TOKEN = re.compile(r"^[\x21-\x7e]+$")
_HEADER_KEY = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


def _validate_endpoints(endpoints: Iterable[Any], where: str) -> List[str]:
    if isinstance(endpoints, (str, bytes)) or not isinstance(endpoints, Iterable):
        raise PyTritonValidationError(
            f"{where} must be a list of endpoint names such as {DEFAULT_PROTECTED_ENDPOINTS}, got {endpoints!r}."
        )
    names = list(endpoints)
    invalid = sorted({str(name) for name in names if name not in VALID_TRITON_ENDPOINTS})
    if invalid:
        raise PyTritonValidationError(
            f"Invalid endpoint names in {where}: {', '.join(invalid)}. "
            f"Valid endpoints are: {', '.join(sorted(VALID_TRITON_ENDPOINTS))}."
        )
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise PyTritonValidationError(f"{where} names {', '.join(duplicates)} more than once.")
    return names


@dataclasses.dataclass
class TritonSecurityConfig:
    """Which endpoints need an access token, and the token.

    Args:
        access_token: the token clients send (visible ASCII, no spaces). ``None`` generates a random
            one (``secrets.token_urlsafe(32)``, 256 bits) when any endpoint is restricted.
        restricted_endpoints: endpoint groups that need the token (names in
            :data:`VALID_TRITON_ENDPOINTS`). ``None`` means :data:`DEFAULT_PROTECTED_ENDPOINTS`;
            an empty list turns restriction off (then no token is generated).

    The token is left out of ``repr()`` so that logging a config does not leak it.
    """

    access_token: Optional[str] = dataclasses.field(default=None, repr=False)
    restricted_endpoints: Optional[List[str]] = None

    def __post_init__(self) -> None:
        if self.restricted_endpoints is None:
            self.restricted_endpoints = list(DEFAULT_PROTECTED_ENDPOINTS)
        else:
            self.restricted_endpoints = _validate_endpoints(
                self.restricted_endpoints, "TritonSecurityConfig.restricted_endpoints"
            )
        if self.access_token is not None:
            if not isinstance(self.access_token, str) or not _TOKEN.match(self.access_token):
                raise PyTritonValidationError(
                    "TritonSecurityConfig.access_token must be a non-empty string of visible ASCII characters "
                    "without spaces (it travels as an HTTP header and gRPC metadata); e.g. secrets.token_urlsafe(32)."
                )
        elif self.restricted_endpoints:
            self.access_token = secrets.token_urlsafe(32)

    @classmethod
    def _validate_endpoint_names(cls, endpoints: Iterable[str]) -> None:
        """Raise ``PyTritonValidationError`` unless every name is a Triton endpoint group."""
        _validate_endpoints(endpoints, "restricted_endpoints")


@dataclasses.dataclass(frozen=True)
class Restriction:
    """One ``<apis>:<key>=<value>`` group of Triton's restriction flags."""

    apis: Tuple[str, ...]
    key: str
    value: str = dataclasses.field(repr=False)

    def flag_value(self) -> str:
        """The flag's value as Triton parses it."""
        return f"{','.join(self.apis)}:{self.key}={self.value}"


def parse_restriction(text: str, field: str) -> Restriction:
    """Parse a user's ``TritonConfig`` restriction value; ``PyTritonValidationError`` names the problem."""
    apis_text, colon, setting = text.partition(":")
    key, equals, value = setting.partition("=")
    example = f"TritonConfig({field}='model-repository,statistics:my-header=my-secret')"
    if not colon or not equals or not key or not value:
        raise PyTritonValidationError(
            f"TritonConfig.{field}={text!r} is not '<apis>:<header>=<value>', e.g. {example}."
        )
    apis = _validate_endpoints([api.strip() for api in apis_text.split(",")], f"TritonConfig.{field}")
    if not _HEADER_KEY.match(key):
        raise PyTritonValidationError(f"TritonConfig.{field}: {key!r} is not a valid header name.")
    if not _TOKEN.match(value):
        raise PyTritonValidationError(
            f"TritonConfig.{field}: the header value must be visible ASCII characters without spaces."
        )
    return Restriction(apis=tuple(apis), key=key, value=value)


class AccessPolicy:
    """The restriction groups of one server, per protocol, and the headers that pass them.

    Built from the user's ``TritonConfig`` (``http_restricted_api`` / ``grpc_restricted_protocol``,
    kept as written) and a :class:`TritonSecurityConfig` (its endpoints minus those the user's group
    already names, with ``triton-access-token``). ``security=None`` means no security config: only
    the user's own groups apply.
    """

    def __init__(self, config: TritonConfig, security: Optional[TritonSecurityConfig] = None):
        self.http = self._groups(config.http_restricted_api, "http_restricted_api", security)
        self.grpc = self._groups(config.grpc_restricted_protocol, "grpc_restricted_protocol", security)

    @staticmethod
    def _groups(user_value: Optional[str], field: str, security: Optional[TritonSecurityConfig]) -> List[Restriction]:
        groups = [parse_restriction(user_value, field)] if user_value else []
        if security is not None and security.restricted_endpoints:
            assert security.access_token is not None  # generated in __post_init__
            taken = {api for group in groups for api in group.apis}
            rest = tuple(api for api in security.restricted_endpoints if api not in taken)
            if taken and set(security.restricted_endpoints) & taken:
                LOGGER.info(
                    "TritonConfig.%s restricts %s with its own header; the access token covers %s.",
                    field,
                    ", ".join(sorted(taken)),
                    ", ".join(rest) or "nothing else",
                )
            if rest:
                groups.append(Restriction(apis=rest, key=TRITON_ACCESS_HEADER, value=security.access_token))
        return groups

    def flags(self) -> List[str]:
        """``tritonserver`` argv elements for every group (none when nothing is restricted)."""
        return [f"--http-restricted-api={group.flag_value()}" for group in self.http] + [
            f"--grpc-restricted-protocol={group.flag_value()}" for group in self.grpc
        ]

    def http_headers(self, api: str) -> Dict[str, str]:
        """Headers an HTTP call to endpoint group ``api`` must carry (empty if it is open)."""
        for group in self.http:
            if api in group.apis:
                return {group.key: group.value}
        return {}

    def grpc_headers(self, api: str) -> Dict[str, str]:
        """Metadata a gRPC call to endpoint group ``api`` must carry (empty if it is open)."""
        for group in self.grpc:
            if api in group.apis:
                return {GRPC_HEADER_PREFIX + group.key.lower(): group.value}
        return {}

    def restricted(self, protocol: str) -> List[str]:
        """Every restricted endpoint group of ``protocol`` (``"http"`` or ``"grpc"``)."""
        groups = self.http if protocol == "http" else self.grpc
        return [api for group in groups for api in group.apis]
