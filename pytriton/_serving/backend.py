"""The seams of ``Triton``: what a server backend does, and what the backends and the supervisor see of a ``Triton``.

:class:`pytriton.triton.Triton` is the model registry and the public methods; where the server runs is a
:class:`ServerBackend`, one of three:

- :class:`pytriton._serving.launched.LaunchedBackend`: the ``tritonserver`` binary, a process of its own (the default);
- :class:`pytriton._serving.embedded.EmbeddedBackend`: Triton's server library in this process (``Triton(embedded=True)``);
- :class:`pytriton._serving.remote.RemoteBackend`: a server started elsewhere (``RemoteTriton``).

Self-healing and the drain are one :class:`pytriton._serving.supervisor.Supervisor`, which works on the backend and
on the registry through :class:`Registry`. A backend is a small core (:class:`ServerBackend`) plus the
capabilities it has (:class:`LocalServer`, :class:`RestartableServer`, :class:`TracingServer`,
:class:`QueueReporting`, :class:`InProcessServer`), which the supervisor and ``Triton`` ask for with
``isinstance``. Nothing here owns a resource; the protocols state who does.
Unit test: tests/unit/test_backends.py.
"""

from __future__ import annotations

import enum
import pathlib
import threading
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

if TYPE_CHECKING:
    from pytriton import inprocess
    from pytriton.proxy._binding import BindingContext, BoundModel, WorkerStarts
    from pytriton.server.process import TritonServerProcess
    from pytriton.server.workspace import Workspace


class State(enum.Enum):
    """Where a ``Triton`` instance is in its life: ``run()`` makes it RUNNING, ``stop()`` STOPPED (for good)."""

    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"


class Registry(Protocol):
    """What the supervisor and the backends see of a ``Triton``: its bound models and its lifecycle state.

    ``Triton`` implements it (a view over its own state, in ``triton.py``). Every method may be called from
    any thread; ``lock`` is the ``Triton``'s own lock (reentrant), held while the models change.
    """

    @property
    def lock(self) -> threading.RLock: ...

    def running(self) -> bool:
        """True between ``run()`` and ``stop()``."""

    def models(self) -> List[BoundModel]:
        """Every bound model (each version counts), in binding order."""

    def versions(self, model_name: str) -> List[BoundModel]:
        """The bound versions of ``model_name``, lowest first."""

    def model_names(self) -> List[str]:
        """Each bound model name once, in binding order."""

    def repository(self) -> Optional[pathlib.Path]:
        """The model repository the files are written to (``None`` before ``run()``)."""

    def startup_models(self) -> List[str]:
        """The names the server loaded when it started (``--load-model``); the others were loaded later."""

    def write_name(self, model_name: str) -> None:
        """Write the repository files of every bound version of ``model_name``."""

    def request_load(self, model_name: str) -> None:
        """Load (or reload) ``model_name`` into the running server, with its warmups and trace settings."""

    def apply_trace_settings(self, model_names: Sequence[str]) -> None:
        """Send the per-model trace settings of ``model_names`` to the server (a new server knows none)."""

    def wake(self) -> None:
        """Wake ``serve()`` (it then looks at the supervisor's failure)."""


class StopHooks(Protocol):
    """What a backend's :meth:`ServerBackend.stop` may call on the supervisor (pytriton/_serving/supervisor.py)."""

    def drain(self, deadline: float) -> bool:
        """The drain: the delay, then refusing new batches while those in flight finish (until ``deadline``)."""

    def wait_detached(self, deadline: float) -> bool:
        """Wait (until ``deadline``) until no batch can still be in flight; True if none is."""

    def join(self, timeout_s: float = 10.0) -> None:
        """Wait for the supervisor thread to end (a stub replacement it is loading ends first)."""


