"""Embedded mode of ``Triton``: the server runs inside this process through :mod:`pytriton.inprocess`.

``Triton(embedded=True)`` binds callables exactly as the default mode does (the same model
repository, proxy model, worker threads, shared-memory names, watchdog and clean-up) but, instead of
launching the ``tritonserver`` binary, starts Triton's server library in this process with the
options the binary would have been given: the command line ``Triton`` builds is translated flag by
flag (:func:`options_from_command`), so the Python backend gets the same shared-memory prefix and
sizes, the same backend directory and the same control mode. There are no ports and no network
endpoints; bound models are called through :meth:`EmbeddedTriton.model` (a
:class:`pytriton.inprocess.Model`) or :meth:`EmbeddedTriton.client` (an
:class:`~pytriton.inprocess.InProcessModelClient`).

Processes and lifetimes: the Python backend still runs one stub process per model instance; in this
mode the stubs are children of this process (they exit on their own within about 0.3 s if it dies).
:class:`EmbeddedServer` stands in for :class:`~pytriton.server.process.TritonServerProcess`, so
``Triton``'s start-up, live binding, unbinding, stub replacement, memory recycling and ``stop()``
run unchanged; only a server restart has no meaning here (the server cannot die without this
process). ``stop()`` unloads every model, waits for the stubs to exit and then stops and frees the
server: about 1.3 s per instance of the model with the most instances (Triton's Python backend
checks each stub's health for a fixed second before finalizing it), never Triton's exit timeout.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import pathlib
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Union

from pytriton import inprocess
from pytriton._healing import _State
from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonServerError,
)
from pytriton.inprocess import _lib
from pytriton.server.process import TritonServerProcess
from pytriton.server.settings import Settings
from pytriton.server.triton_config import TritonConfig
from pytriton.server.workspace import Workspace

LOGGER = logging.getLogger(__name__)
LOG_FILE_NAME = "tritonserver.log"
_LOG_TAIL_BYTES = 256 << 10
# How long stop() waits, after the last stub has exited, for Triton to log that the models unloaded.
_UNLOAD_LOG_WAIT_S = 1.0
# Triton's own exit timeout for the final ServerStop, once every model has unloaded (or cannot).
_STOP_EXIT_TIMEOUT_S = 1

# Flags of the binary that configure its network endpoints: nothing listens in embedded mode.
_NETWORK_PREFIXES = ("http-", "grpc-", "sagemaker-", "vertex-ai-")
_NETWORK_FLAGS = frozenset(
    {"allow-http", "allow-grpc", "allow-sagemaker", "allow-vertex-ai", "metrics-port", "metrics-address"}
)
# Flags the server library has no option for.
_UNSUPPORTED_FLAGS = {"trace-config": "tracing is not available in embedded mode"}
# The stubs inherit this process's environment; inprocess.Server already puts the stub's python3
# first on PATH and this libpython first on LD_LIBRARY_PATH for as long as it runs.
_SERVER_MANAGED_VARIABLES = frozenset({"PATH", "LD_LIBRARY_PATH"})
_ENVIRON_LOCK = threading.Lock()


def _flag_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "on", "yes"):
        return True
    if lowered in ("false", "0", "off", "no"):
        return False
    raise PyTritonBadParameterError(f"--{name}={value!r} is not a boolean.")


def _setting(name: str, value: str) -> List[str]:
    """``group,setting=value`` or ``setting=value`` -> ``[group, setting, value]`` (group ``""`` if absent)."""
    head, sep, setting_value = value.partition(",")
    if not sep or "=" in head or "=" not in setting_value:
        head, setting_value = "", value
    setting, sep, item = setting_value.partition("=")
    if not sep or not setting:
        raise PyTritonBadParameterError(f"--{name}={value!r}: expected '[group,]setting=value'.")
    return [head, setting, item]


def options_from_command(argv: Sequence[str], log_file: Optional[pathlib.Path] = None) -> inprocess.Options:
    """The in-process :class:`~pytriton.inprocess.Options` equivalent to a ``tritonserver`` command line.

    ``argv`` is what :func:`pytriton.server.command.build_command` returns (the binary first, then
    ``--flag=value`` elements). Defaults are the binary's, not ``Options``'s: info, warning and
    error logging on, and config auto-completion on unless ``--disable-auto-complete-config``.
    Network flags (HTTP, gRPC, SageMaker, Vertex AI, metrics port and address, restricted
    endpoints) are dropped, as nothing listens; ``--trace-config`` is dropped with a warning;
    an unknown flag is dropped with a warning. ``log_file`` (else ``--log-file``) receives Triton's
    log; with neither, Triton logs to this process's standard error.

    Raises:
        PyTritonBadParameterError: a value cannot be parsed.
    """
    binary = pathlib.Path(argv[0])
    options = inprocess.Options(
        model_repository=[],
        model_control_mode=inprocess.ModelControlMode.NONE,
        strict_model_config=False,
        log_info=True,
        log_warn=True,
        log_error=True,
        repo_agent_directory=str(binary.parent.parent / "repoagents"),
    )
    repositories: List[str] = []
    for arg in argv[1:]:
        if not arg.startswith("--"):
            raise PyTritonBadParameterError(f"Unexpected tritonserver argument {arg!r}.")
        name, _, value = arg[2:].partition("=")
        if name.startswith(_NETWORK_PREFIXES) or name in _NETWORK_FLAGS:
            continue
        if name in _UNSUPPORTED_FLAGS:
            LOGGER.warning("Embedded Triton ignores --%s: %s.", name, _UNSUPPORTED_FLAGS[name])
            continue
        if name == "model-repository":
            repositories.append(value)
        elif name == "id":
            options.server_id = value
        elif name == "model-control-mode":
            options.model_control_mode = inprocess.ModelControlMode[value.upper()]
        elif name == "load-model":
            options.startup_models.append(value)
        elif name == "disable-auto-complete-config":
            options.strict_model_config = True
        elif name == "strict-readiness":
            options.strict_readiness = _flag_bool(name, value)
        elif name == "exit-on-error":
            options.exit_on_error = _flag_bool(name, value)
        elif name == "exit-timeout-secs":
            options.exit_timeout = int(value)
        elif name == "log-verbose":
            options.log_verbose = int(value)
        elif name in ("log-info", "log-warning", "log-error"):
            setattr(options, {"log-warning": "log_warn"}.get(name, name.replace("-", "_")), _flag_bool(name, value))
        elif name == "log-format":
            options.log_format = (
                inprocess.LogFormat.ISO8601 if value.upper() == "ISO8601" else inprocess.LogFormat.DEFAULT
            )
        elif name == "log-file":
            options.log_file = value
        elif name == "allow-metrics":
            options.metrics = _flag_bool(name, value)
        elif name == "allow-gpu-metrics":
            options.gpu_metrics = _flag_bool(name, value)
        elif name == "allow-cpu-metrics":
            options.cpu_metrics = _flag_bool(name, value)
        elif name == "metrics-interval-ms":
            options.metrics_interval = int(value)
        elif name == "metrics-config":
            group, setting, item = _setting(name, value)
            options.metrics_configuration.setdefault(group, {})[setting] = item
        elif name == "cache-config":
            group, setting, item = _setting(name, value)
            options.cache_config.setdefault(group, {})[setting] = item  # strings, as the binary sends them
        elif name == "cache-directory":
            options.cache_directory = value
        elif name == "backend-directory":
            options.backend_directory = value
        elif name == "backend-config":
            group, setting, item = _setting(name, value)
            options.backend_configuration.setdefault(group, {})[setting] = item
        elif name == "buffer-manager-thread-count":
            options.buffer_manager_thread_count = int(value)
        elif name == "pinned-memory-pool-byte-size":
            options.pinned_memory_pool_size = int(value)
        elif name == "model-load-thread-count":
            options.model_load_thread_count = int(value)
        else:
            LOGGER.warning("Embedded Triton ignores the unknown tritonserver flag %s.", arg)
    options.model_repository = repositories
    if log_file is not None:
        options.log_file = str(log_file)
    return options


def environment_changes(target: Mapping[str, str], current: Mapping[str, str]) -> Dict[str, Optional[str]]:
    """What to change in ``current`` so that processes started now see ``target`` (``None``: unset).

    ``PATH`` and ``LD_LIBRARY_PATH`` are left out: :class:`pytriton.inprocess.Server` manages them
    for the whole life of the server.
    """
    changes: Dict[str, Optional[str]] = {}
    for name, value in target.items():
        if name not in _SERVER_MANAGED_VARIABLES and current.get(name) != value:
            changes[name] = value
    for name in current:
        if name not in target and name not in _SERVER_MANAGED_VARIABLES:
            changes[name] = None
    return changes


@contextlib.contextmanager
def stub_environment(target: Mapping[str, str]) -> Iterator[None]:
    """Make ``os.environ`` match ``target`` (but ``PATH``/``LD_LIBRARY_PATH``) while stubs may start.

    The Python backend starts stubs as children of this process while a model loads, and they
    inherit this process's environment: the binary would give them the environment ``Triton``
    prepares (no ``PYTHONPATH``/``PYTHONHOME``/``VIRTUAL_ENV``, ``MALLOC_ARENA_MAX``), so the same
    values are put in place for the duration of a start or a load, then restored. Other threads
    of this process see them meanwhile.
    """
    with _ENVIRON_LOCK:
        changes = environment_changes(target, os.environ)
        saved = {name: os.environ.get(name) for name in changes}
        try:
            for name, value in changes.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            yield
        finally:
            for name, old in saved.items():
                if old is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = old


def _stub_pids(repository_prefixes: Sequence[str]) -> List[int]:
    """Backend stubs that are children of this process and serve a model of one of the repositories."""
    own = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat_file:
                stat = stat_file.read().decode(errors="replace")
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) < 2 or fields[1] != own or fields[0] == "Z":  # a zombie holds nothing any more
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline_file:
                words = cmdline_file.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        is_stub = bool(words) and words[0].endswith("triton_python_backend_stub")
        if is_stub and any(word.startswith(prefix) for word in words for prefix in repository_prefixes):
            found.append(int(entry))
    return found


class EmbeddedServer(TritonServerProcess):
    """Triton's server library in this process, behind the interface of :class:`TritonServerProcess`.

    Lifetime: :meth:`start` creates the :class:`pytriton.inprocess.Server` (models named with
    ``--load-model`` are loaded before it returns); :meth:`stop` unloads every model, waits (at most
    ``grace_s``) for in-flight batches and for the stubs to exit, then stops and frees the server.
    Both are idempotent. ``pid`` is this process's id while the server runs, because that is the
    stubs' parent (``Triton`` tells a stub that died from one whose server died by it).
    ``register_on_exit`` callbacks are never called: the server cannot die on its own.
    """

    def __init__(
        self,
        argv: List[str],
        env: Dict[str, str],
        *,
        log_path: Optional[pathlib.Path] = None,
        log_buffer_lines: int = 2000,
    ):
        super().__init__(argv, env, log_path=log_path, log_buffer_lines=log_buffer_lines)
        self._options = options_from_command(argv, log_path)
        repositories = self._options.model_repository
        paths = [repositories] if isinstance(repositories, str) else list(repositories)
        self._repository_prefixes = [os.path.abspath(path).rstrip("/") + "/" for path in paths]
        self._root = pathlib.Path(argv[0]).parent.parent  # <install>/bin/tritonserver
        self._server: Optional[inprocess.Server] = None
        self._loaded: Set[str] = set(self._options.startup_models)
        self._log_lines_max = log_buffer_lines

    @property
    def options(self) -> inprocess.Options:
        """The options the server is (or will be) started with."""
        return self._options

    @property
    def server(self) -> Optional[inprocess.Server]:
        """The running :class:`pytriton.inprocess.Server`, or ``None`` before start and after stop."""
        return self._server

    @property
    def pid(self) -> Optional[int]:
        """This process's id while the server runs (the stubs' parent), else ``None``."""
        return os.getpid() if self._server is not None else None

    @property
    def log_lines(self) -> List[str]:
        """The last lines of Triton's log file (empty when Triton logs to standard error)."""
        path = self._options.log_file
        if not path:
            return []
        try:
            with open(path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - _LOG_TAIL_BYTES))
                data = log.read()
        except OSError:
            return []
        lines = collections.deque(data.decode("utf-8", "replace").splitlines(), maxlen=self._log_lines_max)
        return list(lines)

    def error_lines(self, limit: int = 20) -> List[str]:
        """Triton's error lines from its log file, the most recent last."""
        self._lines = collections.deque(self.log_lines, maxlen=self._log_lines_max)  # what the base class reads
        return super().error_lines(limit)

    def crash_lines(self, limit: int = 5) -> List[str]:
        """Error lines, else the last lines, of Triton's log file."""
        self._lines = collections.deque(self.log_lines, maxlen=self._log_lines_max)
        return super().crash_lines(limit)

    def register_on_exit(self, callback: Callable[[int], None]) -> None:
        """Accepted and never called: an embedded server does not exit on its own."""

    def start(self) -> None:
        """Create and start the in-process server; returns once the start-up models are loaded.

        Raises:
            PyTritonServerError: the server library cannot be loaded, or Triton refused to start
                (a start-up model failed to load, a bad option); the message quotes Triton's log.
        """
        LOGGER.debug("Starting Triton in this process with %s", self._options)
        server = inprocess.Server(self._options)
        try:
            with stub_environment(self._env):
                _lib.library(self._root)  # this install's library, unless one is already loaded
                server.start(wait_until_ready=False)
        except inprocess.TritonError as exc:
            raise self._failure_from(f"Triton failed to start in this process: {exc}") from None
        self._server = server
        requested = self._options.backend_configuration.get("python", {}).get("shm-region-prefix-name")
        if requested and server.shm_region_prefix != requested:
            LOGGER.warning(
                "Another in-process Triton server runs in this process; Triton's Python backend, shared by "
                "both, names the stubs' shared-memory regions %s*, not %s*: this Triton neither restricts "
                'their permissions nor recycles them (docs/inprocess.md, "Embedded Triton").',
                server.shm_region_prefix,
                requested,
            )

    def _failure_from(self, message: str) -> PyTritonServerError:
        errors = self.error_lines()
        if errors:
            message = message.rstrip(".") + ". Triton's error output:\n  " + "\n  ".join(errors)
        return PyTritonServerError(message)

    def is_alive(self) -> bool:
        """True while the server is started and live."""
        server = self._server
        if server is None:
            return False
        try:
            return server.live()
        except inprocess.TritonError:  # stopped by another thread meanwhile
            return False

    def failure(self, what: str) -> PyTritonServerError:
        """An error for ``what``, quoting Triton's error lines."""
        return self._failure_from(f"{what}: the embedded Triton server is not running.")

    def wait_until(self, probe: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Wait until the server is ready (``probe``, a network check, does not apply and is ignored)."""
        deadline = time.monotonic() + timeout_s
        while True:
            server = self._server
            if server is None or not self.is_alive():
                raise self.failure(what)
            if server.ready():
                self._ready = True
                return
            if time.monotonic() > deadline:
                raise self._failure_from(f"{what}: not ready after {timeout_s:.0f} s.")
            time.sleep(0.01)

    def load(self, model_name: str) -> None:
        """Load (or reload) ``model_name`` from the repository; returns once it is loaded.

        Raises:
            PyTritonModelConfigError: Triton could not load it (Triton's message).
        """
        server = self._running()
        try:
            with stub_environment(self._env):
                server.load(model_name)
        except inprocess.TritonError as exc:
            raise PyTritonModelConfigError(f"Triton could not load model {model_name!r}: {exc}") from None
        self._loaded.add(model_name)

    def unload(self, model_name: str) -> None:
        """Ask Triton to unload ``model_name``; returns at once (the stubs exit a moment later).

        Raises:
            PyTritonModelConfigError: Triton refused (Triton's message).
        """
        server = self._running()
        try:
            server.unload(model_name)
        except inprocess.TritonError as exc:
            raise PyTritonModelConfigError(f"Triton could not unload model {model_name!r}: {exc}") from None
        self._loaded.discard(model_name)

    def _running(self) -> inprocess.Server:
        server = self._server
        if server is None:
            raise PyTritonInvalidOperationError("The embedded Triton server is not running.")
        return server

    def _log_size(self) -> int:
        try:
            return os.path.getsize(self._options.log_file or "")
        except OSError:
            return -1

    def _wait_logged_unloads(self, names: Sequence[str], offset: int, deadline: float) -> None:
        """Wait (until ``deadline``) for Triton's "successfully unloaded" log line of each of ``names``.

        Needs Triton's info log in a file (always so, unless ``--log-info=false``); without it, or when
        the lines do not come, Triton's own stop polls for the unloads (1 s per poll).
        """
        path = self._options.log_file
        if not path or offset < 0 or not self._options.log_info or not names:
            return
        pending = {f"successfully unloaded '{name}'" for name in names}
        while True:
            try:
                with open(path, "rb") as log:
                    log.seek(offset)
                    text = log.read().decode("utf-8", "replace")
            except OSError:
                return
            pending = {line for line in pending if line not in text}
            if not pending or time.monotonic() >= deadline:
                return
            time.sleep(0.005)

    def stop(self, grace_s: float = 30.0, wait_idle: Optional[Callable[[float], bool]] = None) -> None:
        """Unload every model, wait for in-flight batches and the stubs, then stop and free the server.

        Triton's own stop polls once per second until every model has unloaded; unloading first
        and waiting for the stubs to exit lets it find nothing left and return at once.
        ``wait_idle`` (``Triton``'s check that no batch is in flight and the stubs detached) is
        called with the deadline. A model that cannot unload (one whose stub died after a request
        was routed to it) makes Triton wait its exit timeout (``TritonConfig.exit_timeout_secs``).
        Idempotent.
        """
        with self._lock:
            self._stopping = True
            server = self._server
        if server is None:
            return
        deadline = time.monotonic() + grace_s
        log_offset = self._log_size()
        unloading = []
        for name in sorted(self._loaded):
            try:
                server.unload(name)
                unloading.append(name)
            except inprocess.TritonError as exc:  # not loaded after all (a failed live load)
                LOGGER.debug("Embedded Triton: unloading %s at stop: %s", name, exc)
        if wait_idle is not None:
            wait_idle(deadline)
        # The Python backend finalizes a model's instances one after another, each after a fixed 1 s
        # health check of its stub (models in parallel): this wait is about 1.3 s per instance.
        while _stub_pids(self._repository_prefixes) and time.monotonic() < deadline:
            time.sleep(0.01)
        # The model itself is freed a few ms after its last stub has been reaped. Triton's stop would
        # find it still unloading and sleep a whole second, so wait for Triton to log the unload.
        self._wait_logged_unloads(unloading, log_offset, min(deadline, time.monotonic() + _UNLOAD_LOG_WAIT_S))
        # Whatever is still loaded now cannot unload: a model whose stub died after a request had been
        # routed to it never does (docs/architecture.md, "Stub death"). Let Triton's stop look again
        # once, a second later, instead of waiting its whole exit timeout for it.
        with contextlib.suppress(inprocess.TritonError):
            lib = _lib.library()
            lib.check(lib.TRITONSERVER_ServerSetExitTimeout(server._handle_or_raise(), _STOP_EXIT_TIMEOUT_S))
        try:
            server.stop()
        finally:
            self._server = None
            self._loaded.clear()


class EmbeddedTriton:
    """The embedded-mode part of ``Triton`` (a mixin): choosing the server, and in-process access.

    The attributes declared here without a value are ``Triton``'s state.
    """

    _embedded: bool
    _server: Optional[TritonServerProcess]
    _config: TritonConfig
    _settings: Settings
    _workspace: Workspace
    _state: _State
    _lock: threading.RLock

    def _model_names(self) -> List[str]:
        raise NotImplementedError

    @property
    def embedded(self) -> bool:
        """True if this ``Triton`` runs the server inside this process (``Triton(embedded=True)``)."""
        return self._embedded

    def _new_server(self, argv: List[str], env: Dict[str, str]) -> TritonServerProcess:
        """The server for ``argv``/``env``: the ``tritonserver`` binary, or the library in this process."""
        if not self._embedded:
            return TritonServerProcess(
                argv, env, log_path=self._config.log_file, data_headroom=self._settings.server_data_headroom
            )
        # Triton's log goes to the configured file, else to one in the workspace (server_log reads
        # it), not to this process's standard error.
        log_path = self._config.log_file or self._workspace.subdir("embedded") / LOG_FILE_NAME
        return EmbeddedServer(argv, env, log_path=log_path)

    def _embedded_request(self, action: str, model_name: str) -> None:
        """A model-repository call (``load``/``unload``) on the in-process server."""
        server = self._server
        if not isinstance(server, EmbeddedServer):
            raise PyTritonInvalidOperationError("The embedded Triton server is not running.")
        if action == "load":
            server.load(model_name)
        else:
            server.unload(model_name)

    def _no_network(self, what: str) -> None:
        """Refuse ``what`` (a network address) in embedded mode, where nothing listens."""
        if self._embedded:
            raise PyTritonInvalidOperationError(
                f"Triton(embedded=True) has no network endpoints, so no {what}: call models with "
                "triton.client(name) or triton.model(name)."
            )

    @property
    def inprocess_server(self) -> inprocess.Server:
        """The running :class:`pytriton.inprocess.Server` of an embedded ``Triton`` (after :meth:`run`).

        It stays valid until :meth:`stop`; stopping or unloading models through it directly bypasses
        ``Triton``'s bookkeeping, so use ``Triton``'s own methods for that.

        Raises:
            PyTritonInvalidOperationError: not embedded, not running yet, or stopped.
        """
        if not self._embedded:
            raise PyTritonInvalidOperationError(
                "inprocess_server exists only for Triton(embedded=True); this Triton runs the tritonserver binary."
            )
        server = self._server
        inner = server.server if isinstance(server, EmbeddedServer) else None
        if inner is None or self._state is not _State.RUNNING:
            state = "stopped" if self._state is _State.STOPPED else "not running yet (call run() first)"
            raise PyTritonInvalidOperationError(f"The embedded Triton is {state}.")
        return inner

    def model(self, model_name: str, model_version: int = -1) -> inprocess.Model:
        """The bound model ``model_name`` as a :class:`pytriton.inprocess.Model` (embedded mode, after run()).

        ``model_version`` -1 lets Triton pick (the highest bound version). The handle calls the
        server directly (``infer``, ``async_infer``, ``metadata``, ``config``, ``statistics``, ...)
        and raises :class:`pytriton.inprocess.InvalidArgumentError` once this ``Triton`` is stopped.

        Raises:
            PyTritonInvalidOperationError: not embedded, not running, or no model of that name is bound.
        """
        server = self.inprocess_server
        if model_name not in self._model_names():
            raise PyTritonInvalidOperationError(f"No model {model_name!r} is bound.")
        return server.model(model_name, model_version)

    def client(self, model_name: str, model_version: Union[int, str, None] = None) -> inprocess.InProcessModelClient:
        """A ``ModelClient``-shaped client of a bound model, with no network (embedded mode, after run()).

        ``infer_sample``/``infer_batch`` behave as :class:`pytriton.client.ModelClient`'s (positional
        inputs in the model's input order, batch axis added for batching models); errors are
        :mod:`pytriton.inprocess` exceptions. Nothing to close: ``close()`` only marks it closed.

        Raises:
            PyTritonInvalidOperationError: not embedded, not running, or no model of that name is bound.
        """
        self.model(model_name)  # the same checks
        return inprocess.InProcessModelClient(self.inprocess_server, model_name, model_version)


def check_embedded_flag(embedded: Any) -> bool:
    """Validate ``Triton(embedded=...)``."""
    if not isinstance(embedded, bool):
        raise PyTritonBadParameterError(f"embedded must be a bool, got {embedded!r}.")
    return embedded
