"""Embedded mode of ``Triton``: the server runs inside this process through :mod:`pytriton.inprocess`.

``Triton(embedded=True)`` binds callables exactly as the default mode does (the same model
repository, proxy model, worker threads, shared-memory names, watchdog and clean-up) but, instead of
launching the ``tritonserver`` binary, starts Triton's server library in this process with the
options the binary would have been given: the launch plan ``Triton`` builds (pytriton/_serving/plan.py) is
rendered to in-process options instead of argv (:meth:`LaunchPlan.to_inprocess_options`), so the
Python backend gets the same shared-memory prefix and sizes, the same backend directory and the same
control mode. There are no ports and no network
endpoints; bound models are called through ``Triton.model`` (a :class:`pytriton.inprocess.Model`)
or ``Triton.client`` (an :class:`~pytriton.inprocess.InProcessModelClient`).
:class:`EmbeddedBackend` is the :class:`~pytriton._serving.backend.ServerBackend` of this mode.

Processes and lifetimes: the Python backend still runs one stub process per model instance; in this
mode the stubs are children of this process; if it dies, the watchdog kills them as soon as the kernel
has torn the dead process down (about 2 s on a loaded 2-core machine; _platform/watchdog.py says why
the stubs' own detection is not relied on).
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
import dataclasses
import logging
import os
import pathlib
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set

from pytriton import inprocess
from pytriton._platform import proc
from pytriton._serving.backend import StopHooks
from pytriton._serving.launched import LocalBackend
from pytriton._serving.plan import LaunchPlan
from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonServerError,
)
from pytriton.inprocess import _lib
from pytriton.server.process import TritonServerProcess

LOGGER = logging.getLogger(__name__)
LOG_FILE_NAME = "tritonserver.log"
_LOG_TAIL_BYTES = 256 << 10
# How long stop() waits, after the last stub has exited, for Triton to log that the models unloaded.
_UNLOAD_LOG_WAIT_S = 1.0
# Triton's own exit timeout for the final ServerStop, once every model has unloaded (or cannot).
_STOP_EXIT_TIMEOUT_S = 1

# The stubs inherit this process's environment; inprocess.Server already puts the stub's python3
# first on PATH and this libpython first on LD_LIBRARY_PATH for as long as it runs.
_SERVER_MANAGED_VARIABLES = frozenset({"PATH", "LD_LIBRARY_PATH"})
_ENVIRON_LOCK = threading.Lock()


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
    found = []
    for pid in proc.children(os.getpid(), running_only=True):  # a zombie holds nothing any more
        words = proc.cmdline(pid)
        if not words:
            continue
        is_stub = words[0].endswith("triton_python_backend_stub")
        if is_stub and any(word.startswith(prefix) for word in words for prefix in repository_prefixes):
            found.append(pid)
    return found


class EmbeddedServer(TritonServerProcess):
    """Triton's server library in this process, behind the interface of :class:`TritonServerProcess`.

    Built from a :class:`~pytriton._serving.plan.LaunchPlan` (rendered as in-process options; the log goes
    to ``log_path`` when given). Lifetime: :meth:`start` creates the :class:`pytriton.inprocess.Server`
    (the plan's start-up models are loaded before it returns); :meth:`stop` unloads every model, waits (at most
    ``grace_s``) for in-flight batches and for the stubs to exit, then stops and frees the server.
    Both are idempotent. ``pid`` is this process's id while the server runs, because that is the
    stubs' parent (``Triton`` tells a stub that died from one whose server died by it).
    ``register_on_exit`` callbacks are never called: the server cannot die on its own.
    """

    def __init__(
        self,
        plan: LaunchPlan,
        env: Dict[str, str],
        *,
        log_path: Optional[pathlib.Path] = None,
        log_buffer_lines: int = 2000,
    ):
        super().__init__(plan.to_argv(), env, log_path=log_path, log_buffer_lines=log_buffer_lines)
        self._options = (
            plan if log_path is None else dataclasses.replace(plan, log_file=log_path)
        ).to_inprocess_options()
        repositories = self._options.model_repository
        paths = [repositories] if isinstance(repositories, str) else list(repositories)
        self._repository_prefixes = [os.path.abspath(path).rstrip("/") + "/" for path in paths]
        self._root = plan.binary.parent.parent  # <install>/bin/tritonserver
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
        server._tracks_scratch = False  # LocalBackend finds the directory (pytriton/_serving/launched.py)
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


class EmbeddedBackend(LocalBackend):
    """Triton's server library in this process (``Triton(embedded=True)``): no ports, no network endpoints.

    The same plan, watchdog, shared-memory guard and scratch directory as the launched binary
    (:class:`~pytriton._serving.launched.LocalBackend`); the server is an :class:`EmbeddedServer`, models are
    loaded through the library, and the server never dies on its own, so it is never restarted.
    """

    # Triton's library loads the start-up models inside one call that nothing can interrupt: a stub
    # waiting for a worker process that failed would hold it forever, so the workers are ready first.
    starts_beside_workers = False

    def _new_server(self, plan: LaunchPlan, env: Dict[str, str]) -> TritonServerProcess:
        # Triton's log goes to the configured file, else to one in the workspace (server_log reads
        # it), not to this process's standard error.
        log_path = self._config.log_file or self._site.workspace.subdir("embedded") / LOG_FILE_NAME
        return EmbeddedServer(plan, env, log_path=log_path)

    def _watchdog_group(self, server: TritonServerProcess) -> int:
        return 0  # no server process group to kill: the stubs are this process's children

    def _probe(self) -> Callable[[], bool]:
        return lambda: True  # EmbeddedServer.wait_until asks the library instead

    def repository_request(self, action: str, model_name: str) -> None:
        """A model-repository call (``load``/``unload``) on the in-process server."""
        server = self._server
        if not isinstance(server, EmbeddedServer) or server is self._stopped:
            raise PyTritonInvalidOperationError("The embedded Triton server is not running.")
        if action == "load":
            server.load(model_name)
        else:
            server.unload(model_name)

    def stop(self, hooks: StopHooks, running: bool) -> None:
        """No network endpoints, so nothing to drain: unload, wait for the batches in flight, stop."""
        server = self._server
        self._stopped = server
        if server is not None:
            server.stop(grace_s=self._settings.exit_timeout_s, wait_idle=hooks.wait_detached)

    def _no_network(self, what: str) -> PyTritonInvalidOperationError:
        return PyTritonInvalidOperationError(
            f"Triton(embedded=True) has no network endpoints, so no {what}: call models with "
            "triton.client(name) or triton.model(name)."
        )

    def http_url(self) -> str:
        raise self._no_network("http_url")

    def grpc_url(self) -> str:
        raise self._no_network("grpc_url")

    def access_token(self) -> Optional[str]:
        return None  # no network endpoint, so nothing needs a token

    def endpoints_line(self) -> str:
        return "Triton runs embedded in this process: no network endpoints"

    def inprocess_server(self, not_running: Optional[str]) -> inprocess.Server:
        server = self._server
        inner = server.server if isinstance(server, EmbeddedServer) else None
        if inner is None or not_running is not None:
            raise PyTritonInvalidOperationError(f"The embedded Triton is {not_running or 'not running'}.")
        return inner


def check_embedded_flag(embedded: Any) -> bool:
    """Validate ``Triton(embedded=...)``."""
    if not isinstance(embedded, bool):
        raise PyTritonBadParameterError(f"embedded must be a bool, got {embedded!r}.")
    return embedded