class ServerBackend(Protocol):
    """Where the server runs: what every backend does (start, load, stop, liveness, URLs, token).

    Lifecycle: ``Triton.run()`` calls :meth:`prepare`, then :meth:`model_store`, writes the model files,
    launches the workers (without waiting for worker processes) and calls :meth:`start`; ``Triton.stop()``
    calls :meth:`stop` once (the drain), then, after the workers stopped, :meth:`release`, which frees
    everything the backend holds. A backend is used by one ``Triton`` and never restarted after
    :meth:`release`.

    What only some servers can do is a capability below (:class:`LocalServer`, :class:`RestartableServer`,
    :class:`TracingServer`, :class:`QueueReporting`, :class:`InProcessServer`): a backend implements the
    protocol of each capability it has and nothing of the others, and ``Triton`` and the supervisor ask
    with ``isinstance`` (:func:`capabilities` lists them). A backend never fills a member with a no-op.
    """

    #: True if the server loads the models bound before ``run()`` by itself when it starts (``--load-model``);
    #: False: ``run()`` loads every one of them through :meth:`repository_request`.
    loads_at_startup: bool
    #: True if the models are offered to this process's callables through ``pytriton.pipeline.model`` by name
    #: (a remote server's are not: a callable passes ``url=``).
    offers_pipelines: bool

    # -- starting -------------------------------------------------------------------------------
    def attach(self, registry: Registry) -> None:
        """Called once by the ``Triton`` that owns this backend, before anything else."""

    def prepare(self, timeout_s: Optional[float] = None) -> bool:
        """Check the environment before anything is started (install, ports, reachability).

        ``timeout_s``: how long to wait for a server that runs elsewhere to answer (``None``: the
        backend's default); a backend that starts its own server ignores it.

        Returns whether the stubs run with numpy 2 (BYTES tensors need a check then). Raises with what to fix.
        """

    def model_store(self, workspace: Workspace) -> pathlib.Path:
        """The directory the model files are written to, created and checked (``_platform/paths.py``).

        Raises ``UnsafePathError`` if another local user could change it.
        """

    def binding_context(self, context: BindingContext) -> BindingContext:
        """The binding context of a new model, with what this backend adds (the TCP hub of a remote server)."""

    def start(
        self,
        repository: pathlib.Path,
        startup_models: List[str],
        has_models: bool,
        socket_dir: pathlib.Path,
        workers: WorkerStarts,
    ) -> bool:
        """Start (or connect to) the server with ``startup_models`` loaded and wait until it is ready.

        ``socket_dir`` is the ``Triton``'s private socket directory (a watchdog removes it if this process dies).
        ``workers``: the bound models' workers, launched but perhaps still loading their callables. A backend
        that polls while the server comes up calls ``workers.check()`` on each poll (the server starts while
        worker processes import the user's modules); one that cannot calls ``workers.wait()`` before it starts
        the server or loads a model. Either raises ``WorkerStartError`` for a worker that failed.

        Returns True once it is ready; False if it came up (it listened: its start-up models had loaded) and
        died before the readiness probe saw it ready. That is a crash, not a failed start (a request can kill
        Triton 2.51 as soon as it listens): the backend has reported the exit through ``on_exit``
        (:class:`LocalServer`), so the supervisor restarts it, and ``run()`` returns. On any other failure it
        raises; ``Triton`` then calls ``stop()``, which releases what was started.
        """

    def started(self) -> None:
        """``run()`` finished loading every model (a local server's first-load scratch window ends)."""

    # -- models on the running server ------------------------------------------------------------
    def repository_request(self, action: str, model_name: str) -> None:
        """Load (``"load"``) or unload (``"unload"``) ``model_name``; raises ``PyTritonModelConfigError``."""

    # -- liveness ----------------------------------------------------------------------------------
    def is_serving(self) -> bool:
        """True while the server the models are loaded into runs (a remote one: answers that it is live)."""

    def stub_loss_is_ours(self, server_pid: int) -> bool:
        """True if a stub whose parent was ``server_pid`` died under the running server (the supervisor replaces it)."""

    # -- stopping ---------------------------------------------------------------------------------
    def stop(self, hooks: StopHooks, running: bool) -> None:
        """Stop serving: the drain (through ``hooks``), then end (or leave) the server. Called once.

        ``running``: ``run()`` had been called.
        """

    def release(self, models: List[BoundModel], repository: Optional[pathlib.Path]) -> None:
        """Last, after the workers stopped and the workspace was cleaned: free what the backend still holds."""

    # -- what users see ---------------------------------------------------------------------------
    def http_url(self) -> str:
        """``Triton.http_url`` (raises where the server has no HTTP endpoint, with what to use instead)."""

    def grpc_url(self) -> str:
        """``Triton.grpc_url`` (raises where the server has no gRPC endpoint)."""

    def access_token(self) -> Optional[str]:
        """``Triton.get_access_token()``."""

    def endpoints_line(self) -> str:
        """One line for the log: where the server is reached and which endpoints need the token."""


