"""Turn a :class:`TritonConfig` into the ``tritonserver`` command line.

Every value becomes one ``--flag=value`` argv element (no shell is involved, so values with spaces
or quotes pass through unchanged). List fields repeat their flag. Booleans are written as
``true``/``false``.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Dict, List, Optional

from pytriton.server.security import AccessPolicy
from pytriton.server.triton_config import TritonConfig

# Fields that are not tritonserver flags, or need special handling.
_NOT_FLAGS = frozenset(
    {
        "tritonserver_dir",
        "python_backend_shm_default_byte_size",
        "python_backend_shm_growth_byte_size",
        "python_backend_shm_recycle_byte_size",
        "python_backend_shm_recycle_idle_secs",
        "server_malloc_arena_max",
        "server_allocator",
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


def _flag_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, pathlib.Path):
        return value.as_posix()
    return str(value)


def effective_options(config: TritonConfig) -> Dict[str, Any]:
    """The config's values with pytriton's defaults applied (all-interfaces addresses, default ports)."""
    options = {key: value for key, value in config.to_dict().items() if value is not None}
    for address in ("http_address", "grpc_address", "metrics_address"):
        options.setdefault(address, DEFAULT_ADDRESS)
    for port, default in DEFAULT_PORTS.items():
        options.setdefault(port, default)
    return options


def build_command(binary: pathlib.Path, config: TritonConfig, launch: LaunchSettings) -> List[str]:
    """The full argv to start ``binary`` with ``config``."""
    options = effective_options(config)
    argv: List[str] = [binary.as_posix()]
    options.setdefault("model_repository", launch.model_repository)
    options.setdefault("strict_readiness", True)
    options.setdefault("exit_on_error", True)
    # Triton keeps this many gRPC request/response objects for reuse (8 by default), and each keeps
    # the buffers of the largest tensors it ever carried: one 256 MiB request left the server 570 MiB
    # larger for good, and mixed sizes grew it by 265 MiB in 4000 requests. Without the pool, those
    # figures were 127 MiB and 68 MiB, at no measurable cost (docs/architecture.md, "Memory").
    options.setdefault("grpc_infer_allocation_pool_size", 0)
    if config.log_verbose is None:
        options["log_verbose"] = 0
    for name, value in options.items():
        if name in _NOT_FLAGS:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, list):
            argv.extend(f"{flag}={_flag_value(item)}" for item in value)
        else:
            argv.append(f"{flag}={_flag_value(value)}")
    argv.append(f"--backend-directory={launch.backend_directory.as_posix()}")
    if config.cache_directory is None and launch.cache_directory is not None:
        argv.append(f"--cache-directory={launch.cache_directory.as_posix()}")
    if config.disable_auto_complete_config is not False:
        # pytriton sends complete configs; auto-completion would start one extra stub per model load.
        argv.append("--disable-auto-complete-config")
    argv.append("--model-control-mode=explicit")
    access = launch.access if launch.access is not None else AccessPolicy(config)
    argv.extend(access.flags())
    argv.extend(f"--load-model={name}" for name in launch.startup_models)
    backend_options = {
        "shm-region-prefix-name": launch.shm_region_prefix,
        "shm-default-byte-size": config.python_backend_shm_default_byte_size or 4 * 1024 * 1024,
        "shm-growth-byte-size": config.python_backend_shm_growth_byte_size or 16 * 1024 * 1024,
    }
    argv.extend(f"--backend-config=python,{key}={value}" for key, value in backend_options.items())
    return argv
