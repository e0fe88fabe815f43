"""``LaunchPlan``: how one Triton server is started, built once and rendered two ways.

:meth:`LaunchPlan.build` turns the resolved configuration (``Settings.config``: explicit config over
``PYTRITON_TRITON_CONFIG_*`` variables, see server/settings.py) and what pytriton itself decided
(:class:`~pytriton.server.command.LaunchSettings`: repository, backend and cache directories, the
Python backend's region prefix, start-up models, access policy) into one frozen record with typed
fields. It is rendered

* to the ``tritonserver`` argv (:meth:`LaunchPlan.to_argv`): one ``--flag=value`` element per value
  (no shell is involved, so values with spaces or quotes stay one element), list values repeat
  their flag, booleans are written ``true``/``false``;
* to :class:`pytriton.inprocess.Options` for embedded mode (:meth:`LaunchPlan.to_inprocess_options`):
  the same repository, control mode, Python-backend options, logging and timeouts; nothing about
  the network endpoints (nothing listens in process), and tracing is dropped with a warning.

A change to the launch (the drain's longer exit timeout, the log file, the models a restarted server
loads) is a new plan made with :func:`dataclasses.replace` (or the helpers below), never an edit of
argv strings. The restriction groups carry the access token: they are left out of ``repr``, and
argv's restriction flags are hidden from other users by the private launch (_platform/launch.py).

Unit test: tests/unit/test_plan.py.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
from typing import TYPE_CHECKING, Container, Dict, List, Optional, Sequence, Tuple

from pytriton.exceptions import PyTritonBadParameterError
from pytriton.server import versions
from pytriton.server.command import NOT_FLAGS, LaunchSettings, effective_options
from pytriton.server.security import AccessPolicy, Restriction
from pytriton.server.triton_config import DEFAULT_MAX_REQUEST_BYTES, TritonConfig

if TYPE_CHECKING:
    from pytriton import inprocess

LOGGER = logging.getLogger(__name__)

# The Python backend's shared-memory region for each model instance and its growth step when the
# config leaves them unset.
DEFAULT_SHM_BYTE_SIZE = 4 * 1024 * 1024
DEFAULT_SHM_GROWTH_BYTE_SIZE = 16 * 1024 * 1024
# Config fields that become typed fields of the plan; every other tritonserver flag of the config
# configures a network endpoint and is kept, in order, in LaunchPlan.endpoints.
_TYPED = frozenset(
    {
        "id",
        "model_repository",
        "log_verbose",
        "log_file",
        "log_format",
        "exit_timeout_secs",
        "exit_on_error",
        "strict_readiness",
        "allow_metrics",
        "allow_gpu_metrics",
        "allow_cpu_metrics",
        "metrics_interval_ms",
        "metrics_config",
        "trace_config",
        "cache_config",
        "cache_directory",
        "buffer_manager_thread_count",
        "pinned_memory_pool_byte_size",
    }
)

# Optional plan fields and the Options attribute each sets when given (else Options keeps the
# server's default). tests/unit/test_plan.py checks that every attribute set exists on Options.
_INPROCESS_OPTIONAL = (
    ("server_id", "server_id"),
    ("exit_timeout_secs", "exit_timeout"),
    ("allow_metrics", "metrics"),
    ("allow_gpu_metrics", "gpu_metrics"),
    ("allow_cpu_metrics", "cpu_metrics"),
    ("metrics_interval_ms", "metrics_interval"),
    ("cache_directory", "cache_directory"),
    ("buffer_manager_thread_count", "buffer_manager_thread_count"),
    ("pinned_memory_pool_byte_size", "pinned_memory_pool_size"),
)


@dataclasses.dataclass(frozen=True)
class PythonBackendOptions:
    """The ``--backend-config=python,...`` values: the region-name prefix and the region sizes."""

    shm_region_prefix: str
    shm_default_byte_size: int = DEFAULT_SHM_BYTE_SIZE
    shm_growth_byte_size: int = DEFAULT_SHM_GROWTH_BYTE_SIZE

    def settings(self) -> Dict[str, str]:
        """``{setting: value}`` in the order the binary gets them."""
        return {
            "shm-region-prefix-name": self.shm_region_prefix,
            "shm-default-byte-size": str(self.shm_default_byte_size),
            "shm-growth-byte-size": str(self.shm_growth_byte_size),
        }


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Everything one server start needs, typed; build it with :meth:`build`, change it with ``replace``.

    ``None`` in an optional field means "the server's own default" (no flag is written).
    ``endpoints`` holds the network flags (HTTP, gRPC, metrics port and address, SageMaker,
    Vertex AI) as ``(config field, value)`` pairs in config order, ports and addresses with
    pytriton's defaults applied. ``http_restrictions``/``grpc_restrictions`` carry the access token
    and are not shown by ``repr``.
    """

    binary: pathlib.Path
    model_repository: pathlib.Path
    backend_directory: pathlib.Path
    python_backend: PythonBackendOptions
    cache_directory: Optional[str] = None
    startup_models: Tuple[str, ...] = ()
    model_control_mode: str = "explicit"
    auto_complete_config: bool = False
    strict_readiness: bool = True
    exit_on_error: bool = True
    exit_timeout_secs: Optional[int] = None
    server_id: Optional[str] = None
    log_verbose: int = 0
    log_file: Optional[pathlib.Path] = None
    log_format: Optional[str] = None
    allow_metrics: Optional[bool] = None
    allow_gpu_metrics: Optional[bool] = None
    allow_cpu_metrics: Optional[bool] = None
    metrics_interval_ms: Optional[int] = None
    metrics_config: Tuple[str, ...] = ()
    trace_config: Tuple[str, ...] = ()
    cache_config: Tuple[str, ...] = ()
    buffer_manager_thread_count: Optional[int] = None
    pinned_memory_pool_byte_size: Optional[int] = None
    # Servers from 2.59 bound a JSON input's declared size natively (versions.HTTP_MAX_INPUT_SIZE).
    http_max_input_size: Optional[int] = None
    endpoints: Tuple[Tuple[str, object], ...] = ()
    http_restrictions: Tuple[Restriction, ...] = dataclasses.field(default=(), repr=False)
    grpc_restrictions: Tuple[Restriction, ...] = dataclasses.field(default=(), repr=False)

    @classmethod
    def build(cls, binary: pathlib.Path, config: TritonConfig, launch: LaunchSettings) -> LaunchPlan:
        """The plan to start ``binary`` with ``config`` (already resolved) and pytriton's ``launch`` decisions.

        ``launch.access`` None: only what the config itself restricts (no security config).
        """
        options = effective_options(config)
        # Triton keeps this many gRPC request/response objects for reuse (8 by default), and each
        # keeps the buffers of the largest tensors it ever carried: one 256 MiB request left the
        # server 570 MiB larger for good, and mixed sizes grew it by 265 MiB in 4000 requests.
        # Without the pool, those figures were 127 MiB and 68 MiB, at no measurable cost
        # (docs/architecture.md, "Memory").
        options.setdefault("grpc_infer_allocation_pool_size", 0)
        access = launch.access if launch.access is not None else AccessPolicy(config)
        cache_directory = config.cache_directory
        if cache_directory is None and launch.cache_directory is not None:
            cache_directory = launch.cache_directory.as_posix()
        max_request = DEFAULT_MAX_REQUEST_BYTES if config.max_request_bytes is None else config.max_request_bytes
        # 0 (no limit) leaves the server's own default of a newer server's flag.
        native_input_limit = (
            launch.triton_version is not None
            and max_request > 0
            and versions.HTTP_MAX_INPUT_SIZE.active(launch.triton_version)
        )
        return cls(
            binary=binary,
            model_repository=config.model_repository or launch.model_repository,
            backend_directory=launch.backend_directory,
            python_backend=PythonBackendOptions(
                shm_region_prefix=launch.shm_region_prefix,
                shm_default_byte_size=config.python_backend_shm_default_byte_size or DEFAULT_SHM_BYTE_SIZE,
                shm_growth_byte_size=config.python_backend_shm_growth_byte_size or DEFAULT_SHM_GROWTH_BYTE_SIZE,
            ),
            cache_directory=cache_directory,
            startup_models=tuple(launch.startup_models),
            # pytriton sends complete configs; auto-completion would start one extra stub per model load.
            auto_complete_config=config.disable_auto_complete_config is False,
            strict_readiness=config.strict_readiness is not False,
            exit_on_error=config.exit_on_error is not False,
            exit_timeout_secs=config.exit_timeout_secs,
            server_id=config.id,
            log_verbose=config.log_verbose or 0,
            log_file=config.log_file,
            log_format=config.log_format,
            allow_metrics=config.allow_metrics,
            allow_gpu_metrics=config.allow_gpu_metrics,
            allow_cpu_metrics=config.allow_cpu_metrics,
            metrics_interval_ms=config.metrics_interval_ms,
            metrics_config=tuple(config.metrics_config or ()),
            trace_config=tuple(config.trace_config or ()),
            cache_config=tuple(config.cache_config or ()),
            buffer_manager_thread_count=config.buffer_manager_thread_count,
            pinned_memory_pool_byte_size=config.pinned_memory_pool_byte_size,
            http_max_input_size=max_request if native_input_limit else None,
            endpoints=tuple(
                (name, value) for name, value in options.items() if name not in NOT_FLAGS and name not in _TYPED
            ),
            http_restrictions=tuple(access.http),
            grpc_restrictions=tuple(access.grpc),
        )

    # -- changes ---------------------------------------------------------------------------
    def with_exit_timeout_at_least(self, bound_s: float) -> LaunchPlan:
        """This plan with Triton's own exit timeout at least ``bound_s`` (rounded up, plus 1 s).

        Triton leaves its first shutdown phase after its exit timeout; with a drain delay the drain
        lasts longer than ``exit_timeout_secs``, so the server is given the whole bound (pytriton
        ends it at the bound in any case; server/_drain.py).
        """
        wanted = int(math.ceil(bound_s)) + 1
        current = self.exit_timeout_secs
        return dataclasses.replace(self, exit_timeout_secs=wanted if current is None else max(wanted, current))

    def loading(self, names: Sequence[str]) -> LaunchPlan:
        """This plan with ``names`` as its start-up models (``--load-model``), in that order."""
        return dataclasses.replace(self, startup_models=tuple(names))

    def loading_only(self, names: Container[str]) -> LaunchPlan:
        """This plan with the start-up models restricted to those in ``names`` (their order kept)."""
        return dataclasses.replace(self, startup_models=tuple(name for name in self.startup_models if name in names))

    # -- renderings ------------------------------------------------------------------------
    def to_argv(self) -> List[str]:
        """The full ``tritonserver`` argv, the binary first (restriction flags carry the token)."""
        flags: List[Tuple[str, object]] = [
            ("id", self.server_id),
            ("model_repository", self.model_repository),
            ("log_verbose", self.log_verbose),
            ("log_file", self.log_file),
            ("log_format", self.log_format),
            ("exit_timeout_secs", self.exit_timeout_secs),
            ("exit_on_error", self.exit_on_error),
            ("strict_readiness", self.strict_readiness),
            *self.endpoints,
            ("allow_metrics", self.allow_metrics),
            ("allow_gpu_metrics", self.allow_gpu_metrics),
            ("allow_cpu_metrics", self.allow_cpu_metrics),
            ("metrics_interval_ms", self.metrics_interval_ms),
            ("metrics_config", list(self.metrics_config)),
            ("trace_config", list(self.trace_config)),
            ("cache_config", list(self.cache_config)),
            ("buffer_manager_thread_count", self.buffer_manager_thread_count),
            ("pinned_memory_pool_byte_size", self.pinned_memory_pool_byte_size),
            ("http_max_input_size", self.http_max_input_size),
            ("backend_directory", self.backend_directory),
            ("cache_directory", self.cache_directory),
        ]
        argv = [self.binary.as_posix()]
        for name, value in flags:
            if value is None:
                continue
            flag = "--" + name.replace("_", "-")
            if isinstance(value, list):
                argv.extend(f"{flag}={_flag_value(item)}" for item in value)
            else:
                argv.append(f"{flag}={_flag_value(value)}")
        if not self.auto_complete_config:
            argv.append("--disable-auto-complete-config")
        argv.append(f"--model-control-mode={self.model_control_mode}")
        argv.extend(f"--http-restricted-api={group.flag_value()}" for group in self.http_restrictions)
        argv.extend(f"--grpc-restricted-protocol={group.flag_value()}" for group in self.grpc_restrictions)
        argv.extend(f"--load-model={name}" for name in self.startup_models)
        argv.extend(f"--backend-config=python,{key}={value}" for key, value in self.python_backend.settings().items())
        return argv

    def to_inprocess_options(self) -> inprocess.Options:
        """The in-process :class:`~pytriton.inprocess.Options` that start the same server without its endpoints.

        Defaults are the binary's, not ``Options``'s: info, warning and error logging on. The
        endpoints and restrictions are left out (nothing listens); trace settings are left out with a
        warning. ``log_file`` None: Triton logs to this process's standard error.

        Raises:
            PyTritonBadParameterError: a ``metrics_config``/``cache_config`` item is not
                ``[group,]setting=value``.
        """
        from pytriton import inprocess  # embedded mode only: the launched server never imports it

        if self.trace_config:
            LOGGER.warning("Embedded Triton ignores --trace-config: tracing is not available in embedded mode.")
        options = inprocess.Options(
            model_repository=[self.model_repository.as_posix()],
            model_control_mode=inprocess.ModelControlMode[self.model_control_mode.upper()],
            startup_models=list(self.startup_models),
            strict_model_config=not self.auto_complete_config,
            strict_readiness=self.strict_readiness,
            exit_on_error=self.exit_on_error,
            log_info=True,
            log_warn=True,
            log_error=True,
            log_verbose=self.log_verbose,
            log_file=None if self.log_file is None else str(self.log_file),
            backend_directory=self.backend_directory.as_posix(),
            repo_agent_directory=str(self.binary.parent.parent / "repoagents"),
            backend_configuration={"python": self.python_backend.settings()},
        )
        for field, option in _INPROCESS_OPTIONAL:
            value = getattr(self, field)
            if value is not None:
                setattr(options, option, value)
        if self.log_format is not None:
            iso = self.log_format.upper() == "ISO8601"
            options.log_format = inprocess.LogFormat.ISO8601 if iso else inprocess.LogFormat.DEFAULT
        for item in self.metrics_config:
            group, setting, value = _setting("metrics_config", item)
            options.metrics_configuration.setdefault(group, {})[setting] = value
        for item in self.cache_config:
            group, setting, value = _setting("cache_config", item)
            options.cache_config.setdefault(group, {})[setting] = value  # strings, as the binary sends them
        return options


def _flag_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, pathlib.Path):
        return value.as_posix()
    return str(value)


def _setting(field: str, value: str) -> Tuple[str, str, str]:
    """``group,setting=value`` or ``setting=value`` -> ``(group, setting, value)`` (group ``""`` if absent)."""
    head, sep, setting_value = value.partition(",")
    if not sep or "=" in head or "=" not in setting_value:
        head, setting_value = "", value
    setting, sep, item = setting_value.partition("=")
    if not sep or not setting:
        raise PyTritonBadParameterError(f"TritonConfig.{field} item {value!r}: expected '[group,]setting=value'.")
    return head, setting, item
