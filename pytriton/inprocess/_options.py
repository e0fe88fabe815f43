"""``Options``: the in-process server's options, and how they are applied to Triton's options object.

Defaults point at the installed server (backends, caches, repository agents) when there is one, else
at the NGC container's layout. GPU metrics are turned on only where NVIDIA's management library
answers (:func:`nvml_available`), since DCGM prints an NVML error on machines without a driver.

Unit test: tests/unit/test_inprocess.py.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import pathlib
from typing import Any, Dict, List, Optional, Union

from pytriton.inprocess import _lib
from pytriton.inprocess._enums import InstanceGroupKind, LogFormat, ModelControlMode, RateLimitMode
from pytriton.inprocess._errors import InvalidArgumentError


def _install_root() -> Optional[pathlib.Path]:
    try:
        from pytriton.server.distribution import find_server

        return find_server().root
    except Exception:  # noqa: BLE001  (no install: fall back to the NGC container layout)
        return None


def _default_backend_directory() -> str:
    try:
        from pytriton.server.distribution import find_server

        return str(find_server().backend_dir)
    except Exception:  # noqa: BLE001
        return "/opt/tritonserver/backends"


def _default_cache_directory() -> str:
    root = _install_root()
    return str(root / "caches") if root is not None else "/opt/tritonserver/caches"


def _default_repo_agent_directory() -> str:
    root = _install_root()
    return str(root / "repoagents") if root is not None else "/opt/tritonserver/repoagents"


@dataclasses.dataclass
class RateLimiterResource:
    """A rate limiter resource count (``device`` -1 for a global resource)."""

    name: str
    count: int
    device: int


@dataclasses.dataclass
class ModelLoadDeviceLimit:
    """Fraction of a device's memory model loading may use."""

    kind: InstanceGroupKind
    device: int
    fraction: float


_NVML: List[bool] = []  # nvml_available()'s answer, once found


def nvml_available() -> bool:
    """Whether NVIDIA's management library loads and initialises here (a driver and a GPU answer).

    Checked once per process; loading the library on a machine with a GPU is what DCGM does anyway.
    """
    if not _NVML:
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            found = nvml.nvmlInit_v2() == 0  # NVML_SUCCESS
            if found:
                nvml.nvmlShutdown()
        except (OSError, AttributeError):
            found = False
        _NVML.append(found)
    return _NVML[0]


