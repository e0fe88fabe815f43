"""``Triton`` over its three server backends, and the supervisor over a fake backend (no server started).

pytriton/_serving/backend.py defines the seams; pytriton/_serving/launched.py, pytriton/_serving/embedded.py and
pytriton/_serving/remote.py implement ``ServerBackend``; pytriton/_serving/supervisor.py's ``Supervisor`` works on
a backend and the registry. The e2e suites (test_lifecycle, test_embedded, test_remote, test_healing,
test_drain) run the same paths against a real server.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import threading
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

from pytriton import triton
from pytriton._serving import backend as _backend
from pytriton._serving import supervisor as supervisor_module
from pytriton._serving.backend import ServerBackend, State
from pytriton._serving.embedded import EmbeddedBackend
from pytriton._serving.launched import LaunchedBackend
from pytriton._serving.remote import RemoteBackend
from pytriton._serving.supervisor import Supervisor
from pytriton.exceptions import PyTritonInvalidOperationError
from pytriton.model_config.tensor import Tensor
from pytriton.server._restarts import RestartPolicy
from pytriton.server.settings import resolve
from pytriton.triton import RemoteTriton, Triton, TritonConfig

ROOT = pathlib.Path(__file__).parents[2]
X = [Tensor(name="x", shape=(-1,), dtype=np.float32)]


def _protocol_members(protocol: type) -> set:
    members = set()
    for klass in protocol.__mro__:
        if klass in (object, _backend.Protocol) or klass.__module__ == "typing":
            continue
        members |= {name for name in vars(klass) if not name.startswith("_")}
        members |= set(getattr(klass, "__annotations__", {}))
    return members


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda: Triton(), LaunchedBackend),
        (lambda: Triton(embedded=True), EmbeddedBackend),
        (lambda: RemoteTriton("localhost"), RemoteBackend),
    ],
)
def test_each_way_to_construct_a_triton_picks_its_backend_which_has_every_protocol_member(make, kind):
    server = make()
    try:
        assert type(server._backend) is kind
        missing = [name for name in _protocol_members(ServerBackend) if not hasattr(server._backend, name)]
        assert not missing, f"{kind.__name__} lacks {missing}"
        for capability in _backend.CAPABILITIES:
            if isinstance(server._backend, capability):
                missing = [name for name in _protocol_members(capability) if not hasattr(server._backend, name)]
                assert not missing, f"{kind.__name__} is a {capability.__name__} without {missing}"
    finally:
        server.stop()


# Issue 43 item 5: a small core every backend fills, and what only some servers can do as capabilities the
# supervisor and Triton ask for. Before, ServerBackend had 33 members and the remote backend filled 10 of
# them with no-ops or raises.
CAPABILITIES = {
    LaunchedBackend: ["LocalServer", "RestartableServer", "TracingServer", "QueueReporting"],
    EmbeddedBackend: ["LocalServer", "InProcessServer"],
    RemoteBackend: ["TracingServer"],
}


def test_the_backend_protocol_is_a_small_core_and_each_backend_has_the_capabilities_of_its_server():
    core = _protocol_members(ServerBackend)
    assert len(core) <= 17, sorted(core)
    assert not core & {"server", "replace_server", "wait_ready", "inprocess_server", "pending_requests", "on_exit"}
    for make, kind in ((Triton, LaunchedBackend), (lambda: Triton(embedded=True), EmbeddedBackend)):
        server = make()
        try:
            assert _backend.capabilities(server._backend) == CAPABILITIES[kind]
        finally:
            server.stop()
    remote = RemoteTriton("localhost")
    try:
        assert _backend.capabilities(remote._backend) == CAPABILITIES[RemoteBackend]
    finally:
        remote.stop()


def test_the_remote_backend_fills_no_member_of_a_capability_it_lacks():
    """No no-op, no raising stub: what a server elsewhere cannot do is absent, and asked for by isinstance."""
    lacking = [c for c in _backend.CAPABILITIES if c.__name__ not in CAPABILITIES[RemoteBackend]]
    own = set().union(*(_protocol_members(c) for c in lacking)) - _protocol_members(ServerBackend)
    filled = sorted(name for name in own if hasattr(RemoteBackend, name))
    assert not filled, f"RemoteBackend fills {filled}"
    # Nor does the embedded backend fill what only the binary does (restarts, queue statistics, tracing).
    assert not [name for name in ("replace_server", "pending_requests", "send_trace_settings", "trace_problem")
                if hasattr(EmbeddedBackend, name)]  # fmt: skip


def test_triton_has_no_mixins_and_remote_triton_overrides_nothing():
    assert Triton.__bases__ == (object,)
    overridden = {
        name
        for name, value in vars(RemoteTriton).items()
        if name != "__init__" and not name.startswith("__") and hasattr(Triton, name)
    }
    assert not overridden, f"RemoteTriton overrides {overridden}: it must only construct a Triton"
    assert RemoteTriton.__init__ is not Triton.__init__


def test_triton_py_tests_no_mode_flag():
    tree = ast.parse((ROOT / "pytriton" / "triton.py").read_text())
    flags = [
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in {"_embedded", "_remote_mode", "_is_remote"}
    ]
    assert not flags
    assert "EmbeddedTriton" not in inspect.getsource(triton) and "SelfHealing" not in inspect.getsource(triton)


def test_urls_and_token_come_from_the_backend():
    config = TritonConfig(http_port=18100, grpc_port=18101, metrics_port=18102)
    launched = Triton(config=config)
    embedded = Triton(config=config, embedded=True)
    remote = RemoteTriton("grpc://example.invalid:9001", access_token="secret")
    try:
        assert launched.http_url == "http://127.0.0.1:18100" and launched.grpc_url == "grpc://127.0.0.1:18101"
        assert launched.get_access_token() is not None and not launched.embedded
        with pytest.raises(PyTritonInvalidOperationError, match="no network endpoints, so no http_url"):
            embedded.http_url  # noqa: B018
        assert embedded.get_access_token() is None and embedded.embedded
        assert remote.grpc_url == "grpc://example.invalid:9001" and remote.http_url == ""
        assert remote.get_access_token() == "secret" and remote.server_log == []
        with pytest.raises(PyTritonInvalidOperationError, match="only for Triton\\(embedded=True\\)"):
            remote.inprocess_server  # noqa: B018
        with pytest.raises(PyTritonInvalidOperationError, match="not running yet"):
            embedded.inprocess_server  # noqa: B018
    finally:
        for server in (launched, embedded, remote):
            server.stop()
    with pytest.raises(PyTritonInvalidOperationError, match="stopped"):
        embedded.inprocess_server  # noqa: B018


def test_the_launched_backend_finds_the_watchdog_script():
    """The watchdog runs as a script by its path, in the platform layer (not where the backend module is)."""
    from pytriton._serving import launched

    assert launched._WATCHDOG.is_file() and launched._WATCHDOG.parent.name == "_platform"


def test_stopping_a_triton_that_never_ran_touches_no_server():
    server = Triton()
    server.bind("M", lambda requests: [], X, X)
    assert server._backend.server is None
    assert server.stop() is True and server._state is State.STOPPED
    assert server._backend.watchdog is None and not server._workspace.path.exists()


class FakeCore:
    """The core of a ``ServerBackend`` (a server elsewhere): its server is a flag."""

    def __init__(self) -> None:
        self.serving = True
        self.ours = True

    def is_serving(self) -> bool:
        return self.serving

    def stub_loss_is_ours(self, server_pid: int) -> bool:
        return self.ours


class FakeBackend(FakeCore):
    """A restartable local ``ServerBackend`` whose server is a flag; records the calls the supervisor makes."""

    region_prefix: Optional[str] = None

    def __init__(self) -> None:
        super().__init__()
        self.pending: Dict[Tuple[str, str], int] = {}
        self.exit_callback: Any = None
        self.server = None
        self.loads: List[bool] = []

    def on_exit(self, callback: Any) -> None:
        self.exit_callback = callback

    def before_load(self) -> None:
        pass

    def after_load(self, loaded: bool) -> None:
        self.loads.append(loaded)

    def loaded(self) -> None:
        pass

    def server_log(self) -> List[str]:
        return []

    def replace_server(self, model_names: List[str]) -> Any:
        raise AssertionError("not restarted in these tests")

    def wait_ready(self, server: Any, what: str) -> None:
        pass

    def pending_requests(self) -> Dict[Tuple[str, str], int]:
        return self.pending


class FakeRegistry:
    def __init__(self, models: List[Any]) -> None:
        self.lock = threading.RLock()
        self.state = State.RUNNING
        self._models = models
        self.loaded: List[str] = []
        self.woken = False

    def running(self) -> bool:
        return self.state is State.RUNNING

    def models(self) -> List[Any]:
        return list(self._models)

    def versions(self, name: str) -> List[Any]:
        return [m for m in self._models if m.name == name]

    def model_names(self) -> List[str]:
        return list(dict.fromkeys(m.name for m in self._models))

    def repository(self) -> Optional[pathlib.Path]:
        return None

    def startup_models(self) -> List[str]:
        return []

    def write_name(self, name: str) -> None:
        pass

    def request_load(self, name: str) -> None:
        self.loaded.append(name)

    def apply_trace_settings(self, names: Any) -> None:
        pass

    def wake(self) -> None:
        self.woken = True


def _model(name: str = "M", **state: Any) -> SimpleNamespace:
    values = dict(
        name=name,
        generation=0,
        busy=False,
        connected=False,
        last_active=0.0,
        max_queue_delay_s=0.0,
        execution_timeout_s=None,
        serving=True,
    )
    values.update(state)
    return SimpleNamespace(**values)


def _supervisor(models: List[Any], backend: Optional[FakeCore] = None) -> Tuple[Supervisor, FakeRegistry, Any]:
    registry = FakeRegistry(models)
    fake = backend or FakeBackend()
    supervisor = Supervisor(registry, fake, resolve(TritonConfig()), RestartPolicy(0, 60.0), name="test-supervisor")
    return supervisor, registry, fake


def test_the_supervisor_registers_for_server_exits_and_queues_stub_losses_only_when_the_backend_owns_them():
    supervisor, registry, backend = _supervisor([_model()])
    assert backend.exit_callback == supervisor.on_server_exit
    backend.ours = False  # e.g. RemoteTriton over TCP: a dropped connection is not a dead stub
    supervisor.on_stub_lost("M", 0, 1)
    assert supervisor._events.empty() and not supervisor.healing
    backend.ours = True
    supervisor.on_stub_lost("M", 0, 1)
    assert supervisor._events.get_nowait() == ("stub", ("M", 0)) and supervisor.healing == {"M"}


def test_a_server_death_without_restarts_gives_up_and_wakes_serve():
    crashed = SimpleNamespace(is_alive=lambda: False, stop=lambda grace_s=0.0: None, crash_lines=lambda: ["boom"])
    backend = FakeBackend()
    backend.server = crashed
    supervisor, registry, _ = _supervisor([_model()], backend)
    supervisor._restart_server(-11)
    assert (
        supervisor.failure is not None
        and "restarts are off" in str(supervisor.failure)
        and "boom" in str(supervisor.failure)
    )
    assert registry.woken


def test_the_supervisor_thread_ends_on_request():
    supervisor, _, _ = _supervisor([])
    supervisor.start()
    assert supervisor.active()
    supervisor.request_stop()
    supervisor.join(5.0)
    assert not supervisor._thread.is_alive()


def test_wait_detached_ends_when_no_stub_is_attached_or_the_server_is_gone():
    idle = _model(connected=False)
    supervisor, _, backend = _supervisor([idle])
    assert supervisor.wait_detached(time.monotonic() + 5.0) is True
    attached = _model(connected=True, busy=True)
    supervisor, _, backend = _supervisor([attached])
    backend.serving = False
    assert supervisor.wait_detached(time.monotonic() + 5.0) is False  # nothing to wait for without a server
    backend.serving = True
    started = time.monotonic()
    assert supervisor.wait_detached(time.monotonic() + 0.2) is False  # busy until the deadline
    assert time.monotonic() - started < 5.0


def test_the_supervisor_asks_a_core_only_backend_for_nothing_it_lacks(monkeypatch):
    """A server elsewhere: no exit to watch, no regions to recycle, no queues to read, and a death it cannot restart."""
    core = FakeCore()
    supervisor, registry, _ = _supervisor([_model(busy=True, connected=True)], core)
    assert supervisor._local is None and supervisor._restartable is None
    supervisor._recycle_grown_models()  # returns at once: nothing of the remote server is this process's
    seen = []

    def drain(deadline, delay_s, models, wait_detached, is_serving, pending):
        seen.append(pending())
        return True

    monkeypatch.setattr(supervisor_module._drain, "drain", drain)
    assert supervisor.drain(time.monotonic() + 1.0) and seen == [{}]
    supervisor._restart_server(-9)  # were a death reported, it is given up with the reason, never a crash
    assert supervisor.failure is not None and "cannot be restarted" in str(supervisor.failure) and registry.woken


def test_the_supervisor_reads_the_queues_of_a_backend_that_reports_them(monkeypatch):
    backend = FakeBackend()
    backend.pending = {("M", "1"): 3}
    supervisor, _, _ = _supervisor([_model()], backend)
    seen = []
    monkeypatch.setattr(
        supervisor_module._drain,
        "drain",
        lambda deadline, delay, models, detached, serving, pending: seen.append(pending()),
    )
    supervisor.drain(time.monotonic() + 1.0)
    assert seen == [{("M", "1"): 3}]
