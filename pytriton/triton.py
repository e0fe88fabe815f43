"""``Triton``: bind Python callables and serve them with a real ``tritonserver``.

Typical use::

    with Triton() as triton:
        triton.bind("Identity", infer_fn, inputs=[Tensor(shape=(-1,), dtype=np.float32)],
                    outputs=[Tensor(shape=(-1,), dtype=np.float32)])
        triton.serve()

Resource contract: ``run()`` starts one ``tritonserver`` process (which starts one stub process per
model instance), one worker thread per model instance (a worker process for models bound with
``instance_kind="process"``), a small watchdog process, unix sockets in a
private directory and shared-memory segments named ``pytriton-<pid>-<token>-*``. ``stop()`` (also
called by ``__exit__``, ``serve()`` on SIGINT/SIGTERM, and at interpreter exit) removes all of it;
if the process is killed, the watchdog and the kernel (``PR_SET_PDEATHSIG``) remove it. With
``Triton(embedded=True)`` the server runs inside this process instead (``pytriton/_embedded.py``).

Unit tests (no server): tests/unit/test_self_healing.py (lifecycle states, restart budget, bind
validation), tests/unit/test_security.py (token and restrictions), tests/unit/test_check.py (the
endpoints line), tests/unit/test_server_environment.py, tests/unit/test_triton_config.py; with a
server: tests/e2e/.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import http.client
import logging
import os
import pathlib
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from pytriton import _embedded, _endpoints, _healing, _registry
from pytriton._healing import _State
from pytriton._plan import LaunchPlan
from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonInvalidOperationError,
    PyTritonModelAlreadyBoundError,
    PyTritonModelConfigError,
    PyTritonServerError,
    PyTritonValidationError,
)
from pytriton.model_config.model_config import ModelConfig
from pytriton.model_config.tensor import Tensor
from pytriton.proxy import _tracing
from pytriton.proxy._binding import (
    BindingContext,
    BoundModel,
    backend_region_prefix,
    short_socket_dir,
    validate_model_name,
)
from pytriton.proxy._context import TritonContext, attach_context
from pytriton.proxy.stubside import _segments, _stub_bytes
from pytriton.server import _allocator
from pytriton.server._restarts import RestartPolicy
from pytriton.server._scratch import ScratchDirTracker
from pytriton.server._shm_guard import ShmGuard
from pytriton.server.command import LaunchSettings
from pytriton.server.distribution import (
    check_python_supported,
    find_server,
    shared_libpython_dir,
    stub_environment,
)
from pytriton.server.process import (
    TritonServerProcess,
)
from pytriton.server.security import (  # noqa: F401  (the constants are importable from here, as in NVIDIA PyTriton)
    DEFAULT_PROTECTED_ENDPOINTS,
    TRITON_ACCESS_HEADER,
    VALID_TRITON_ENDPOINTS,
    AccessPolicy,
    TritonSecurityConfig,
)
from pytriton.server.settings import EXIT_TIMEOUT_S, RECYCLE_BYTE_SIZE, RECYCLE_IDLE_S  # noqa: F401 - kept names
from pytriton.server.settings import resolve as resolve_settings
from pytriton.server.triton_config import TritonConfig
from pytriton.server.workspace import Workspace, cleanup_paths

if TYPE_CHECKING:
    from pytriton._remote import RemoteTriton

__all__ = ["RemoteTriton", "Triton", "TritonConfig", "TritonLifecyclePolicy", "TritonSecurityConfig", "Workspace"]

LOGGER = logging.getLogger(__name__)  # "pytriton.triton", a documented name
MONITORING_PERIOD_S = 5.0
MONITORING_PERIOD_SEC = MONITORING_PERIOD_S  # the name before NVIDIA PyTriton 0.4
STARTUP_TIMEOUT_S = _healing.STARTUP_TIMEOUT_S
# glibc malloc arenas of tritonserver and its stubs (TritonConfig.server_malloc_arena_max).
SERVER_MALLOC_ARENA_MAX = 1
_WATCHDOG = pathlib.Path(__file__).parent / "server" / "_watchdog.py"


def _say(message: str) -> None:
    """One line on stderr for a user whose program configured no logging (see ``serve``)."""
    print(f"pytriton: {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class TritonLifecyclePolicy:
    """When the server starts and where its model store lives (NVIDIA PyTriton's names and defaults).

    Args:
        launch_triton_on_startup: NVIDIA PyTriton starts the server when the ``Triton`` context is
            entered. pytriton starts it in :meth:`Triton.run` in both cases (models bound before
            then are loaded at start-up, models bound later are loaded live), so either value serves
            the same models.
        local_model_store: the model store is a directory of this process's workspace. pytriton
            always writes the store locally (``TritonConfig.model_repository`` or the workspace).

    Both flags are validated and kept (:attr:`Triton.triton_lifecycle_policy`). ``RemoteTriton``
    (a server started elsewhere) needs ``launch_triton_on_startup=False`` and reads
    ``local_model_store``: shared repository, or files sent with each load (docs/remote.md).
    """

    launch_triton_on_startup: bool = True
    local_model_store: bool = False

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if not isinstance(getattr(self, field.name), bool):
                raise PyTritonBadParameterError(
                    f"TritonLifecyclePolicy.{field.name} must be a bool, got {getattr(self, field.name)!r}."
                )


class Triton(_endpoints.ServerEndpoints, _healing.SelfHealing, _embedded.EmbeddedTriton):
    """A Triton Inference Server serving bound Python callables.

    Args:
        config: server settings; fields left ``None`` fall back to ``PYTRITON_TRITON_CONFIG_*``
            environment variables, then to defaults.
        workspace: directory for the model repository and other files (see :class:`Workspace`);
            a temporary one under ``$PYTRITON_HOME`` when ``None``. Removed by :meth:`stop`.
        security_config: which endpoints need an access token (see :class:`TritonSecurityConfig`).
            ``None``: the model-repository, shared-memory, statistics, trace and logging endpoints
            need a generated token (:meth:`get_access_token`); inference, health, metadata and
            model configs stay open.
        triton_lifecycle_policy: accepted for compatibility with NVIDIA PyTriton (see
            :class:`TritonLifecyclePolicy`); ``None`` means the defaults.
        max_server_restarts: how many times ``tritonserver`` is restarted at once after dying on
            its own within ``restart_window_s`` seconds; further crashes in that window are
            restarted after a delay that doubles up to 0.5 s. A server that had been serving is
            always restarted (requests can crash Triton 2.51; docs/security.md); pytriton gives up
            only when 3 starts in a row fail (see :meth:`serve`). 0 disables restarts: the first
            crash ends :meth:`serve`.
        restart_window_s: the window for ``max_server_restarts``.
        embedded: run Triton inside this process (``pytriton.inprocess``) instead of launching the
            ``tritonserver`` binary: no ports, no network endpoints, no server restarts; call bound
            models with :meth:`client` or :meth:`model` (docs/inprocess.md, "Embedded Triton").
    """

    def __init__(
        self,
        *,
        config: Optional[TritonConfig] = None,
        workspace: Union[Workspace, str, pathlib.Path, None] = None,
        triton_lifecycle_policy: Optional[TritonLifecyclePolicy] = None,
        security_config: Optional[TritonSecurityConfig] = None,
        max_server_restarts: int = 5,
        restart_window_s: float = 60.0,
        embedded: bool = False,
    ):
        check_python_supported()  # no backend stub for this Python: fail now, not at run()
        if isinstance(max_server_restarts, bool) or not isinstance(max_server_restarts, int) or max_server_restarts < 0:
            raise PyTritonBadParameterError(f"max_server_restarts must be an int >= 0, got {max_server_restarts!r}.")
        if (
            isinstance(restart_window_s, bool)
            or not isinstance(restart_window_s, (int, float))
            or restart_window_s <= 0
        ):
            raise PyTritonBadParameterError(f"restart_window_s must be a positive number, got {restart_window_s!r}.")
        if triton_lifecycle_policy is not None and not isinstance(triton_lifecycle_policy, TritonLifecyclePolicy):
            raise PyTritonBadParameterError(
                f"triton_lifecycle_policy must be a TritonLifecyclePolicy, got {type(triton_lifecycle_policy).__name__}."
            )
        self.triton_lifecycle_policy = triton_lifecycle_policy or TritonLifecyclePolicy()
        self._embedded = _embedded.check_embedded_flag(embedded)
        # Everything this instance runs with, resolved once (server/settings.py): the explicit
        # config over PYTRITON_TRITON_CONFIG_* and PYTRITON_*_SPIN_US over defaults, frozen.
        self._settings = resolve_settings(config)
        self._config = self._settings.config  # the merged copy, for the command line; read only
        # OpenTelemetry trace mode: stubs forward trace contexts (docs/tracing.md); per-model settings by name.
        self._tracing = _tracing.enabled(self._config.trace_config) and not self._embedded
        self._trace_settings: Dict[str, Dict[str, Any]] = {}
        if self._tracing:
            _tracing.configure_export(self._config.trace_config)  # where unconfigured processes send spans
        if security_config is not None and not isinstance(security_config, TritonSecurityConfig):
            raise PyTritonBadParameterError(
                f"security_config must be a TritonSecurityConfig, got {type(security_config).__name__}."
            )
        self._security = security_config if security_config is not None else TritonSecurityConfig()
        self._access = AccessPolicy(self._config, self._security)  # also validates the config's own restrictions
        self._workspace = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
        self._token = secrets.token_hex(4)
        self._pid = os.getpid()
        self._shm_prefix = _segments.shm_prefix(self._pid, self._token)
        # (name, version) -> model; the versions of one name share its config.pbtxt and its generation.
        self._models: Dict[Tuple[str, int], BoundModel] = {}
        self._server: Optional[TritonServerProcess] = None
        self._lock = threading.RLock()
        self._wakeup = threading.Event()
        self._state = _State.CREATED
        self._socket_dir: Optional[pathlib.Path] = None
        self._watchdog_fd: Optional[int] = None
        self._watchdog: Optional[subprocess.Popen[bytes]] = None
        self._repository: Optional[pathlib.Path] = None
        self._model_counter = 0
        self._stub_numpy2 = False
        self._scratch = ScratchDirTracker()  # the Python backend's /tmp directory (server/_scratch.py)
        self._shm_guard = ShmGuard(backend_region_prefix(self._shm_prefix))  # 0600 backend regions (security)
        # Self-healing (docs/architecture.md): a supervisor thread restarts a dead server and
        # replaces dead stubs, one event at a time.
        # Delays restarts after repeated crashes, gives up only on a server that cannot start (server/_restarts.py).
        self._restart_policy = RestartPolicy(max_server_restarts, float(restart_window_s))
        self._launch: Optional[Tuple[LaunchPlan, Dict[str, str]]] = None
        self._events: queue.Queue[Tuple[str, Any]] = queue.Queue()
        self._supervisor: Optional[threading.Thread] = None
        self._restarts = 0
        self._restarting = False
        self._healing: Set[str] = set()  # names of models whose stubs are being replaced
        self._failure: Optional[PyTritonServerError] = None
        self._startup_models: List[str] = []
        # Giving grown Python-backend regions back (server/_recycle.py): model -> when it was recycled.
        self._recycled_at: Dict[str, float] = {}
        self.triton_context = TritonContext()
        # Even a Triton that is never run owns a workspace (and, once a model is bound, a socket
        # directory): make sure interpreter exit removes them. stop() unregisters this.
        atexit.register(self.stop)

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> Triton:
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()

    # -- binding ---------------------------------------------------------------------------
    def _binding_context(self) -> BindingContext:
        if self._socket_dir is None:
            self._socket_dir = short_socket_dir(self._pid, self._token)
        assert self._socket_dir is not None
        return BindingContext(
            user_pid=self._pid,
            shm_prefix=self._shm_prefix,
            socket_dir=self._socket_dir,
            on_unrecoverable=self._on_unrecoverable,
            max_request_bytes=self._settings.max_request_bytes,
            on_stub_lost=self._on_stub_lost,
            polling=self._settings.polling,
            metrics=self._settings.callable_metrics,
            tracing=self._tracing,
        )

    def bind(
        self,
        model_name: str,
        infer_func: Union[Callable[..., Any], Sequence[Callable[..., Any]]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: Optional[ModelConfig] = None,
        strict: bool = False,
        trace_config: Optional[List[str]] = None,
        *,
        instance_kind: str = "thread",
    ) -> None:
        """Serve ``infer_func`` as version ``model_version`` of model ``model_name``.

        ``infer_func`` receives a ``List[Request]`` and returns one dict of output arrays per
        request (or yields such lists, for ``decoupled`` models). A list of callables creates one
        model instance per callable. Binding after :meth:`run` loads the model into the running
        server before returning. ``strict=True`` also checks output dtypes and shapes.

        Several versions of one name may be bound, each with its own callable(s); Triton serves
        all of them, and a client that names no version gets the highest. Triton keeps one
        configuration per name, so every version must declare the same inputs, outputs,
        ``ModelConfig`` and number of instances (``PyTritonValidationError`` otherwise). Binding a
        version of a name that is already served reloads the name: its other versions get new
        stubs, and keep serving while the new ones start.

        ``trace_config``: this model's own trace settings, ``setting=value`` strings as in
        ``TritonConfig.trace_config`` but only ``level``, ``rate`` and ``count`` (e.g.
        ``["level=TIMESTAMPS", "rate=1"]``); the server must trace in OpenTelemetry mode
        (``TritonConfig(trace_config=["mode=opentelemetry", ...])``). See docs/tracing.md.
        ``instance_kind="process"`` runs each instance's callable in a worker process of its own
        instead of a thread of this process, so pure-Python work of several instances runs in
        parallel. The callable must then be picklable (a module-level function, an object of a
        module-level class, ``functools.partial`` of those; decorators included), which is checked
        here; see docs/architecture.md, "Instances: threads or processes".

        Raises:
            PyTritonModelAlreadyBoundError: this name and version are already bound.
        """
        validate_model_name(model_name)
        trace_settings = self._model_trace_settings(model_name, trace_config)
        with self._lock:
            if self._state is _State.STOPPED:
                raise PyTritonInvalidOperationError("This Triton instance is stopped; create a new one to bind models.")
            if (model_name, model_version) in self._models:
                raise PyTritonModelAlreadyBoundError(
                    f"Model {model_name!r} version {model_version} is already bound; "
                    "bind another model_version to serve several versions of one name."
                )
            self._model_counter += 1
            model = BoundModel(
                index=self._model_counter,
                model_name=model_name,
                model_version=model_version,
                infer_funcs=infer_func,
                inputs=inputs,
                outputs=outputs,
                config=config if config is not None else ModelConfig(),
                strict=strict,
                context=self._binding_context(),
                instance_kind=instance_kind,
            )
            siblings = self._versions(model_name)
            if siblings:
                problem = model.incompatibility(siblings[0])
                if problem:
                    raise PyTritonValidationError(
                        f"Model {model_name!r} version {model_version} differs from version {siblings[0].version}, "
                        f"which is already bound: {problem}. Triton keeps one configuration per model name, so "
                        "every version must declare the same inputs, outputs, ModelConfig and number of instances."
                    )
                model.generation = siblings[0].generation
            key = (model_name, model.version)
            self._models[key] = model
            self._attach_context(model)
            if trace_settings is not None:
                self._trace_settings[model_name] = trace_settings
            if self._state is _State.RUNNING:
                try:
                    self._load_live(model)
                except BaseException:
                    del self._models[key]
                    if not siblings:
                        self._trace_settings.pop(model_name, None)
                    model.stop_workers()
                    assert self._repository is not None
                    if siblings:
                        model.remove_version_files(self._repository)
                        self._write_name(model_name)  # the served versions' config again
                    else:
                        model.remove_files(self._repository)
                    raise

    def unbind(self, model_name: str, model_version: Optional[int] = None) -> None:
        """Stop serving one version of ``model_name`` (``model_version``), or all of them (``None``).

        On a running server the other versions of the name keep serving: Triton loads the name
        again with the remaining versions (new stubs for them, next to the old ones until those
        are unloaded), and a client that names no version then gets the highest remaining one.
        Unbinding the last version unloads the model. The callables' worker threads stop once
        their batches in flight have finished (at most ``exit_timeout_secs``).

        Raises:
            PyTritonInvalidOperationError: the name (or that version of it) is not bound, or this
                ``Triton`` is stopped.
        """
        with self._lock:
            if self._state is _State.STOPPED:
                raise PyTritonInvalidOperationError("This Triton instance is stopped.")
            versions = self._versions(model_name)
            removed = [m for m in versions if model_version is None or m.version == model_version]
            if not removed:
                what = f"version {model_version} of model" if model_version is not None else "model"
                raise PyTritonInvalidOperationError(f"No {what} {model_name!r} is bound.")
            remaining = [m for m in versions if m not in removed]
            for model in removed:
                del self._models[(model.name, model.version)]
            if self._state is _State.RUNNING:
                assert self._repository is not None
                if remaining:
                    for model in removed:
                        model.remove_version_files(self._repository)
                    failure = self._load_next_generation(model_name)
                    if failure is not None:
                        LOGGER.error("Model %s: reloading its remaining versions failed: %s", model_name, failure)
                else:
                    self._clear_trace_settings(model_name)
                    self._repository_request("unload", model_name)
            if not remaining:
                self._trace_settings.pop(model_name, None)
            deadline = time.monotonic() + self._settings.exit_timeout_s
            if self._state is _State.RUNNING and not remaining:
                self._wait_detached(removed, deadline)
            while any(model.busy for model in removed) and time.monotonic() < deadline:
                time.sleep(0.01)
            for model in removed:
                model.stop_workers()
                if self._repository is not None:
                    model.remove_version_files(self._repository)
            if not remaining and self._repository is not None:
                removed[0].remove_files(self._repository)

    def _versions(self, model_name: str) -> List[BoundModel]:
        """The bound versions of ``model_name``, lowest first."""
        return sorted((m for (name, _), m in self._models.items() if name == model_name), key=lambda m: m.version)

    def _model_names(self) -> List[str]:
        """Each bound model name once, in binding order."""
        return list(dict.fromkeys(name for name, _ in self._models))

    def _write_name(self, model_name: str) -> None:
        """Write the repository files of every bound version of ``model_name`` (one shared config.pbtxt)."""
        assert self._repository is not None
        versions = self._versions(model_name)
        numbers = [model.version for model in versions]
        for model in versions:
            model.write_repository(self._repository, numbers)

    def _attach_context(self, model: BoundModel) -> None:
        """Let decorators find the model config: ``__triton_context__`` on each callable (or its instance)."""
        for func in model.infer_funcs:
            attach_context(func, self.triton_context, model.config)

    def _check_stub_support(self, model: BoundModel) -> None:
        if self._stub_numpy2 and model.has_bytes_tensors:
            problem = _stub_bytes.numpy2_problem()  # the stub runs with this process's numpy
            if problem:
                raise PyTritonBadParameterError(
                    f"Model {model.name!r} declares BYTES (string) tensors, which Triton's Python backend stub "
                    f"cannot handle here: {problem}"
                )

    def _load_live(self, model: BoundModel) -> None:
        assert self._repository is not None
        self._check_stub_support(model)
        versions = self._versions(model.name)
        if len(versions) > 1:
            # Triton reloads the served versions too: their new stubs need their own slot locks.
            for version in versions:
                version.generation += 1
        try:
            self._write_name(model.name)
            model.start_workers()
            self._scratch.before_first_load()
            loaded = False
            try:
                self._request_load(model.name)
                loaded = True
            finally:
                self._claim_scratch(loaded)
        except BaseException:
            if len(versions) > 1:
                for version in versions:
                    version.generation -= 1  # the served versions keep their running stubs
            raise

    @staticmethod
    def _warmup(model: BoundModel) -> bool:
        return bool(model.config.model_warmup or model.direct_warmup)

    def _request_load(self, model_name: str) -> None:
        for version in self._versions(model_name):
            version.run_direct_warmup()  # warmups Triton cannot express (model_config/warmup.py)
        try:
            self._repository_request("load", model_name)
        except (http.client.HTTPException, OSError) as exc:
            raise self._load_interrupted(model_name, exc) from None
        self._apply_trace_settings([model_name])
        _segments.make_private(backend_region_prefix(self._shm_prefix))  # the stub did; this is a second line
        server = self._server
        if server is not None:
            server.cap_memory()  # the model's instances added threads: the cap follows (server/process.py)

    def _load_interrupted(self, model_name: str, exc: BaseException) -> PyTritonModelConfigError:
        """The error for a load whose connection broke: usually the server died while loading the model."""
        server = self._server
        deadline = time.monotonic() + 2.0
        while server is not None and server.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)  # a crashing server takes a moment to be reaped
        died = server is not None and not server.is_alive()
        message = f"Triton could not load model {model_name!r}: " + (
            "tritonserver died while loading it" if died else f"the connection broke ({type(exc).__name__}: {exc})"
        )
        versions = self._versions(model_name)
        if died and versions and versions[0].config.model_warmup:
            message += (
                ". Triton 2.51 sometimes crashes when a model's warmup fails; the callable's error, if it "
                "raised one, is logged by 'pytriton.proxy'"
            )
        if died and self._state is _State.RUNNING and self._supervisor is not None:
            message += "; pytriton restarts the server with the other models"
        return PyTritonModelConfigError(message + ".")

    @staticmethod
    def _wait_detached(models: Sequence[BoundModel], deadline: float) -> bool:
        """Wait until no stub of ``models`` is attached (or ``deadline``); True if none is.

        Triton's unload call returns once the model stops taking requests, while its stubs are still
        finishing and exiting. Loading the same name again before they have gone races their
        teardown inside the server, so an unload followed by a load waits here in between.
        """
        while any(model.connected for model in models):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    # -- lifecycle -------------------------------------------------------------------------
    def run(self) -> None:
        """Start the server with every bound model and return once all of them are ready."""
        with self._lock:
            if self._state is _State.STOPPED:
                raise PyTritonInvalidOperationError("This Triton instance is stopped; create a new one.")
            if self._state is _State.RUNNING:
                return
            started = time.monotonic()
            distribution = find_server(self._config.tritonserver_dir)
            libpython = shared_libpython_dir()
            stub_env = stub_environment()
            self._stub_numpy2 = stub_env.numpy2
            for model in self._models.values():
                self._check_stub_support(model)
            if not self._embedded:
                self._check_ports()
            _segments.sweep_dead_owners()
            self._binding_context()
            self._repository = self._config.model_repository or self._workspace.subdir("model-store")
            self._repository.mkdir(parents=True, exist_ok=True)
            for name in self._model_names():
                self._write_name(name)
            for model in self._models.values():
                model.start_workers()
            # Models with a warmup are loaded through the repository API once the server is up, not
            # with --load-model: when a warmup fails at start-up, Triton 2.51 sometimes crashes on its
            # way out (SIGSEGV) instead of printing the warmup's error; the load API reports it.
            warm = [name for name in self._model_names() if any(self._warmup(v) for v in self._versions(name))]
            startup = [name for name in self._model_names() if name not in warm]
            plan = LaunchPlan.build(
                distribution.binary,
                self._config,
                LaunchSettings(
                    model_repository=self._repository,
                    backend_directory=distribution.backend_dir,
                    cache_directory=distribution.cache_dir,
                    shm_region_prefix=backend_region_prefix(self._shm_prefix),
                    startup_models=startup,
                    access=self._access,
                ),
            )
            plan = dataclasses.replace(plan, log_file=None)  # the server process (or embedded) writes it
            if self._settings.drain_delay_s > 0 and not self._embedded:  # Triton must not end the drain first
                plan = plan.with_exit_timeout_at_least(self._settings.drain_delay_s + self._settings.exit_timeout_s)
            env = _server_environment(
                stub_env.bin_dir,
                [libpython, *distribution.library_dirs],
                malloc_arena_max=self._config.server_malloc_arena_max,
                allocator=self._config.server_allocator,
            )
            self._launch = (plan, env)
            self._startup_models = startup
            self._server = self._new_server(plan, env)  # the binary, or the library in this process
            self._server.register_on_exit(self._on_server_exit)
            self._state = _State.RUNNING
            _registry.register(self)  # its models become reachable from callables (docs/pipelines.md)
            if self._models:
                self._scratch.before_first_load()
            try:
                self._shm_guard.start()
                self._server.start()
                self._start_watchdog()
                came_up = self._wait_ready_or_crashed()
                if came_up:
                    for name in warm:
                        self._request_load(name)
                    self._apply_trace_settings(startup)
            except BaseException:
                self._claim_scratch(False)
                self.stop()
                raise
            self._claim_scratch(came_up)
            _segments.make_private(backend_region_prefix(self._shm_prefix))  # the stubs did; a second line
            self._supervisor = threading.Thread(
                target=self._supervise, name=f"pytriton-supervisor-{self._token}", daemon=True
            )
            self._supervisor.start()
            LOGGER.info("Triton ready with %d model(s) in %.2f s", len(self._models), time.monotonic() - started)
            LOGGER.info("%s", self._endpoints_line())

    def _claim_scratch(self, loaded: bool) -> None:
        """End the first-load window; hand a claimed scratch directory to the watchdog as well."""
        known = self._scratch.path
        path = self._scratch.after_first_load(loaded)
        if path is not None and path != known:
            self._tell_watchdog(f"scratch {path}")

    def _start_watchdog(self) -> None:
        assert self._server is not None and self._server.pid is not None
        read_fd, write_fd = os.pipe()
        paths = [str(self._socket_dir)]
        owned = cleanup_paths(self._workspace)
        if owned is not None:
            paths.append(str(owned))
        self._watchdog = subprocess.Popen(  # noqa: S603
            [
                sys.executable,
                "-S",
                str(_WATCHDOG),
                str(read_fd),
                str(0 if self._embedded else self._server.pid),  # 0: no server process group to kill
                self._shm_prefix,
                *paths,
            ],
            pass_fds=(read_fd,),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        os.close(read_fd)
        os.set_inheritable(write_fd, False)
        self._watchdog_fd = write_fd

    def serve(
        self, monitoring_period_s: float = MONITORING_PERIOD_S, *, monitoring_period_sec: Optional[float] = None
    ) -> None:
        """Run the server and block until SIGINT/SIGTERM, an unrecoverable error or a fatal server failure.

        A server that dies on its own is restarted, with a short delay after repeated crashes (see
        ``max_server_restarts``); while it restarts, ``serve()`` keeps waiting. Always stops the server before returning.
        ``monitoring_period_s`` (a positive number; ``monitoring_period_sec`` is accepted as its
        older name) is how often the waiting thread checks for a fatal failure.

        Raises:
            PyTritonServerError: the server could not be started again (3 failed starts in a
                row), or it died with restarts turned off (``max_server_restarts=0``); raised after
                everything was stopped, so a program ending here exits with a non-zero status.
        """
        if monitoring_period_sec is not None:
            monitoring_period_s = monitoring_period_sec
        if (
            isinstance(monitoring_period_s, bool)
            or not isinstance(monitoring_period_s, (int, float))
            or not monitoring_period_s > 0
        ):
            raise PyTritonBadParameterError(
                f"monitoring_period_s must be a positive number, got {monitoring_period_s!r}."
            )
        self.run()
        previous: Dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[int(signum)] = signal.signal(signum, lambda *_: self._wakeup.set())
        # serve() is how a program runs a server from a terminal: where logging is not configured, the
        # lines a user needs (where it listens, that it stopped) would be lost, so they go to stderr.
        console = not LOGGER.hasHandlers()
        try:
            if console:
                models = ", ".join(sorted({name for name, _ in self._models})) or "none"
                _say(f"{self._endpoints_line()}; models: {models}. Ctrl-C to stop.")
            while not self._wakeup.wait(monitoring_period_s):
                if self._failure is not None:
                    break
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
            started = time.monotonic()
            self.stop()
            if console:
                _say(f"stopped in {time.monotonic() - started:.2f} s")
        if self._failure is not None:
            raise self._failure

    def is_alive(self) -> bool:
        """True while the server runs (not being restarted) and every bound model can serve.

        A model can serve while each of its instances has a stub attached and its stubs are not
        being replaced; a model whose live load is still in progress does not count yet.
        """
        with self._lock:
            return (
                self._state is _State.RUNNING
                and not self._restarting
                and self._failure is None
                and self._server is not None
                and self._server.is_alive()
                and not self._healing
                and all(model.serving for model in self._models.values())
            )

    @property
    def server_restarts(self) -> int:
        """How many times ``tritonserver`` was restarted after dying on its own."""
        return self._restarts

    def stop(self) -> bool:
        """Drain and stop the server, then release every resource. Idempotent; safe from any thread.

        The drain (docs/architecture.md, "Graceful drain"): readiness fails for new connections at
        once; requests keep being served for ``TritonConfig.drain_delay_secs`` (default 0); then
        new requests are refused with HTTP 503 / gRPC UNAVAILABLE while the batches in flight
        finish, for at most ``exit_timeout_secs``; then the server is ended. An idle server stops
        in about 0.1 s plus the drain delay.

        Returns:
            True if this call stopped the instance, False if it was already stopped.
        """
        with self._lock:
            if self._state is _State.STOPPED:
                return False
            self._state = _State.STOPPED
            server = self._server  # a restart in progress starts no further server once stopped
        atexit.unregister(self.stop)
        _registry.unregister(self)
        started = time.monotonic()
        self._events.put(("stop", None))
        if server is not None and self._embedded:  # no network endpoints: nothing to drain
            server.stop(grace_s=self._settings.exit_timeout_s, wait_idle=self._wait_models_detached)
        elif server is not None:
            held = self._hold_http() if server.is_alive() else None  # before the SIGINT (server/_drain.py)
            try:
                server.stop(grace_s=self._settings.drain_delay_s + self._settings.exit_timeout_s, wait_idle=self._drain)
            finally:
                if held is not None:
                    held.close()
        supervisor = self._supervisor
        if supervisor is not None and supervisor is not threading.current_thread():
            supervisor.join(10.0)  # ends within moments once the server is gone (its waits check the state)
            if supervisor.is_alive():
                LOGGER.warning("The pytriton supervisor thread did not end; leaving it behind.")
        if self._server is not None and self._server is not server:
            self._server.stop(grace_s=0.0)  # started by a restart right before stop()
        self._scratch.remove()
        self._shm_guard.stop()
        for model in self._models.values():
            model.stop_workers()
        _segments.sweep_segments(self._shm_prefix)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        self._workspace.clean()
        self._release_watchdog()
        self._wakeup.set()
        LOGGER.debug("Triton stopped in %.2f s", time.monotonic() - started)
        return True

    def _release_watchdog(self) -> None:
        if self._watchdog_fd is not None:
            try:
                os.write(self._watchdog_fd, b"done\n")
            finally:
                os.close(self._watchdog_fd)
                self._watchdog_fd = None
        if self._watchdog is not None:
            try:
                self._watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
            self._watchdog = None

    def _tell_watchdog(self, line: str) -> None:
        if self._watchdog_fd is not None:
            with contextlib.suppress(OSError):
                os.write(self._watchdog_fd, f"{line}\n".encode())

    def _on_unrecoverable(self, exc: BaseException) -> None:
        LOGGER.error("Unrecoverable error in an inference callable (%s); stopping Triton.", exc)
        self._wakeup.set()
        threading.Thread(target=self.stop, name="pytriton-unrecoverable-stop", daemon=True).start()

    # -- introspection ---------------------------------------------------------------------
    def get_access_token(self) -> Optional[str]:
        """The token restricted endpoints require (``None`` when the security config restricts nothing).

        Clients send it with ``access_token=``; raw HTTP clients as the ``triton-access-token`` header,
        gRPC clients as ``triton-grpc-protocol-triton-access-token`` metadata. ``None`` for
        ``Triton(embedded=True)``: it has no network endpoint, so nothing needs a token.
        """
        return None if self._embedded else self._security.access_token

    @property
    def server_log(self) -> List[str]:
        """The last lines the server printed."""
        return self._server.log_lines if self._server is not None else []

    @property
    def http_url(self) -> str:
        """``http://host:port`` of the HTTP endpoint."""
        self._no_network("http_url")
        return f"http://{self._settings.http.client_host}:{self._settings.http.port}"

    @property
    def grpc_url(self) -> str:
        """``grpc://host:port`` of the gRPC endpoint."""
        self._no_network("grpc_url")
        return f"grpc://{self._settings.grpc.client_host}:{self._settings.grpc.port}"


def _server_environment(
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
    existing = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(path) for path in library_dirs] + ([existing] if existing else []))
    if sys.platform != "linux":
        raise PyTritonServerError("pytriton runs tritonserver on Linux only.")
    return env


def __getattr__(name: str) -> Any:
    """``RemoteTriton`` is defined on top of ``Triton`` (pytriton/_remote.py) and importable from here,
    as in NVIDIA PyTriton; imported on first use, since that module imports this one."""
    if name == "RemoteTriton":
        from pytriton._remote import RemoteTriton

        return RemoteTriton
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