# -- capabilities: what only some servers can do -------------------------------------------------------
@runtime_checkable
class LocalServer(Protocol):
    """A server this process starts and runs on this host (the launched binary, the embedded library).

    Its process, its Python backend's scratch directory and shared-memory regions, its exit and its
    log are this process's to watch. A remote server has none of this.
    """

    #: The Python backend's shared-memory prefix the stubs use (permission fix-up, memory recycling).
    region_prefix: Optional[str]

    @property
    def server(self) -> Optional[TritonServerProcess]:
        """The server process object while it runs (its ``pid`` is the stubs' parent), else ``None``."""

    def before_load(self) -> None:
        """A model is about to load: the Python backend may create its scratch directory now."""

    def after_load(self, loaded: bool) -> None:
        """The load of :meth:`before_load` ended; claim the scratch directory it created."""

    def loaded(self) -> None:
        """A model was loaded: re-apply the stubs' region permissions and the server's memory cap."""

    def on_exit(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(returncode)`` when the server dies on its own (never for the embedded server)."""

    def server_log(self) -> List[str]:
        """``Triton.server_log`` (a server without this capability has no log here: ``[]``)."""


@runtime_checkable
class RestartableServer(LocalServer, Protocol):
    """A local server that can die on its own and be started again by the supervisor (the launched binary)."""

    def replace_server(self, model_names: List[str]) -> TritonServerProcess:
        """End the dead server's leftovers and start a new server loading ``model_names``."""

    def wait_ready(self, server: TritonServerProcess, what: str) -> None:
        """Wait until ``server`` is ready; raises ``PyTritonServerError`` with ``what``."""


@runtime_checkable
class TracingServer(Protocol):
    """A server that takes per-model trace settings (``bind(trace_config=...)``; not the embedded one)."""

    def send_trace_settings(self, model_name: str, settings: Dict[str, object]) -> None:
        """Set a model's trace settings on the server."""


@runtime_checkable
class QueueReporting(Protocol):
    """A server whose queued requests can be read, for the drain (the launched binary's statistics)."""

    def pending_requests(self) -> Dict[Tuple[str, str], int]:
        """The requests the server has queued per (model, version) (empty when it cannot tell right now)."""


@runtime_checkable
class InProcessServer(LocalServer, Protocol):
    """The server library in this process (``Triton(embedded=True)``): ``Triton.inprocess_server``."""

    def inprocess_server(self, not_running: Optional[str]) -> inprocess.Server:
        """The in-process server; raises ``PyTritonInvalidOperationError`` while it does not run.

        ``not_running``: why the ``Triton`` is not running (``"stopped"``, ...), ``None`` while it runs.
        """


CAPABILITIES = (LocalServer, RestartableServer, TracingServer, QueueReporting, InProcessServer)


def capabilities(backend: object) -> List[str]:
    """The names of the capabilities ``backend`` has, in :data:`CAPABILITIES` order (for logs and tests)."""
    return [capability.__name__ for capability in CAPABILITIES if isinstance(backend, capability)]
