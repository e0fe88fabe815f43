"""``Settings``: the one resolved, frozen configuration a ``Triton`` instance runs with.

``TritonConfig`` is what the user writes: every field optional, ``None`` meaning "the default", and
mutable like NVIDIA PyTriton's. ``Triton()`` resolves it once, here, into :class:`Settings`: the
explicit config over ``PYTRITON_TRITON_CONFIG_*`` variables over pytriton's defaults, with each
derived value (endpoints, exit timeout, drain delay, recycling thresholds, request-size limit,
metrics switch, polling windows) computed in one place. Nothing later re-reads the environment or
the user's object, so changing either after construction has no effect, and every consumer sees the
same values. Tested in tests/unit/test_settings.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple

from pytriton.proxy._binding import PollingWindows
from pytriton.server.command import effective_options
from pytriton.server.triton_config import DEFAULT_MAX_REQUEST_BYTES, TritonConfig

# How long stop() and unbinding wait for batches in flight when TritonConfig.exit_timeout_secs is
# None (tritonserver's own default for --exit-timeout-secs).
EXIT_TIMEOUT_S = 30
# Python-backend regions that grew past this are given back once their model is idle (_recycle.py).
RECYCLE_BYTE_SIZE = 16 << 20
RECYCLE_IDLE_S = 10.0
# tritonserver's private memory (RLIMIT_DATA) is capped at what it uses once its models are loaded
# plus this much plus twice the request-size limit (TritonServerProcess.cap_memory): Triton 2.51
# allocates (and zero-fills) the bytes a JSON request *declares* before anything checks them, so an
# 80-byte request declaring [1, 2**33] UINT8 made it allocate 8 GiB. A legitimate request may be
# held twice (the body and a copy), hence the factor; the base covers Triton's own growth (threads
# of models loaded later: about 32 threads with 8 MiB stacks per model). Shared memory (the Python
# backend's regions, pytriton's arenas) does not count against the cap.
SERVER_DATA_HEADROOM_BYTES = 1 << 30
# Wildcard bind addresses: a client on this machine reaches them on loopback.
_WILDCARDS = ("0.0.0.0", "", "::")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One of the server's endpoints (HTTP, gRPC, metrics) as launched."""

    enabled: bool
    address: str  # what the server binds
    port: int

    @property
    def client_host(self) -> str:
        """Where a client on this machine connects (loopback for a wildcard address)."""
        return "127.0.0.1" if self.address in _WILDCARDS else self.address


@dataclasses.dataclass(frozen=True)
class Settings:
    """The resolved configuration of one ``Triton`` instance; build it with :func:`resolve`.

    ``config`` is a private merged copy used for the server's command line; read it, never change it
    (it is not handed to user code).
    """

    config: TritonConfig
    http: Endpoint
    grpc: Endpoint
    metrics: Endpoint
    exit_timeout_s: float  # stop() and unbind wait this long for batches in flight
    drain_delay_s: float  # stop(): keep serving this long after readiness turned false
    recycle_byte_size: int  # 0: never recycle grown Python-backend regions
    recycle_idle_s: float
    max_request_bytes: int  # 0: no limit
    server_data_headroom: int  # private memory tritonserver may add to its loaded state; 0: no cap
    callable_metrics: bool  # the stubs export pytriton_* metrics (docs/metrics.md)
    polling: PollingWindows  # PYTRITON_PROXY_SPIN_US / PYTRITON_WORKER_SPIN_US

    @property
    def endpoints(self) -> Tuple[Tuple[str, Endpoint], ...]:
        """``(label, endpoint)`` for HTTP, gRPC and metrics, in that order."""
        return (("http", self.http), ("grpc", self.grpc), ("metrics", self.metrics))


def merge(config: Optional[TritonConfig], environ: Optional[Mapping[str, str]] = None) -> TritonConfig:
    """Explicit config over ``PYTRITON_TRITON_CONFIG_*`` variables (of ``environ``, default ``os.environ``)."""
    merged = {key: value for key, value in TritonConfig.from_env(environ).to_dict().items() if value is not None}
    if config is not None:
        merged.update({key: value for key, value in config.to_dict().items() if value is not None})
    return TritonConfig(**merged)


def resolve(
    config: Optional[TritonConfig],
    polling: Optional[PollingWindows] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Settings:
    """Resolve ``config`` (and the environment) into :class:`Settings`.

    Raises:
        PyTritonValidationError: a ``PYTRITON_TRITON_CONFIG_*`` value or a polling window is invalid.
    """
    merged = merge(config, environ)
    options: Dict[str, Any] = effective_options(merged)

    def endpoint(label: str) -> Endpoint:
        return Endpoint(
            enabled=options.get(f"allow_{label}", True) is not False,
            address=str(options[f"{label}_address"]),
            port=int(options[f"{label}_port"]),
        )

    recycle_bytes, recycle_idle = (
        merged.python_backend_shm_recycle_byte_size,
        merged.python_backend_shm_recycle_idle_secs,
    )
    max_request = DEFAULT_MAX_REQUEST_BYTES if merged.max_request_bytes is None else merged.max_request_bytes
    return Settings(
        config=merged,
        http=endpoint("http"),
        grpc=endpoint("grpc"),
        metrics=endpoint("metrics"),
        exit_timeout_s=float(EXIT_TIMEOUT_S if merged.exit_timeout_secs is None else merged.exit_timeout_secs),
        drain_delay_s=float(merged.drain_delay_secs or 0),
        recycle_byte_size=RECYCLE_BYTE_SIZE if recycle_bytes is None else max(0, recycle_bytes),
        recycle_idle_s=RECYCLE_IDLE_S if recycle_idle is None else max(1.0, float(recycle_idle)),
        max_request_bytes=max_request,
        server_data_headroom=SERVER_DATA_HEADROOM_BYTES + 2 * max_request if max_request else 0,
        callable_metrics=merged.callable_metrics is not False and merged.allow_metrics is not False,
        polling=polling if polling is not None else PollingWindows.from_env(environ),
    )
