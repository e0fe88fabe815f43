"""What the launch of a ``tritonserver`` starts from: pytriton's own decisions and the config's defaults.

:class:`LaunchSettings` is what pytriton decides (repository, directories, region prefix, start-up
models, access policy); :func:`effective_options` applies pytriton's defaults (addresses, ports) to
a config. Both go into the typed launch plan (pytriton/_serving/plan.py: ``LaunchPlan``), which renders the
argv and the in-process options.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Dict, List, Optional

from pytriton.server.security import AccessPolicy
from pytriton.server.triton_config import TritonConfig

# Fields that are not tritonserver flags, or need special handling.
NOT_FLAGS = frozenset(
    {
        "tritonserver_dir",
        "python_backend_shm_default_byte_size",
        "python_backend_shm_growth_byte_size",
        "python_backend_shm_recycle_byte_size",
        "python_backend_shm_recycle_idle_secs",
        "server_malloc_arena_max",
        "server_allocator",
        "hardening",  # how the server is launched (_platform/launch.py), not a flag
        "disable_auto_complete_config",
        # Merged with the security config by AccessPolicy (security.py), which writes the flags.
        "http_restricted_api",
        "grpc_restricted_protocol",
        "max_request_bytes",
        # Triton.stop()'s drain (server/_drain.py), which also sets the server's own exit timeout.
        "drain_delay_secs",
        "callable_metrics",
    }
)
# Every interface, as Triton and NVIDIA PyTriton default to. Only inference, health, metadata and
# model configs are open by default; the management endpoints need the access token
# (security.py), so nothing that loads code or unloads models is reachable without it.
DEFAULT_ADDRESS = "0.0.0.0"
DEFAULT_PORTS = {"http_port": 8000, "grpc_port": 8001, "metrics_port": 8002}


@dataclasses.dataclass(frozen=True)
class LaunchSettings:
    """What pytriton itself decides about the launch (not user configuration)."""

    model_repository: pathlib.Path
    backend_directory: pathlib.Path
    cache_directory: Optional[pathlib.Path]
    shm_region_prefix: str
    startup_models: List[str] = dataclasses.field(default_factory=list)
    # Restricted endpoints; None: only what the config itself restricts (no security config).
    access: Optional[AccessPolicy] = None
    # The server's version (ServerDistribution.version), for the flags only some versions have
    # (server/versions.py gates); None: none of them.
    triton_version: Optional[str] = None


def effective_options(config: TritonConfig) -> Dict[str, Any]:
    """The config's values with pytriton's defaults applied (all-interfaces addresses, default ports)."""
    options = {key: value for key, value in config.to_dict().items() if value is not None}
    for address in ("http_address", "grpc_address", "metrics_address"):
        options.setdefault(address, DEFAULT_ADDRESS)
    for port, default in DEFAULT_PORTS.items():
        options.setdefault(port, default)
    return options
