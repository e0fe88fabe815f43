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
``Triton(embedded=True)`` the server runs inside this process instead (``pytriton/_serving/embedded.py``);
``RemoteTriton`` binds into a server started elsewhere (``pytriton/_serving/remote.py``).
"""

# For maintainers (kept out of the API reference):
# Structure (docs/architecture.md, "The serving core"): ``Triton`` is the model registry (bind,
# unbind, versions, the repository files) and the public methods; where the server runs is its
# :class:`~pytriton._serving.backend.ServerBackend` (launched binary, embedded library or remote server),
# chosen once by the constructor; restarts, stub replacement, memory recycling and the drain are its
# :class:`~pytriton._serving.supervisor.Supervisor`.
# Unit tests (no server): tests/unit/test_self_healing.py (lifecycle states, restart budget, bind
# validation), tests/unit/test_backends.py (the three backends behind Triton),
# tests/unit/test_security.py (token and restrictions), tests/unit/test_check.py (the endpoints line),
# tests/unit/test_server_environment.py, tests/unit/test_triton_config.py; with a server: tests/e2e/.

from __future__ import annotations

import atexit
import http.client
import logging
import os
import pathlib
import secrets
import shutil
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Union

from pytriton._serving import running as _running
from pytriton._serving.backend import InProcessServer, LocalServer, ServerBackend, State
from pytriton._serving.endpoints import STARTUP_TIMEOUT_S  # noqa: F401 - a kept name
from pytriton._serving.launched import SERVER_MALLOC_ARENA_MAX, LaunchedBackend, Site  # noqa: F401 - a kept name
from pytriton._serving.models import (
    BoundModels,
    RegistryView,
    attach_thread_context,
    check_stub_support,
    has_warmup,
    load_interrupted,
    retire,
)
from pytriton._serving.policy import (
    REMOTE_LIFECYCLE_POLICY,
    TritonLifecyclePolicy,
    lifecycle_policy,
    restart_policy,
)
from pytriton._serving.remote import TRANSPORTS, RemoteBackend, TcpOptions  # noqa: F401  (TRANSPORTS: a kept name)
from pytriton._serving.signals import StopSignals
from pytriton._serving.supervisor import Supervisor
from pytriton._serving.trace_settings import ModelTraceSettings
from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonInvalidOperationError,
    PyTritonModelAlreadyBoundError,
)
from pytriton.model_config.model_config import ModelConfig
from pytriton.model_config.tensor import Tensor
from pytriton.proxy._binding import (
    BindingContext,
    BoundModel,
    WorkerStarts,
    check_owner_forwarded,
    short_socket_dir,
    validate_model_name,
)
from pytriton.proxy._context import TritonContext
from pytriton.proxy._process import refuse_in_worker
from pytriton.proxy.stubside import _segments
from pytriton.server._restarts import RestartPolicy
from pytriton.server.distribution import check_python_supported, pytriton_home
from pytriton.server.process import raise_open_files_limit
from pytriton.server.security import (  # noqa: F401  (the constants are importable from here, as in NVIDIA PyTriton)
    DEFAULT_PROTECTED_ENDPOINTS,
    TRITON_ACCESS_HEADER,
    VALID_TRITON_ENDPOINTS,
    AccessPolicy,
    TritonSecurityConfig,
)
from pytriton.server.settings import EXIT_TIMEOUT_S, RECYCLE_BYTE_SIZE, RECYCLE_IDLE_S, Settings  # noqa: F401 - kept names
from pytriton.server.settings import resolve as resolve_settings
from pytriton.server.triton_config import TritonConfig
from pytriton.server.workspace import Workspace

if TYPE_CHECKING:
    from pytriton import inprocess

# What importing pytriton.inprocess sets (see there): Triton(embedded=True) imports it only when
# constructed, which may come after the program's first gRPC call; this module comes before it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__all__ = ["RemoteTriton", "Triton", "TritonConfig", "TritonLifecyclePolicy", "TritonSecurityConfig", "Workspace"]

LOGGER = logging.getLogger(__name__)  # "pytriton.triton", a documented name
MONITORING_PERIOD_S = 5.0
MONITORING_PERIOD_SEC = MONITORING_PERIOD_S  # the name before NVIDIA PyTriton 0.4


def _say(message: str) -> None:
    """One line on stderr for a user whose program configured no logging (see ``serve``)."""
    print(f"pytriton: {message}", file=sys.stderr, flush=True)


class Triton:
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
        restarts = restart_policy(max_server_restarts, restart_window_s)
        policy = lifecycle_policy(triton_lifecycle_policy, TritonLifecyclePolicy())
        if embedded is not False:
            # The in-process server's modules only where it is asked for: a program that launches the
            # binary (and its stubs and worker processes, which import this module again) skips them.
            from pytriton._serving.embedded import check_embedded_flag

            embedded = check_embedded_flag(embedded)
        if security_config is not None and not isinstance(security_config, TritonSecurityConfig):
            raise PyTritonBadParameterError(
                f"security_config must be a TritonSecurityConfig, got {type(security_config).__name__}."
            )
        security = security_config if security_config is not None else TritonSecurityConfig()
        # Everything this instance runs with, resolved once (server/settings.py): the explicit
        # config over PYTRITON_TRITON_CONFIG_* and PYTRITON_*_SPIN_US over defaults, frozen.
        settings = resolve_settings(config)
        access = AccessPolicy(settings.config, security)  # also validates the config's own restrictions

        def backend(site: Site) -> ServerBackend:
            if not embedded:
                return LaunchedBackend(site, access, security.access_token)
            from pytriton._serving.embedded import EmbeddedBackend

            return EmbeddedBackend(site, access)

        self._setup(settings, workspace, policy, backend, restarts)

    def _setup(
        self,
        settings: Settings,
        workspace: Union[Workspace, str, pathlib.Path, None],
        policy: TritonLifecyclePolicy,
        make_backend: Callable[[Site], ServerBackend],
        restart_policy: RestartPolicy,
    ) -> None:
        """The state every ``Triton`` has, whichever backend it serves through (``RemoteTriton`` calls it too)."""
        self.triton_lifecycle_policy = policy
        self._settings = settings
        self._config = settings.config  # the merged copy, for the command line; read only
        self._workspace = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
        self._token = secrets.token_hex(4)
        self._pid = os.getpid()
        self._shm_prefix = _segments.shm_prefix(self._pid, self._token)
        self._backend = make_backend(Site(settings, self._workspace, self._shm_prefix))
        # The server on this host, started by this process (launched or embedded), if it is: its scratch
        # directory, regions, process and log are ours to watch (a remote server's are not).
        self._local = self._backend if isinstance(self._backend, LocalServer) else None
        # OpenTelemetry trace mode: stubs forward trace contexts (docs/tracing.md); per-model settings by name.
        self._traces = ModelTraceSettings(self._backend, self._config.trace_config)
        # (name, version) -> model; the versions of one name share its config.pbtxt and its generation.
        self._models = BoundModels()
        self._lock = threading.RLock()
        self._wakeup = threading.Event()
        self._state = State.CREATED
        self._socket_dir: Optional[pathlib.Path] = None
        self._repository: Optional[pathlib.Path] = None
        self._model_counter = 0
        self._stub_numpy2 = False
        self._startup_models: List[str] = []
        self._connect_timeout_s: Optional[float] = None  # connect(timeout_s=...) for a server started elsewhere
        view = RegistryView(self)
        self._backend.attach(view)
        # Self-healing and the drain (docs/architecture.md): a supervisor thread restarts a dead server
        # and replaces dead stubs, one event at a time; restarts are delayed after repeated crashes.
        self._supervisor = Supervisor(
            view, self._backend, settings, restart_policy, name=f"pytriton-supervisor-{self._token}"
        )
        self.triton_context = TritonContext()
        # Even a Triton that is never run owns a workspace (and, once a model is bound, a socket
        # directory): make sure interpreter exit removes them. stop() unregisters this.
        atexit.register(self.stop)

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> Triton:
        """Start the server when the lifecycle policy says so (the default, as NVIDIA PyTriton 0.7 does).

        A model bound inside the block is then loaded into the running server before ``bind``
        returns; ``run()`` and ``serve()`` find the server running. With
        ``TritonLifecyclePolicy(launch_triton_on_startup=False)`` the server starts at ``run()``.
        """
        if self.triton_lifecycle_policy.launch_triton_on_startup:
            try:
                self.run()
            except BaseException:
                self.stop()  # __exit__ is not called when __enter__ raises: release the workspace here
                raise
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()

    # -- binding ---------------------------------------------------------------------------
    def _binding_context(self) -> BindingContext:
        if self._socket_dir is None:
            self._socket_dir = short_socket_dir(self._pid, self._token)
        assert self._socket_dir is not None
        return self._backend.binding_context(
            BindingContext(
                user_pid=self._pid,
                shm_prefix=self._shm_prefix,
                socket_dir=self._socket_dir,
                on_unrecoverable=self._on_unrecoverable,
                max_request_bytes=self._settings.max_request_bytes,
                on_stub_lost=self._supervisor.on_stub_lost,
                polling=self._settings.polling,
                metrics=self._settings.callable_metrics,
                tracing=self._traces.enabled,
                bytecode_dir=pytriton_home() / "bytecode",  # the stub package's, kept between runs
            )
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
        ``instance_kind="backend"`` runs it inside the server's stub process itself (no hop; same
        pickling rules); docs/binding.md says when to pick which kind.

        Raises:
            PyTritonModelAlreadyBoundError: this name and version are already bound.
        """
        validate_model_name(model_name)
        trace_settings = self._traces.parse(model_name, trace_config, bool(self._versions(model_name)))
        # Only a server launched here has endpoint flags of ours: a remote server's flags are its own, and
        # an embedded server has no endpoints (callers set the parameter).
        if config is not None and isinstance(self._backend, LaunchedBackend):
            check_owner_forwarded(
                config.sequence_batcher,
                self._config.http_header_forward_pattern,
                self._config.grpc_header_forward_pattern,
                model_name,
            )
        with self._lock:
            if self._state is State.STOPPED:
                raise PyTritonInvalidOperationError("This Triton instance is stopped; create a new one to bind models.")
            if (model_name, model_version) in self._models:  # before a BoundModel is built (admit checks again)
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
            siblings = self._models.admit(model)  # checked against the versions already bound
            key = (model_name, model.version)
            attach_thread_context(model, self.triton_context)
            if trace_settings is not None:
                self._traces.by_name[model_name] = trace_settings
            if self._state is State.RUNNING:
                try:
                    self._load_live(model)
                except BaseException:
                    del self._models[key]
                    if not siblings:
                        self._traces.by_name.pop(model_name, None)
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
            if self._state is State.STOPPED:
                raise PyTritonInvalidOperationError("This Triton instance is stopped.")
            versions = self._versions(model_name)
            removed = [m for m in versions if model_version is None or m.version == model_version]
            if not removed:
                what = f"version {model_version} of model" if model_version is not None else "model"
                raise PyTritonInvalidOperationError(f"No {what} {model_name!r} is bound.")
            remaining = [m for m in versions if m not in removed]
            for model in removed:
                del self._models[(model.name, model.version)]
            if self._state is State.RUNNING:
                assert self._repository is not None
                if remaining:
                    for model in removed:
                        model.remove_version_files(self._repository)
                    failure = self._supervisor.load_next_generation(model_name)
                    if failure is not None:
                        LOGGER.error("Model %s: reloading its remaining versions failed: %s", model_name, failure)
                else:
                    self._traces.clear(model_name)
                    self._backend.repository_request("unload", model_name)
            if not remaining:
                self._traces.by_name.pop(model_name, None)
            deadline = time.monotonic() + self._settings.exit_timeout_s
            retire(removed, bool(remaining), self._repository, deadline, self._state is State.RUNNING)

    def _versions(self, model_name: str) -> List[BoundModel]:
        return self._models.versions(model_name)

    def _model_names(self) -> List[str]:
        return self._models.names()

    def _write_name(self, model_name: str) -> None:
        assert self._repository is not None
        self._models.write_name(self._repository, model_name)

    def _load_live(self, model: BoundModel) -> None:
        assert self._repository is not None
        check_stub_support(model, self._stub_numpy2)
        versions = self._versions(model.name)
        if len(versions) > 1:
            # Triton reloads the served versions too: their new stubs need their own slot locks.
            for version in versions:
                version.generation += 1
        try:
            self._write_name(model.name)
            model.start_workers()
            if self._local is not None:
                self._local.before_load()
            loaded = False
            try:
                self._request_load(model.name)
                loaded = True
            finally:
                if self._local is not None:
                    self._local.after_load(loaded)
            # A restarted server loads it at its start with the others (--load-model), as if it had
            # been bound before run(): in the soak's crash probes (make soak-short) a restarted 2.51
            # that loaded them one by one through the repository API died (SIGSEGV) in 3 of 3 runs,
            # and did not when it loaded them at its start. One with a warmup is loaded through the
            # repository API, as at the first start (run()).
            if model.name not in self._startup_models and not any(has_warmup(v) for v in self._versions(model.name)):
                self._startup_models.append(model.name)
        except BaseException:
            if len(versions) > 1:
                for version in versions:
                    version.generation -= 1  # the served versions keep their running stubs
            raise

    def _request_load(self, model_name: str) -> None:
        for version in self._versions(model_name):
            version.run_direct_warmup()  # warmups Triton cannot express (model_config/warmup.py)
        try:
            self._backend.repository_request("load", model_name)
        except (http.client.HTTPException, OSError) as exc:
            server = self._local.server if self._local is not None else None
            restarted = self._state is State.RUNNING and self._supervisor.active()
            raise load_interrupted(model_name, exc, server, self._versions(model_name), restarted) from None
        self._traces.apply([model_name])
        if self._local is not None:
            self._local.loaded()

    # -- lifecycle -------------------------------------------------------------------------
    def run(self) -> None:
        """Start the server with every bound model and return once all of them are ready (and the
        metrics endpoint, when on, accepts connections: Triton opens it last).

        Worker processes (``instance_kind="process"``) load their callables while the server starts.
        On any failure this ``Triton`` is stopped (the server, workers, sockets and segments are gone)
        before the error is raised; a worker process that cannot load its callable raises
        ``pytriton.proxy._process.WorkerStartError`` (a ``PyTritonBadParameterError``) as soon as it fails.
        """
        refuse_in_worker()  # the user's main module, rerun where a callable is loaded: no second server
        with self._lock:
            if self._state is State.STOPPED:
                raise PyTritonInvalidOperationError(
                    f"This {type(self).__name__} instance is stopped; create a new one."
                )
            if self._state is State.RUNNING:
                return
            started = time.monotonic()
            # Every descriptor a frontend's idle connections take is one a restart of the server
            # cannot have (docs/architecture.md, "Self-healing"): use the hard limit.
            raise_open_files_limit()
            self._stub_numpy2 = self._backend.prepare(self._connect_timeout_s)
            for model in self._models.values():
                check_stub_support(model, self._stub_numpy2)
            self._binding_context()
            assert self._socket_dir is not None
            self._repository = self._backend.model_store(self._workspace)
            self._repository.mkdir(parents=True, exist_ok=True)
            for name in self._model_names():
                self._write_name(name)
            # Worker processes load their callables while the server starts (WorkerStarts): the
            # backend's wait for the server also fails at once for a worker that could not.
            workers = WorkerStarts(list(self._models.values()))
            for model in self._models.values():
                model.start_workers(wait=False)
            startup, later = self._models.split_start(self._backend.loads_at_startup)  # warmups: later
            self._startup_models = startup
            self._state = State.RUNNING
            if self._backend.offers_pipelines:
                _running.register(self)  # its models become reachable from callables (docs/pipelines.md)
            try:
                came_up = self._backend.start(self._repository, startup, bool(self._models), self._socket_dir, workers)
                workers.wait()  # at once for the start-up models (their stubs said hello); the later ones load next
                if came_up:  # else it died right after it came up: the supervisor restarts it (_serving/launched.py)
                    for name in later:
                        self._request_load(name)
                    self._traces.apply(startup)
            except BaseException:
                # stop() ends the first-load window of the scratch directory (LocalBackend.release), once the
                # server has ended: its Python backend may still create the directory after this failure.
                self.stop()
                raise
            if came_up:
                self._backend.started()
            elif self._local is not None:
                self._local.after_load(False)
            self._supervisor.start()
            LOGGER.info("Triton ready with %d model(s) in %.2f s", len(self._models), time.monotonic() - started)
            LOGGER.info("%s", self._endpoints_line())

    def _endpoints_line(self) -> str:
        """One line: where the server is reached and which endpoint groups need the token."""
        return self._backend.endpoints_line()

    def serve(
        self, monitoring_period_s: float = MONITORING_PERIOD_S, *, monitoring_period_sec: Optional[float] = None
    ) -> None:
        """Run the server and block until SIGINT/SIGTERM, an unrecoverable error or a fatal server failure.

        A server that dies on its own is restarted, with a short delay after repeated crashes (see
        ``max_server_restarts``); while it restarts, ``serve()`` keeps waiting. Always stops the server before returning.
        ``monitoring_period_s`` (a positive number; ``monitoring_period_sec`` is accepted as its
        older name) is how often the waiting thread checks for a fatal failure.

        Raises:
            PyTritonServerError: the server could not be started again (8 failed attempts in a
                row, retried after 0.5 s doubling to 4 s: a transient failure such as ``EMFILE``
                is survived), or it died with restarts turned off (``max_server_restarts=0``); raised
                after everything was stopped, so a program ending here exits with a non-zero status
                and its process manager can start it afresh. The reason is logged as one ERROR line.
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
        signals = StopSignals(self._wakeup)  # SIGINT/SIGTERM wake the wait below (_serving/signals.py)
        try:
            self.run()
            signals.starting = False
            # serve() is how a program runs a server from a terminal: where logging is not configured, the
            # lines a user needs (where it listens, that it stopped) would be lost, so they go to stderr.
            console = not LOGGER.hasHandlers()
            try:
                if console:
                    models = ", ".join(sorted({name for name, _ in self._models})) or "none"
                    _say(f"{self._endpoints_line()}; models: {models}. Ctrl-C to stop.")
                while not self._wakeup.wait(monitoring_period_s):
                    if self._supervisor.failure is not None:
                        break
            finally:
                signals.restore()  # before stop(): a second Ctrl-C interrupts a stop as it always did
                started = time.monotonic()
                self.stop()
                # The stop line either way: on stderr, or through the logging the program configured.
                if console:
                    _say(f"stopped in {time.monotonic() - started:.2f} s")
                else:
                    LOGGER.info("Triton stopped in %.2f s", time.monotonic() - started)
        finally:
            signals.restore()
        failure = self._supervisor.failure
        if failure is not None:
            raise failure

    def connect(self, timeout_s: Optional[float] = None) -> None:
        """Start the server, or connect to it, with every bound model: :meth:`run`, by NVIDIA PyTriton's name.

        ``timeout_s``: for a ``RemoteTriton``, how long to wait for the server at its URL (default
        30 s; ``PyTritonServerError`` naming the URL after it); a launched or embedded server's start
        has its own bound.
        """
        if timeout_s is not None:
            self._connect_timeout_s = timeout_s
        self.run()

    def is_connected(self) -> bool:
        """True from :meth:`run` (or :meth:`connect`, or entering the context) until :meth:`stop`."""
        with self._lock:
            return self._state is State.RUNNING

    def is_alive(self) -> bool:
        """True while the server runs (not being restarted) and every bound model can serve.

        A model can serve while each of its instances has a stub attached and its stubs are not
        being replaced; a model whose live load is still in progress does not count yet. Before
        :meth:`run`, True only while nothing is bound and the server answers already: a
        ``RemoteTriton``'s server, which runs elsewhere (NVIDIA PyTriton answers the same).
        """
        with self._lock:
            supervisor = self._supervisor
            unstarted = self._state is State.CREATED and not self._models
            healthy = unstarted or (
                self._state is State.RUNNING
                and not supervisor.restarting
                and supervisor.failure is None
                and not supervisor.healing
                and all(model.serving for model in self._models.values())
            )
        # Before run() only the server is asked (launched and embedded: none yet, so False).
        return healthy and self._backend.is_serving()  # a remote server is asked over the network: not under the lock

    @property
    def server_restarts(self) -> int:
        """How many times ``tritonserver`` was restarted after dying on its own."""
        return self._supervisor.restarts

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
            if self._state is State.STOPPED:
                return False
            running = self._state is State.RUNNING
            self._state = State.STOPPED  # a restart in progress starts no further server once stopped
        atexit.unregister(self.stop)
        _running.unregister(self)
        started = time.monotonic()
        self._supervisor.request_stop()
        self._backend.stop(self._supervisor, running)  # the drain, then the server ends (a remote one stays)
        self._supervisor.join()
        models = list(self._models.values())
        for model in models:
            model.stop_workers()
        _segments.sweep_segments(self._shm_prefix)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        self._workspace.clean()
        self._backend.release(models, self._repository)
        self._wakeup.set()
        LOGGER.debug("Triton stopped in %.2f s", time.monotonic() - started)
        return True

    def _on_unrecoverable(self, exc: BaseException) -> None:
        LOGGER.error("Unrecoverable error in an inference callable (%s); stopping Triton.", exc)
        self._wakeup.set()
        threading.Thread(target=self.stop, name="pytriton-unrecoverable-stop", daemon=True).start()

    # -- introspection ---------------------------------------------------------------------
    def get_access_token(self) -> Optional[str]:
        """The token restricted endpoints require (``None`` when the security config restricts nothing).

        Clients send it with ``access_token=``; raw HTTP clients as the ``triton-access-token`` header,
        gRPC clients as ``triton-grpc-protocol-triton-access-token`` metadata. ``None`` for
        ``Triton(embedded=True)``: it has no network endpoint, so nothing needs a token. For
        ``RemoteTriton``: the token given for the server's restricted endpoints.
        """
        return self._backend.access_token()

    @property
    def server_log(self) -> List[str]:
        """The last lines the server printed (always empty for ``RemoteTriton``: the output is its owner's)."""
        return self._local.server_log() if self._local is not None else []

    @property
    def http_url(self) -> str:
        """``http://host:port`` of the HTTP endpoint (``RemoteTriton``: the URL given, when it is an HTTP one)."""
        return self._backend.http_url()

    @property
    def grpc_url(self) -> str:
        """``grpc://host:port`` of the gRPC endpoint (``RemoteTriton``: the URL given, when it is a gRPC one)."""
        return self._backend.grpc_url()

    # -- in this process (Triton(embedded=True)) -------------------------------------------------
    @property
    def embedded(self) -> bool:
        """True if this ``Triton`` runs the server inside this process (``Triton(embedded=True)``)."""
        return isinstance(self._backend, InProcessServer)

    @property
    def inprocess_server(self) -> inprocess.Server:
        """The running :class:`pytriton.inprocess.Server` of an embedded ``Triton`` (after :meth:`run`).

        It stays valid until :meth:`stop`; stopping or unloading models through it directly bypasses
        ``Triton``'s bookkeeping, so use ``Triton``'s own methods for that.

        Raises:
            PyTritonInvalidOperationError: not embedded, not running yet, or stopped.
        """
        not_running = {
            State.RUNNING: None,
            State.STOPPED: "stopped",
            State.CREATED: "not running yet (call run() first)",
        }[self._state]
        if not isinstance(self._backend, InProcessServer):
            where = "binds into a server elsewhere" if self._local is None else "runs the tritonserver binary"
            raise PyTritonInvalidOperationError(
                f"inprocess_server exists only for Triton(embedded=True); this {type(self).__name__} {where}."
            )
        return self._backend.inprocess_server(not_running)

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
        from pytriton import inprocess

        self.model(model_name)  # the same checks
        return inprocess.InProcessModelClient(self.inprocess_server, model_name, model_version)


class RemoteTriton(Triton):
    """A ``Triton`` that serves bound callables through a Triton server running elsewhere (docs/remote.md).

    It is a ``Triton`` constructed with the remote backend (pytriton/_serving/remote.py): the same
    ``bind``, worker threads in this process and proxy model in the server's stubs, but no server is
    started: :meth:`run` connects and loads the bound models through the server's model-repository API
    (with the access token when that API is restricted); :meth:`stop` unloads them again, leaving the
    server running. :func:`pytriton._remote.server_command` builds a suitable server command line.

    Args:
        url: the server, ``[http://|grpc://]host[:port]`` (HTTP and port 8000 by default); the
            model-repository calls go over this protocol.
        workspace: staging directory for the model files (a temporary one when ``None``), or,
            with ``local_model_store=True`` and no ``TritonConfig.model_repository``, the
            server's model repository itself.
        access_token: the token of the server's restricted model-repository endpoints
            (``triton-access-token``), if it restricts them.
        triton_lifecycle_policy: ``launch_triton_on_startup``: True (the default) connects and
            loads the bound models on entering the ``with`` block, as NVIDIA PyTriton's
            ``RemoteTriton`` does, so a model bound inside it is served when ``bind`` returns;
            False waits for :meth:`run` (or :meth:`connect`). No server is ever launched here.
            ``local_model_store`` picks where the model files go (True: a repository the server
            shares; False: sent with each load request).
            Default: ``TritonLifecyclePolicy(launch_triton_on_startup=True, local_model_store=False)``.
        config: ``model_repository`` (with ``local_model_store=True``), ``max_request_bytes``,
            ``exit_timeout_secs`` (how long ``stop`` waits for batches in flight) and
            ``trace_config`` (OpenTelemetry mode, as the server was started: lets ``bind`` take a
            ``trace_config``, whose settings are set on the server at ``url``) are used; other
            server flags are not (the server is not started here).
        transport: ``"unix"`` (same host and user) or ``"tcp"`` (ZeroMQ; tensors in the messages).
        tcp_address: the address the TCP transport listens on (``"127.0.0.1"``; ``"0.0.0.0"`` for
            every interface).
        tcp_port: its port (0: a free one, see :attr:`tcp_endpoint`).
        tcp_advertised_address: the name the server's stubs connect to, when it differs from
            ``tcp_address`` (e.g. a Kubernetes Service name).
        tcp_encryption: encrypt the TCP transport with ZeroMQ's CURVE (the default; pyzmq's wheels
            include it). False sends tensors in clear, for a network you trust.

    Resource contract: worker threads, the Unix socket directory or the TCP hub (one thread, one
    listening port), staging files in the workspace; all released by :meth:`stop` (also ``__exit__``,
    ``serve()`` on SIGINT/SIGTERM and interpreter exit), which first unloads the models.
    """

    def __init__(
        self,
        url: str,
        workspace: Union[Workspace, str, pathlib.Path, None] = None,
        access_token: Optional[str] = None,
        *,
        triton_lifecycle_policy: Optional[TritonLifecyclePolicy] = None,
        config: Optional[TritonConfig] = None,
        transport: str = "unix",
        tcp_address: str = "127.0.0.1",
        tcp_port: int = 0,
        tcp_advertised_address: Optional[str] = None,
        tcp_encryption: bool = True,
    ):
        check_python_supported()
        policy = lifecycle_policy(triton_lifecycle_policy, REMOTE_LIFECYCLE_POLICY)
        settings = resolve_settings(config)
        remote = RemoteBackend(
            url,
            access_token,
            settings,
            policy.local_model_store,
            transport,
            TcpOptions(tcp_address, tcp_port, tcp_advertised_address, tcp_encryption),
        )
        self._remote = remote
        # Nothing of this object's own security config reaches a server, and it restarts none.
        self._setup(settings, workspace, policy, lambda site: remote, RestartPolicy(0, 60.0))

    @property
    def tcp_endpoint(self) -> Optional[str]:
        """``tcp://host:port`` the server's stubs connect to (``None`` with the Unix transport)."""
        return self._remote.hub.endpoint if self._remote.hub is not None else None
