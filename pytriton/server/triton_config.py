"""``TritonConfig``: the user-facing settings of the ``tritonserver`` process.

Every field is optional; ``None`` means "use the server's (or pytriton's) default". The same
fields can be set through ``PYTRITON_TRITON_CONFIG_<FIELD>`` environment variables
(see :meth:`TritonConfig.from_env`). Turning a config into command-line flags lives in
:mod:`pytriton.server.command`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
import typing
from typing import Any, Dict, List, Mapping, Optional

from pytriton._platform import hardening as _hardening
from pytriton.exceptions import PyTritonValidationError

LOGGER = logging.getLogger(__name__)

ENV_PREFIX = "PYTRITON_TRITON_CONFIG_"

# The default request-size limit: gRPC cannot carry a larger message at all (tritonclient and
# Triton cap it at 2 GiB), so the default only bounds HTTP to the same size and keeps the two
# protocols alike, while the documented 1 GiB tensors still pass.
DEFAULT_MAX_REQUEST_BYTES = 2 * 1024**3

_TRUE_WORDS = frozenset({"1", "true", "yes", "on", "y", "t"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off", "n", "f"})


@dataclasses.dataclass(frozen=False)
class TritonConfig:
    """Settings of the Triton Inference Server started by :class:`pytriton.triton.Triton`.

    All arguments are keyword-only and optional. ``None`` keeps the default, which for addresses
    is ``0.0.0.0`` (every interface, as in Triton and NVIDIA PyTriton; the management endpoints
    need an access token, see :class:`~pytriton.server.security.TritonSecurityConfig`) and for
    everything else is Triton's own default. Set ``"127.0.0.1"`` to serve this machine only.

    Fields beyond Triton's command line:

    * ``tritonserver_dir``: use the server installed in this directory (also
      ``PYTRITON_TRITONSERVER_DIR``) instead of searching for one.
    * ``python_backend_shm_default_byte_size`` / ``python_backend_shm_growth_byte_size``: size of the
      shared-memory region Triton's Python backend gives each model instance, and its growth step.
    * ``python_backend_shm_recycle_byte_size`` / ``python_backend_shm_recycle_idle_secs``: once
      such a region has grown past the byte size (default 16 MiB; 0 turns this off) and its model
      has been idle for the seconds given (default 10), the model's instances are reloaded so
      that the memory is given back (the region never shrinks otherwise).
    * ``server_malloc_arena_max``: ``MALLOC_ARENA_MAX`` for ``tritonserver`` and its stubs (default
      1, so memory freed after large requests goes back to the system; 0 keeps glibc's default).
    * ``server_allocator``: the ``malloc`` preloaded (``LD_PRELOAD``) into ``tritonserver`` and its
      stubs: ``"auto"`` (default: jemalloc when installed, else glibc's with a warning naming the
      package), ``"jemalloc"``, ``"tcmalloc"``, ``"glibc"`` or a library's absolute path. See
      docs/soak.md, "Server memory and the allocator".
    * ``hardening``: ``"auto"`` (default), ``"strict"`` or ``"off"``: which of pytriton's protections
      the server is started with (also ``PYTRITON_HARDENING``; this field wins). See docs/security.md,
      "Hardening modes".
    * ``disable_auto_complete_config``: pytriton sends complete model configs, so Triton's config
      auto-completion (one extra stub start per model load) is off unless this is set to ``False``.
    * ``max_request_bytes``: the largest request (the sum of its input tensors' bytes, strings
      counted as Triton serialises them) that is forwarded to a bound callable; a larger one gets
      an error response naming the limit. ``None``: 2 GiB (``DEFAULT_MAX_REQUEST_BYTES``);
      ``0``: no limit. See docs/configuration.md, "Request size".
    * ``drain_delay_secs``: how long :meth:`Triton.stop` keeps serving after readiness turned false
      and before it refuses new requests (default 0); ``exit_timeout_secs`` then bounds the wait
      for requests in flight. See docs/architecture.md, "Graceful drain".
    * ``callable_metrics``: the bound callables' metrics (``pytriton_*``: duration, batch size,
      errors, requests in flight) on Triton's ``/metrics`` endpoint, next to Triton's own. ``None``:
      on (off when ``allow_metrics`` is ``False``); ``False``: off. See docs/metrics.md.
    """

    id: Optional[str] = None
    model_repository: Optional[pathlib.Path] = None
    log_verbose: Optional[int] = None
    log_file: Optional[pathlib.Path] = None
    log_format: Optional[str] = None
    exit_timeout_secs: Optional[int] = None
    drain_delay_secs: Optional[int] = None
    exit_on_error: Optional[bool] = None
    strict_readiness: Optional[bool] = None
    allow_http: Optional[bool] = None
    http_address: Optional[str] = None
    http_port: Optional[int] = None
    http_header_forward_pattern: Optional[str] = None
    http_thread_count: Optional[int] = None
    http_restricted_api: Optional[str] = None
    allow_grpc: Optional[bool] = None
    grpc_address: Optional[str] = None
    grpc_port: Optional[int] = None
    grpc_header_forward_pattern: Optional[str] = None
    grpc_infer_allocation_pool_size: Optional[int] = None
    grpc_use_ssl: Optional[bool] = None
    grpc_use_ssl_mutual: Optional[bool] = None
    grpc_server_cert: Optional[pathlib.Path] = None
    grpc_server_key: Optional[pathlib.Path] = None
    grpc_root_cert: Optional[pathlib.Path] = None
    grpc_infer_response_compression_level: Optional[str] = None
    grpc_keepalive_time: Optional[int] = None
    grpc_keepalive_timeout: Optional[int] = None
    grpc_keepalive_permit_without_calls: Optional[bool] = None
    grpc_http2_max_pings_without_data: Optional[int] = None
    grpc_http2_min_recv_ping_interval_without_data: Optional[int] = None
    grpc_http2_max_ping_strikes: Optional[int] = None
    grpc_restricted_protocol: Optional[str] = None
    allow_metrics: Optional[bool] = None
    allow_gpu_metrics: Optional[bool] = None
    allow_cpu_metrics: Optional[bool] = None
    metrics_interval_ms: Optional[int] = None
    metrics_port: Optional[int] = None
    metrics_address: Optional[str] = None
    allow_sagemaker: Optional[bool] = None
    sagemaker_port: Optional[int] = None
    sagemaker_safe_port_range: Optional[str] = None
    sagemaker_thread_count: Optional[int] = None
    allow_vertex_ai: Optional[bool] = None
    vertex_ai_port: Optional[int] = None
    vertex_ai_thread_count: Optional[int] = None
    vertex_ai_default_model: Optional[str] = None
    metrics_config: Optional[List[str]] = None
    trace_config: Optional[List[str]] = None
    cache_config: Optional[List[str]] = None
    cache_directory: Optional[str] = None
    buffer_manager_thread_count: Optional[int] = None
    pinned_memory_pool_byte_size: Optional[int] = None
    disable_auto_complete_config: Optional[bool] = None
    python_backend_shm_default_byte_size: Optional[int] = None
    python_backend_shm_growth_byte_size: Optional[int] = None
    python_backend_shm_recycle_byte_size: Optional[int] = None
    python_backend_shm_recycle_idle_secs: Optional[int] = None
    server_malloc_arena_max: Optional[int] = None
    server_allocator: Optional[str] = None
    hardening: Optional[str] = None
    max_request_bytes: Optional[int] = None
    callable_metrics: Optional[bool] = None
    tritonserver_dir: Optional[pathlib.Path] = None

    def __post_init__(self) -> None:
        """Normalise and validate values so that a bad config fails here, not in the server."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            kind = _field_kind(field.name)
            try:
                setattr(self, field.name, _coerce(kind, value))
            except (TypeError, ValueError) as exc:
                raise PyTritonValidationError(f"TritonConfig.{field.name}={value!r} is invalid: {exc}") from None
        if self.hardening is not None:
            self.hardening = _hardening.parse(self.hardening, "TritonConfig.hardening")
        if self.allow_http is False and self.allow_grpc is False:
            raise PyTritonValidationError(
                "TritonConfig allows neither HTTP nor gRPC; enable at least one of "
                "allow_http and allow_grpc (clients and pytriton itself need an endpoint)."
            )
        if self.grpc_use_ssl and self.allow_http is False:
            raise PyTritonValidationError(
                "TritonConfig(grpc_use_ssl=True) needs allow_http: pytriton checks readiness and loads models "
                "over the HTTP endpoint when gRPC accepts TLS clients only."
            )
        if self.max_request_bytes is not None and self.max_request_bytes < 0:
            raise PyTritonValidationError(
                f"TritonConfig.max_request_bytes={self.max_request_bytes} is negative; give a byte count (0: no limit)."
            )
        for seconds_field in ("exit_timeout_secs", "drain_delay_secs"):
            seconds = getattr(self, seconds_field)
            if seconds is not None and seconds < 0:
                raise PyTritonValidationError(
                    f"TritonConfig.{seconds_field}={seconds} is negative; give seconds (>= 0)."
                )
        for port_field in ("http_port", "grpc_port", "metrics_port", "sagemaker_port", "vertex_ai_port"):
            port = getattr(self, port_field)
            if port is not None and not 0 <= port <= 65535:
                raise PyTritonValidationError(f"TritonConfig.{port_field}={port} is not a TCP port (0-65535).")

    def to_dict(self) -> Dict[str, Any]:
        """All fields as a plain dict (``None`` for fields left at their default)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> TritonConfig:
        """Build a config from a mapping.

        Unknown keys are ignored with a warning on the ``pytriton.triton`` logger, as NVIDIA
        PyTriton does (a typo therefore shows in the log, not as an error); known keys are
        validated as by the constructor.
        """
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(config) - known, key=str)
        for name in unknown:
            LOGGER.warning(
                "Ignoring TritonConfig.from_dict key %r: TritonConfig has no such field (known fields: %s).",
                name,
                ", ".join(sorted(known)),
            )
        return cls(**{name: value for name, value in config.items() if name in known})

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> TritonConfig:
        """Build a config from ``PYTRITON_TRITON_CONFIG_<FIELD>`` variables.

        Booleans accept true/false, 1/0, yes/no, on/off (any case). List fields are given as
        ``<FIELD>_0``, ``<FIELD>_1``, ... (or a single ``<FIELD>`` value). Unknown names are
        logged as warnings and ignored; values that do not parse raise
        ``PyTritonValidationError`` naming the variable.
        """
        environ = os.environ if environ is None else environ
        fields = {field.name for field in dataclasses.fields(cls)}
        values: Dict[str, Any] = {}
        list_items: Dict[str, Dict[int, str]] = {}
        for env_name, raw in environ.items():
            if not env_name.startswith(ENV_PREFIX):
                continue
            name = env_name[len(ENV_PREFIX) :].lower()
            if name in fields:
                kind = _field_kind(name)
                try:
                    values[name] = [raw] if kind == "list" else _coerce(kind, raw)
                except ValueError as exc:
                    raise PyTritonValidationError(f"{env_name}={raw!r} is invalid: {exc}") from None
                continue
            base, _, index = name.rpartition("_")
            if base in fields and _field_kind(base) == "list" and index.isdigit():
                list_items.setdefault(base, {})[int(index)] = raw
                continue
            LOGGER.warning("Ignoring environment variable %s: TritonConfig has no field %r.", env_name, name)
        for name, items in list_items.items():
            values[name] = [items[index] for index in sorted(items)]
        return cls(**values)


def _field_kind(name: str) -> str:
    hint = _TYPE_HINTS[name]
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    inner = args[0] if args else hint
    if typing.get_origin(inner) in (list, List):
        return "list"
    if inner is bool:
        return "bool"
    if inner is int:
        return "int"
    if inner is pathlib.Path:
        return "path"
    return "str"


def parse_bool(value: object) -> bool:
    """Parse a boolean written as bool, 0/1 or a word (true/false, yes/no, on/off)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise ValueError(f"expected a boolean (true/false, 1/0, yes/no, on/off), got {value!r}")


def _coerce(kind: str, value: Any) -> object:
    if kind == "bool":
        return parse_bool(value)
    if kind == "int":
        if isinstance(value, bool):
            raise ValueError(f"expected an integer, got {value!r}")
        if isinstance(value, str):
            value = value.strip()
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"expected an integer, got {value!r}") from None
    if kind == "path":
        return pathlib.Path(value)
    if kind == "list":
        if isinstance(value, str):
            return [value]
        return [str(item) for item in value]
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


_TYPE_HINTS = typing.get_type_hints(TritonConfig)


def _keyword_only_init(cls: Any) -> None:
    """Reject positional arguments (``dataclass(kw_only=True)`` needs Python 3.10)."""
    generated = cls.__init__

    @functools.wraps(generated)
    def __init__(self: object, *args: object, **kwargs: object) -> None:
        if args:
            raise TypeError(f"{cls.__name__} takes keyword arguments only, e.g. {cls.__name__}(http_port=8000)")
        generated(self, **kwargs)

    cls.__init__ = __init__


_keyword_only_init(TritonConfig)
