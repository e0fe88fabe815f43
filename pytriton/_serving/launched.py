"""Server backends on this machine: the launched ``tritonserver`` binary, and the base it shares with embedded mode.

:class:`LocalBackend` owns what a server started by this process needs, whichever way it runs: the
launch plan (pytriton/_serving/plan.py) and the server's environment, the server object, the watchdog process
that cleans up if this process is killed (_platform/watchdog.py), the guard that keeps the Python
backend's shared-memory regions private (server/_shm_guard.py) and the Python backend's scratch
directory (server/_scratch.py). :class:`LaunchedBackend` runs the plan as the ``tritonserver`` binary
and talks to it over its network endpoints (:class:`pytriton._serving.endpoints.ServerEndpoints`);
:class:`pytriton._serving.embedded.EmbeddedBackend` runs it in this process.

Resource lifetimes: :meth:`LocalBackend.start` starts the server, the watchdog and the guard;
:meth:`LocalBackend.stop` ends the server (after the drain); :meth:`LocalBackend.release` ends a server
a restart started meanwhile, ends a first-load window that a failed start left open (the server has ended by
then), removes the scratch directory, stops the guard and tells the watchdog that
everything is clean. Unit tests: tests/unit/test_backends.py, tests/unit/test_restarts.py (restarts
with a fake server), tests/unit/test_server_environment.py; with a server: tests/e2e/test_lifecycle.py,
test_healing.py, test_drain.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
import subprocess
import sys
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from pytriton._platform import hardening
from pytriton._platform import paths as _paths
from pytriton._platform import watchdog as _watchdog_script
from pytriton._serving.backend import Registry, StopHooks
from pytriton._serving.endpoints import STARTUP_TIMEOUT_S, ServerEndpoints
from pytriton._serving.plan import LaunchPlan
from pytriton.exceptions import PyTritonServerError
from pytriton.proxy._binding import BindingContext, BoundModel, WorkerStarts, backend_region_prefix
from pytriton.proxy.stubside import _segments, _stub_print
from pytriton.server import _allocator
from pytriton.server._scratch import ScratchDirTracker
from pytriton.server._shm_guard import ShmGuard
from pytriton.server.command import LaunchSettings
from pytriton.server.distribution import ServerDistribution, find_server, shared_libpython_dir, stub_environment
from pytriton.server.process import TritonServerProcess
from pytriton.server.security import AccessPolicy
from pytriton.server.settings import Settings
from pytriton.server.workspace import Workspace, cleanup_paths

if TYPE_CHECKING:
    pass

# glibc malloc arenas of tritonserver and its stubs (TritonConfig.server_malloc_arena_max).
LOGGER = logging.getLogger("pytriton.triton")
SERVER_MALLOC_ARENA_MAX = 1
_WATCHDOG = pathlib.Path(_watchdog_script.__file__)  # run as a script (python -S), never imported there


def server_environment(
    stub_bin: pathlib.Path,
    library_dirs: List[pathlib.Path],
    malloc_arena_max: Optional[int] = None,
    allocator: Optional[str] = None,
) -> Dict[str, str]:
    """Environment of the server: the stub's python3 first on PATH, this libpython first to load.

    ``malloc_arena_max`` (``None``: :data:`SERVER_MALLOC_ARENA_MAX`; 0: glibc's own default) sets
    ``MALLOC_ARENA_MAX`` for the server and its stubs only, unless your environment sets it.
    ``allocator`` (``TritonConfig.server_allocator``) picks the ``malloc`` preloaded into the server
    and its stubs (pytriton/server/_allocator.py: jemalloc when installed, by default).
    """
    env = dict(os.environ)
    _allocator.preload(env, _allocator.resolve(allocator))
    arenas = SERVER_MALLOC_ARENA_MAX if malloc_arena_max is None else malloc_arena_max
    if arenas > 0:
        # With one malloc arena, the heap the server grew for large tensors is trimmed back when they
        # are freed; with glibc's per-thread arenas it stayed 38 MiB up after 1 KiB-8 MiB traffic
        # (docs/architecture.md, "Memory after large requests").
        env.setdefault("MALLOC_ARENA_MAX", str(arenas))
    # The stub's embedded interpreter must see its own environment only.
    for name in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"):
        env.pop(name, None)
    env["PATH"] = os.pathsep.join([str(stub_bin), env.get("PATH", "")])
    # What a backend instance's callable prints comes back to this process's stdout/stderr
    # through the server's output (proxy/stubside/_stub_print.py).
    env[_stub_print.FORWARD_VARIABLE] = "1"
    existing = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(path) for path in library_dirs] + ([existing] if existing else []))
    if sys.platform != "linux":
        raise PyTritonServerError("pytriton runs tritonserver on Linux only.")
    return env


def _checked(probe: Callable[[], bool], check: Callable[[], None]) -> Callable[[], bool]:
    """``probe`` that first calls ``check``, which raises to end the wait (a worker that failed to start)."""

    def probed() -> bool:
        check()
        return probe()

    return probed


@dataclasses.dataclass(frozen=True)
class Site:
    """Where a ``Triton`` keeps its things: what a backend needs to name and clean them."""

    settings: Settings
    workspace: Workspace
    shm_prefix: str  # pytriton-<pid>-<token>: every segment this Triton creates starts with it


class LocalBackend:
    """What a server started by this process needs, however it runs (see the module doc).

    The concrete backends provide :meth:`_new_server`, :meth:`_watchdog_group` and the network parts.
    """

    loads_at_startup = True
    region_prefix: Optional[str]
    offers_pipelines = True
    # The server starts while worker processes load their callables (WorkerStarts); False where the
    # wait for the server cannot look at the workers, so they must be ready before it starts.
    starts_beside_workers = True

    def __init__(self, site: Site, access: AccessPolicy) -> None:
        self._site = site
        self._settings = site.settings
        self._config = site.settings.config
        self._access = access
        self._prefix = backend_region_prefix(site.shm_prefix)  # the Python backend's regions: <prefix>-pb...
        self.region_prefix = self._prefix
        self._server: Optional[TritonServerProcess] = None
        self._stopped: Optional[TritonServerProcess] = None  # the server stop() ended
        self._launch: Optional[Tuple[LaunchPlan, Dict[str, str]]] = None
        self._distribution: Optional[ServerDistribution] = None
        self._registry: Optional[Registry] = None
        self._on_exit: Optional[Callable[[int], None]] = None
        self.scratch = ScratchDirTracker()  # the Python backend's /tmp directory (server/_scratch.py)
        self._shm_guard = ShmGuard(self._prefix)  # 0600 backend regions (security)
        self.watchdog: Optional[subprocess.Popen[bytes]] = None
        self._watchdog_fd: Optional[int] = None
        self._stub_bin: Optional[pathlib.Path] = None
        self._library_dirs: List[pathlib.Path] = []

    # -- overridden by the concrete backends ----------------------------------------------------
    def _new_server(self, plan: LaunchPlan, env: Dict[str, str]) -> TritonServerProcess:
        raise NotImplementedError

    def _watchdog_group(self, server: TritonServerProcess) -> int:
        """The process group the watchdog kills if this process dies (0: none)."""
        raise NotImplementedError

    def _check_environment(self) -> None:
        """Backend-specific checks of :meth:`prepare` (ports)."""

    def _final_plan(self, plan: LaunchPlan) -> LaunchPlan:
        """The plan as this backend runs it."""
        return plan

    def _probe(self) -> Callable[[], bool]:
        raise NotImplementedError

    # -- ServerBackend ---------------------------------------------------------------------------
    @property
    def server(self) -> Optional[TritonServerProcess]:
        return self._server

    def attach(self, registry: Registry) -> None:
        self._registry = registry

    def prepare(self, timeout_s: Optional[float] = None) -> bool:
        self._distribution = find_server(self._config.tritonserver_dir)
        libpython = shared_libpython_dir()
        stub_env = stub_environment()
        self._stub_bin = stub_env.bin_dir
        self._library_dirs = [libpython, *self._distribution.library_dirs]
        self._check_environment()
        _segments.sweep_dead_owners()
        return stub_env.numpy2

    def model_store(self, workspace: Workspace) -> pathlib.Path:
        if self._config.model_repository is None:
            return workspace.subdir("model-store")
        # The stub runs what is written there as this user: only this user may change it (docs/security.md).
        return _paths.private_directory(self._config.model_repository, "model repository")

    def binding_context(self, context: BindingContext) -> BindingContext:
        return context

    def start(
        self,
        repository: pathlib.Path,
        startup_models: List[str],
        has_models: bool,
        socket_dir: pathlib.Path,
        workers: WorkerStarts,
    ) -> bool:
        distribution = self._distribution
        assert distribution is not None and self._stub_bin is not None, "prepare() first"
        if not self.starts_beside_workers:
            workers.wait()
        plan = LaunchPlan.build(
            distribution.binary,
            self._config,
            LaunchSettings(
                model_repository=repository,
                backend_directory=distribution.backend_dir,
                cache_directory=distribution.cache_dir,
                shm_region_prefix=self._prefix,
                startup_models=startup_models,
                access=self._access,
                triton_version=distribution.version,
            ),
        )
        plan = self._final_plan(dataclasses.replace(plan, log_file=None))  # the server object writes the log
        env = server_environment(
            self._stub_bin,
            self._library_dirs,
            malloc_arena_max=self._config.server_malloc_arena_max,
            allocator=self._config.server_allocator,
        )
        # One mode for this run, restarts included (TritonConfig.hardening, else PYTRITON_HARDENING).
        env[hardening.ENV] = hardening.resolve(self._config.hardening)
        self._launch = (plan, env)
        server = self._new_server(plan, env)
        server.register_on_exit(self._server_exited)
        self._server = server
        if has_models:
            self.scratch.before_first_load()
        guarded = env[hardening.ENV] != hardening.OFF and self._shm_guard.start()
        server.start()
        self._report_protections(server, env[hardening.ENV], guarded)
        self._start_watchdog(server, socket_dir)
        try:
            self.wait_ready(server, "Triton failed to start", workers.check)
            return True
        except PyTritonServerError as exc:
            # Its start-up models had loaded (Triton listens only after that), so a death now is a crash,
            # typically a request that killed it while a client polled readiness faster than the probe:
            # report it like any crash (the server reports no exit before it was seen ready).
            returncode = getattr(server, "returncode", None)  # the in-process server has none
            if not getattr(server, "listening", False) or returncode is None:
                raise
            LOGGER.error("tritonserver died right after it came up (%s); restarting it.", exc)
            self._server_exited(returncode)
            return False

    def started(self) -> None:
        self.after_load(True)
        _segments.make_private(self._prefix)  # the stubs did; a second line

    def before_load(self) -> None:
        self.scratch.before_first_load()

    def after_load(self, loaded: bool) -> None:
        """End the first-load window; hand a claimed scratch directory to the watchdog as well."""
        known = self.scratch.path
        # A start that failed once the Python backend was up (a warmup that fails, a worker that cannot
        # load its callable, a crash right after listening) made its directory all the same.
        server = self._server
        initialized = server is not None and server.python_backend_started
        path = self.scratch.after_first_load(loaded or initialized)
        if path is not None and path != known:
            self._tell_watchdog(f"scratch {path}")

    def loaded(self) -> None:
        _segments.make_private(self._prefix)  # the stub did; this is a second line
        server = self._server
        if server is not None:
            server.cap_memory()  # the model's instances added threads: the cap follows (server/process.py)

    def is_serving(self) -> bool:
        server = self._server
        return server is not None and server.is_alive()

    def stub_loss_is_ours(self, server_pid: int) -> bool:
        """Otherwise its server died or was replaced, and restarting the server handles it."""
        server = self._server
        return server is not None and server.pid == server_pid and server.is_alive()

    def on_exit(self, callback: Callable[[int], None]) -> None:
        self._on_exit = callback

    def _server_exited(self, returncode: int) -> None:
        callback = self._on_exit
        if callback is not None:
            callback(returncode)

    def wait_ready(self, server: TritonServerProcess, what: str, check: Optional[Callable[[], None]] = None) -> None:
        probe = self._probe()
        server.wait_until(probe if check is None else _checked(probe, check), STARTUP_TIMEOUT_S, what)

    def server_log(self) -> List[str]:
        return self._server.log_lines if self._server is not None else []

    def release(self, models: List[BoundModel], repository: Optional[pathlib.Path]) -> None:
        server = self._server
        if server is not None and server is not self._stopped:
            server.stop(grace_s=0.0)  # started by a restart right before stop()
        # A start that failed (a worker that could not load its callable, a failed warmup) leaves the first-load
        # window open until here: a server still starting when the failure was seen can initialize its Python
        # backend, making its directory, until it is ended. Now it has ended and its log was read to the end,
        # so whether it made one is known.
        self.after_load(False)
        self.scratch.remove()
        self._shm_guard.stop()
        self._release_watchdog()

    # -- the watchdog ----------------------------------------------------------------------------
    def _report_protections(self, server: TritonServerProcess, mode: str, guarded: bool) -> None:
        """Record the shared-memory guard beside the launch's protections; one DEBUG line says which are active."""
        protections = server.protections or hardening.Protections(mode)
        if mode == hardening.OFF:
            protections.skipped(hardening.SHM_GUARD)
        elif guarded:
            protections.applied(hardening.SHM_GUARD)
        else:
            # Not fatal even under strict: the seccomp filter (active, or strict had refused the start) covers it.
            protections.skipped(hardening.SHM_GUARD, "inotify is unavailable here")
        LOGGER.debug("Protections of this server: %s", protections.summary())

    def _start_watchdog(self, server: TritonServerProcess, socket_dir: pathlib.Path) -> None:
        read_fd, write_fd = os.pipe()
        paths = [str(socket_dir)]
        owned = cleanup_paths(self._site.workspace)
        if owned is not None:
            paths.append(str(owned))
        self.watchdog = subprocess.Popen(  # noqa: S603
            [
                sys.executable,
                "-S",
                str(_WATCHDOG),
                str(read_fd),
                str(self._watchdog_group(server)),
                self._site.shm_prefix,
                *paths,
            ],
            pass_fds=(read_fd,),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        os.close(read_fd)
        os.set_inheritable(write_fd, False)
        self._watchdog_fd = write_fd

    def _release_watchdog(self) -> None:
        if self._watchdog_fd is not None:
            try:
                os.write(self._watchdog_fd, b"done\n")
            finally:
                os.close(self._watchdog_fd)
                self._watchdog_fd = None
        if self.watchdog is not None:
            try:
                self.watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
            self.watchdog = None

    def _tell_watchdog(self, line: str) -> None:
        if self._watchdog_fd is not None:
            with contextlib.suppress(OSError):
                os.write(self._watchdog_fd, f"{line}\n".encode())


class LaunchedBackend(LocalBackend):
    """The ``tritonserver`` binary, in a session of its own, reached over its network endpoints.

    It can die on its own (requests can crash Triton 2.51): the supervisor then calls
    :meth:`replace_server`, which starts the same plan again (without models unbound meanwhile).
    """

    def __init__(self, site: Site, access: AccessPolicy, token: Optional[str]) -> None:
        super().__init__(site, access)
        self.endpoints = ServerEndpoints(site.settings, access)
        self._token = token  # TritonSecurityConfig.access_token: None when nothing is restricted

    def _new_server(self, plan: LaunchPlan, env: Dict[str, str]) -> TritonServerProcess:
        return TritonServerProcess(
            plan.to_argv(), env, log_path=self._config.log_file, data_headroom=self._settings.server_data_headroom
        )

    def _watchdog_group(self, server: TritonServerProcess) -> int:
        assert server.pid is not None
        return server.pid

    def _check_environment(self) -> None:
        self.endpoints.check_ports()

    def _final_plan(self, plan: LaunchPlan) -> LaunchPlan:
        drain_delay_s = self._settings.drain_delay_s
        if drain_delay_s > 0:  # Triton must not end the drain first
            plan = plan.with_exit_timeout_at_least(drain_delay_s + self._settings.exit_timeout_s)
        return plan

    def _probe(self) -> Callable[[], bool]:
        return self.endpoints.ready_probe()

    def replace_server(self, model_names: List[str]) -> TritonServerProcess:
        """End the dead server's process group and leftovers, then start the plan again loading ``model_names``.

        ``model_names``: the models the new server loads at its start (``--load-model``), whether
        they were bound before the first start or loaded live since (the supervisor passes the
        bound models without a warmup; it loads the others through the repository API after).

        Called by the supervisor under the registry's lock, after it checked that ``Triton`` still runs.
        """
        old = self._server
        assert old is not None and self._launch is not None
        old.stop(grace_s=0.0)  # idempotent; also ends a replacement that failed to start
        # A replacement that failed to start left its first-load window open: it may have made its Python
        # backend's directory until it ended, just now (the same rule as a failed first start, release()).
        self.after_load(False)
        self.scratch.remove()  # the dead server's /tmp/python_env_* (server/_scratch.py)
        _segments.sweep_segments(f"{self._site.shm_prefix}-pb")  # its Python-backend regions
        plan, env = self._launch
        plan = plan.loading(model_names)
        server = TritonServerProcess(
            plan.to_argv(), env, log_path=self._config.log_file, data_headroom=self._settings.server_data_headroom
        )
        server.register_on_exit(self._server_exited)
        self.scratch = ScratchDirTracker()
        if model_names:
            self.scratch.before_first_load()
        server.start()
        self._server = server
        self._tell_watchdog(f"pgid {server.pid}")
        return server

    def repository_request(self, action: str, model_name: str) -> None:
        self.endpoints.repository_request(action, model_name)

    def send_trace_settings(self, model_name: str, settings: Dict[str, object]) -> None:
        self.endpoints.send_trace_settings(model_name, settings)

    def pending_requests(self) -> Dict[Tuple[str, str], int]:
        return self.endpoints.pending_requests()

    def stop(self, hooks: StopHooks, running: bool) -> None:
        """SIGINT after the drain (server/_drain.py), with an idle connection held so that Triton keeps serving."""
        server = self._server
        self._stopped = server
        if server is None:
            return
        held = self.endpoints.hold_http() if server.is_alive() else None  # before the SIGINT (server/_drain.py)
        try:
            server.stop(grace_s=self._settings.drain_delay_s + self._settings.exit_timeout_s, wait_idle=hooks.drain)
        finally:
            if held is not None:
                held.close()

    def http_url(self) -> str:
        return f"http://{self._settings.http.client_host}:{self._settings.http.port}"

    def grpc_url(self) -> str:
        return f"grpc://{self._settings.grpc.client_host}:{self._settings.grpc.port}"

    def access_token(self) -> Optional[str]:
        return self._token

    def endpoints_line(self) -> str:
        return self.endpoints.endpoints_line()