@dataclasses.dataclass
class Options:
    """Server options; defaults point at the installed server (backends, caches) when there is one."""

    model_repository: Union[str, List[str]] = dataclasses.field(default_factory=list)
    server_id: str = "triton"
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    startup_models: List[str] = dataclasses.field(default_factory=list)
    strict_model_config: bool = True
    rate_limiter_mode: RateLimitMode = RateLimitMode.OFF
    rate_limiter_resources: List[RateLimiterResource] = dataclasses.field(default_factory=list)
    pinned_memory_pool_size: int = 1 << 28
    cuda_memory_pool_sizes: Dict[int, int] = dataclasses.field(default_factory=dict)
    cache_config: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)
    cache_directory: str = dataclasses.field(default_factory=_default_cache_directory)
    min_supported_compute_capability: float = 6.0
    exit_on_error: bool = True
    strict_readiness: bool = True
    exit_timeout: int = 30
    buffer_manager_thread_count: int = 0
    model_load_thread_count: int = 4
    model_load_retry_count: int = 0
    model_namespacing: bool = False
    log_file: Optional[str] = None
    log_info: bool = False
    log_warn: bool = False
    log_error: bool = False
    log_format: LogFormat = LogFormat.DEFAULT
    log_verbose: int = 0
    metrics: bool = True
    gpu_metrics: bool = True
    cpu_metrics: bool = True
    metrics_interval: int = 2000
    backend_directory: str = dataclasses.field(default_factory=_default_backend_directory)
    repo_agent_directory: str = dataclasses.field(default_factory=_default_repo_agent_directory)
    model_load_device_limits: List[ModelLoadDeviceLimit] = dataclasses.field(default_factory=list)
    backend_configuration: Dict[str, Dict[str, str]] = dataclasses.field(default_factory=dict)
    host_policies: Dict[str, Dict[str, str]] = dataclasses.field(default_factory=dict)
    metrics_configuration: Dict[str, Dict[str, str]] = dataclasses.field(default_factory=dict)

    def _gpu_metrics_enabled(self) -> bool:
        """``gpu_metrics``, except on a machine without a usable NVIDIA driver at ``log_verbose`` 0.

        Triton collects GPU metrics through DCGM, which prints ``Error: Failed to initialize NVML``
        straight to this process's stderr (the tritonserver binary's copy lands in its log instead)
        where no driver answers: noise on every CPU-only machine, with no GPU metrics to lose.
        ``log_verbose`` >= 1 keeps the option as given, and with it the line, for diagnosis.
        """
        if not self.gpu_metrics:
            return False
        return int(self.log_verbose) > 0 or nvml_available()

    def _apply(self, lib: _lib.Library, handle: int, shm_prefix: str) -> None:
        """Write every option into a ``TRITONSERVER_ServerOptions`` (raises the mapped error)."""
        c = lib.check
        repositories = (
            [self.model_repository] if isinstance(self.model_repository, str) else list(self.model_repository)
        )
        if not repositories:
            raise InvalidArgumentError("Options.model_repository needs at least one path")
        for path in repositories:
            c(lib.TRITONSERVER_ServerOptionsSetModelRepositoryPath(handle, os.path.abspath(path).encode()))
        c(lib.TRITONSERVER_ServerOptionsSetServerId(handle, self.server_id.encode()))
        c(lib.TRITONSERVER_ServerOptionsSetModelControlMode(handle, int(ModelControlMode(self.model_control_mode))))
        for name in self.startup_models:
            c(lib.TRITONSERVER_ServerOptionsSetStartupModel(handle, name.encode()))
        c(lib.TRITONSERVER_ServerOptionsSetStrictModelConfig(handle, bool(self.strict_model_config)))
        c(lib.TRITONSERVER_ServerOptionsSetRateLimiterMode(handle, int(RateLimitMode(self.rate_limiter_mode))))
        for resource in self.rate_limiter_resources:
            c(
                lib.TRITONSERVER_ServerOptionsAddRateLimiterResource(
                    handle, resource.name.encode(), resource.count, resource.device
                )
            )
        c(lib.TRITONSERVER_ServerOptionsSetPinnedMemoryPoolByteSize(handle, int(self.pinned_memory_pool_size)))
        for device, size in self.cuda_memory_pool_sizes.items():
            c(lib.TRITONSERVER_ServerOptionsSetCudaMemoryPoolByteSize(handle, int(device), int(size)))
        for cache_name, settings in self.cache_config.items():
            c(lib.TRITONSERVER_ServerOptionsSetCacheConfig(handle, cache_name.encode(), json.dumps(settings).encode()))
        c(lib.TRITONSERVER_ServerOptionsSetCacheDirectory(handle, self.cache_directory.encode()))
        c(
            lib.TRITONSERVER_ServerOptionsSetMinSupportedComputeCapability(
                handle, float(self.min_supported_compute_capability)
            )
        )
        c(lib.TRITONSERVER_ServerOptionsSetExitOnError(handle, bool(self.exit_on_error)))
        c(lib.TRITONSERVER_ServerOptionsSetStrictReadiness(handle, bool(self.strict_readiness)))
        c(lib.TRITONSERVER_ServerOptionsSetExitTimeout(handle, int(self.exit_timeout)))
        c(lib.TRITONSERVER_ServerOptionsSetBufferManagerThreadCount(handle, int(self.buffer_manager_thread_count)))
        c(lib.TRITONSERVER_ServerOptionsSetModelLoadThreadCount(handle, int(self.model_load_thread_count)))
        c(lib.TRITONSERVER_ServerOptionsSetModelLoadRetryCount(handle, int(self.model_load_retry_count)))
        c(lib.TRITONSERVER_ServerOptionsSetModelNamespacing(handle, bool(self.model_namespacing)))
        if self.log_file is not None:
            c(lib.TRITONSERVER_ServerOptionsSetLogFile(handle, self.log_file.encode()))
        c(lib.TRITONSERVER_ServerOptionsSetLogInfo(handle, bool(self.log_info)))
        c(lib.TRITONSERVER_ServerOptionsSetLogWarn(handle, bool(self.log_warn)))
        c(lib.TRITONSERVER_ServerOptionsSetLogError(handle, bool(self.log_error)))
        c(lib.TRITONSERVER_ServerOptionsSetLogFormat(handle, int(LogFormat(self.log_format))))
        c(lib.TRITONSERVER_ServerOptionsSetLogVerbose(handle, int(self.log_verbose)))
        c(lib.TRITONSERVER_ServerOptionsSetMetrics(handle, bool(self.metrics)))
        c(lib.TRITONSERVER_ServerOptionsSetGpuMetrics(handle, self._gpu_metrics_enabled()))
        c(lib.TRITONSERVER_ServerOptionsSetCpuMetrics(handle, bool(self.cpu_metrics)))
        c(lib.TRITONSERVER_ServerOptionsSetMetricsInterval(handle, int(self.metrics_interval)))
        c(lib.TRITONSERVER_ServerOptionsSetBackendDirectory(handle, self.backend_directory.encode()))
        c(lib.TRITONSERVER_ServerOptionsSetRepoAgentDirectory(handle, self.repo_agent_directory.encode()))
        for limit in self.model_load_device_limits:
            c(
                lib.TRITONSERVER_ServerOptionsSetModelLoadDeviceLimit(
                    handle, int(InstanceGroupKind(limit.kind)), int(limit.device), float(limit.fraction)
                )
            )
        backend_configuration = {name: dict(settings) for name, settings in self.backend_configuration.items()}
        backend_configuration.setdefault("python", {}).setdefault("shm-region-prefix-name", shm_prefix)
        for backend, settings in backend_configuration.items():
            for setting, value in settings.items():
                c(
                    lib.TRITONSERVER_ServerOptionsSetBackendConfig(
                        handle, backend.encode(), setting.encode(), str(value).encode()
                    )
                )
        for policy, settings in self.host_policies.items():
            for setting, value in settings.items():
                c(
                    lib.TRITONSERVER_ServerOptionsSetHostPolicy(
                        handle, policy.encode(), setting.encode(), str(value).encode()
                    )
                )
        for name, settings in self.metrics_configuration.items():
            for setting, value in settings.items():
                c(
                    lib.TRITONSERVER_ServerOptionsSetMetricsConfig(
                        handle, name.encode(), setting.encode(), str(value).encode()
                    )
                )
