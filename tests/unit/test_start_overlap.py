"""``Triton.run()`` starts the server while worker processes load their callables (no server started).

pytriton/proxy/_binding.py's ``WorkerStarts`` and ``BoundModel.start_workers(wait=False)``, the backends'
``start(..., workers)`` (pytriton/_serving/launched.py polls ``workers.check()`` while the server comes up; the
embedded and remote backends wait first) and ``ProcessInstance.start_failure`` (pytriton/proxy/_process.py),
driven through a fake backend and fake process instances. tests/unit/test_process_instances.py covers the
real worker processes; tests/e2e/test_start_overlap.py the same with a real server.
"""

from __future__ import annotations

import pathlib
import threading
import time
from typing import Any, List, Optional

import numpy as np
import pytest

from pytriton._serving.backend import State
from pytriton._serving.launched import LaunchedBackend
from pytriton.model_config.tensor import Tensor
from pytriton.proxy import _binding, _process
from pytriton.server._restarts import RestartPolicy
from pytriton.server.process import TritonServerProcess
from pytriton.server.settings import resolve
from pytriton.triton import Triton, TritonLifecyclePolicy
from tests.unit.process_callables import echo as double

X = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
Y = [Tensor(name="y", shape=(-1,), dtype=np.float32)]


class FakeProcessInstance:
    """A ``ProcessInstance`` whose worker is ready when ``ready`` is set, or fails when ``failure`` is set."""

    made: List[FakeProcessInstance] = []
    ready = threading.Event()
    failure: Optional[str] = None

    def __init__(self, **options: Any) -> None:
        self.launched = self.stopped = False
        self.connected = self.busy = self.stub_stopped = False
        self.last_active = 0.0
        FakeProcessInstance.made.append(self)

    def launch(self) -> None:
        self.launched = True

    def start_failure(self, timeout_s: float = 0.0) -> Optional[_process.WorkerStartError]:
        text = FakeProcessInstance.failure
        return _process.WorkerStartError(f"fake worker: {text}") if text is not None else None

    def wait_ready(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            error = self.start_failure()
            if error is not None:
                raise error
            if FakeProcessInstance.ready.wait(0.01):
                return
            if time.monotonic() > deadline:
                raise AssertionError("the worker was waited for before the server was started")

    def stop(self, timeout_s: float = 0.0) -> None:
        self.stopped = True

    def retire(self, generation: int) -> List[int]:
        return []

    def retired_busy(self) -> bool:
        return False


class FakeBackend:
    """A ``ServerBackend`` (the core only) whose server comes up when every worker is ready; polls like the launched one."""

    loads_at_startup = True
    offers_pipelines = False

    def __init__(self, polls: bool = True) -> None:
        self.polls = polls
        self.calls: List[str] = []
        self.workers_ready_at_start: Optional[bool] = None

    def attach(self, registry: Any) -> None:
        self.calls.append("attach")

    def prepare(self, timeout_s: Optional[float] = None) -> bool:
        return False

    def model_store(self, workspace: Any) -> pathlib.Path:
        return pathlib.Path(workspace.path) / "model-store"

    def binding_context(self, context: Any) -> Any:
        return context

    def start(self, repository: Any, startup: List[str], has_models: bool, socket_dir: Any, workers: Any) -> bool:
        self.calls.append("start")
        self.workers_ready_at_start = FakeProcessInstance.ready.is_set()
        if not self.polls:
            workers.wait()
            return True
        # The server "loads" the models: it is ready once the workers answered their stubs' hello.
        FakeProcessInstance.ready.set() if FakeProcessInstance.failure is None else None
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            workers.check()
            if FakeProcessInstance.ready.is_set():
                return True
            time.sleep(0.005)
        raise AssertionError("the server's wait did not see the failed worker")

    def started(self) -> None:
        self.calls.append("started")

    def stop(self, hooks: Any, running: bool) -> None:
        self.calls.append("stop")

    def release(self, models: Any, repository: Any) -> None:
        self.calls.append("release")

    def endpoints_line(self) -> str:
        return "fake"

    def is_serving(self) -> bool:
        return True


@pytest.fixture()
def fake(monkeypatch, tmp_path):
    FakeProcessInstance.made = []
    FakeProcessInstance.ready = threading.Event()
    FakeProcessInstance.failure = None
    monkeypatch.setattr(_process, "ProcessInstance", FakeProcessInstance)
    triton_objects: List[Triton] = []

    def make(polls: bool = True) -> Any:
        backend = FakeBackend(polls)
        triton = Triton.__new__(Triton)
        triton._setup(
            resolve(None), tmp_path / "workspace", TritonLifecyclePolicy(), lambda site: backend, RestartPolicy(0, 60.0)
        )
        triton_objects.append(triton)
        return triton, backend

    yield make
    for triton in triton_objects:
        triton.stop()


def test_run_starts_the_server_before_the_worker_processes_are_ready(fake):
    triton, backend = fake()
    triton.bind("P", [double, double], X, Y, instance_kind="process")
    triton.run()
    assert backend.workers_ready_at_start is False  # the old run() waited for the workers first
    assert [instance.launched for instance in FakeProcessInstance.made] == [True, True]
    assert backend.calls[-2:] == ["start", "started"]
    assert triton._state is State.RUNNING


def test_a_worker_that_fails_ends_run_at_once_and_leaves_nothing(fake):
    triton, backend = fake()
    triton.bind("P", double, X, Y, instance_kind="process")
    triton.bind("T", double, X, Y)  # a thread instance beside it: its worker is stopped too
    socket_dir = triton._socket_dir
    assert socket_dir is not None and socket_dir.exists()
    FakeProcessInstance.failure = "No module named 'ghost'"
    started = time.monotonic()
    with pytest.raises(_process.WorkerStartError, match="ghost"):
        triton.run()
    assert time.monotonic() - started < 4.0  # not the fake server's 5 s wait
    assert triton._state is State.STOPPED
    assert backend.calls[-2:] == ["stop", "release"]
    assert all(instance.stopped for instance in FakeProcessInstance.made)
    assert not any(model._workers for model in triton._models.values())
    assert not socket_dir.exists()


def test_a_backend_that_cannot_poll_waits_for_the_workers_before_it_starts(fake):
    triton, backend = fake(polls=False)
    triton.bind("P", double, X, Y, instance_kind="process")
    FakeProcessInstance.failure = "boom"
    with pytest.raises(_process.WorkerStartError, match="boom"):
        triton.run()
    assert triton._state is State.STOPPED and FakeProcessInstance.made[0].stopped


def test_worker_starts_check_raises_the_first_failure_and_wait_waits_for_every_model(fake):
    triton, _ = fake()
    triton.bind("P", double, X, Y, instance_kind="process")
    models = list(triton._models.values())
    for model in models:
        model.start_workers(wait=False)
    workers = _binding.WorkerStarts(models)
    workers.check()  # loading: nothing to say yet
    FakeProcessInstance.ready.set()
    workers.wait()
    FakeProcessInstance.failure = "gone"
    with pytest.raises(_process.WorkerStartError, match="gone"):
        workers.check()
    with pytest.raises(_process.WorkerStartError, match="gone"):
        models[0].wait_workers()
    assert FakeProcessInstance.made[0].stopped  # wait_workers stops the model's workers on a failure


def test_the_launched_backends_wait_ends_with_the_workers_failure_while_the_server_loads(monkeypatch, tmp_path):
    backend = LaunchedBackend.__new__(LaunchedBackend)
    monkeypatch.setattr(backend, "_probe", lambda: lambda: False, raising=False)  # never ready: loading
    server = TritonServerProcess(["true"], {})
    monkeypatch.setattr(server, "is_alive", lambda: True)
    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise _process.WorkerStartError("fake worker failed")

    started = time.monotonic()
    with pytest.raises(_process.WorkerStartError, match="fake worker failed"):
        backend.wait_ready(server, "Triton failed to start", check)
    assert len(calls) == 3 and time.monotonic() - started < 2.0


def test_the_remote_backend_waits_for_the_workers_before_loading(monkeypatch):
    from pytriton._serving.remote import RemoteBackend

    backend = RemoteBackend.__new__(RemoteBackend)
    waited = []

    class Workers:
        def wait(self) -> None:
            waited.append(True)

        def check(self) -> None:
            raise AssertionError("a remote start has nothing to poll")

    assert backend.start(pathlib.Path("."), [], True, pathlib.Path("."), Workers()) is True  # type: ignore[arg-type]
    assert waited == [True]


def test_the_embedded_backend_does_not_start_beside_workers():
    from pytriton._serving.embedded import EmbeddedBackend

    assert LaunchedBackend.starts_beside_workers is True
    assert EmbeddedBackend.starts_beside_workers is False


def test_start_failure_is_none_while_loading_and_the_timeout_counts_from_launch(monkeypatch):
    instance = _process.ProcessInstance.__new__(_process.ProcessInstance)
    instance._ready = threading.Event()
    instance._start_error = None
    instance._model, instance._name = "Unit", "Unit-0"
    instance._launched_at = time.monotonic()
    assert instance.start_failure(timeout_s=60.0) is None
    instance._launched_at -= 61.0
    error = instance.start_failure(timeout_s=60.0)
    assert isinstance(error, _process.WorkerStartError) and "did not report ready within 60 s" in str(error)
    with pytest.raises(_process.WorkerStartError, match="within 60 s"):
        instance.wait_ready(timeout_s=60.0)  # the time since launch is spent: no further wait
    ready = _process.ProcessInstance.__new__(_process.ProcessInstance)
    ready._ready, ready._start_error, ready._launched_at = threading.Event(), None, 0.0
    ready._ready.set()
    assert ready.start_failure() is None
    ready._start_error = "its process ended (exit code 1)"
    ready._model, ready._name = "Unit", "Unit-0"
    assert "exit code 1" in str(ready.start_failure())


class LateBackendServer:
    """A ``TritonServerProcess`` still starting when the worker failed; while it is being stopped, its Python
    backend initializes (``backend_starts``: makes its scratch directory and logs its first instance) or not."""

    pid = 4242

    def __init__(self, root: pathlib.Path, backend_starts: bool) -> None:
        self.root = root
        self.backend_starts = backend_starts
        self.python_backend_started = False

    def is_alive(self) -> bool:
        return False  # nothing to hold open for a drain

    def stop(self, grace_s: float = 0.0, wait_idle: Any = None) -> None:
        if self.backend_starts:
            (self.root / "python_env_late").mkdir()
            self.python_backend_started = True
        else:
            (self.root / "python_env_someone_elses").mkdir()  # another server's, made meanwhile


class LateBackendLaunched(LaunchedBackend):
    """The launched backend, whose start opens the first-load window, then sees the worker fail at once."""

    def __init__(self, site: Any, access: Any, root: pathlib.Path, backend_starts: bool) -> None:
        super().__init__(site, access, None)
        self.fake_server = LateBackendServer(root, backend_starts)

    def prepare(self, timeout_s: Optional[float] = None) -> bool:
        return False  # no server install needed

    def start(self, repository: Any, startup: List[str], has_models: bool, socket_dir: Any, workers: Any) -> bool:
        self._server = self.fake_server  # type: ignore[assignment]
        self.scratch.before_first_load()  # as LocalBackend.start does, right before the server starts
        raise _process.WorkerStartError("fake worker: No module named 'ghost'")


@pytest.mark.parametrize("backend_starts", [True, False], ids=["backend-started-late", "backend-never-started"])
def test_a_failed_start_decides_on_the_scratch_directory_once_the_server_has_ended(
    monkeypatch, tmp_path, scratch_root, backend_starts
):
    # Seen in CI under load: the worker failed before the still-starting server had initialized its Python
    # backend; the window was closed then, with nothing made yet, and the server made its /tmp/python_env_*
    # directory while it was being stopped, which nobody removed.
    from pytriton.server.security import AccessPolicy, TritonSecurityConfig

    root = scratch_root
    settings = resolve(None)
    backends: List[LateBackendLaunched] = []

    def make(site: Any) -> LateBackendLaunched:
        backends.append(
            LateBackendLaunched(site, AccessPolicy(settings.config, TritonSecurityConfig()), root, backend_starts)
        )
        return backends[0]

    triton = Triton.__new__(Triton)
    triton._setup(settings, tmp_path / "workspace", TritonLifecyclePolicy(), make, RestartPolicy(0, 60.0))
    try:
        triton.bind("T", double, X, Y)
        with pytest.raises(_process.WorkerStartError, match="ghost"):
            triton.run()
        assert triton._state is State.STOPPED
        if backend_starts:
            assert backends[0].scratch.path == str(root / "python_env_late")
            assert not (root / "python_env_late").exists()
        else:  # the server made nothing: a directory that appeared meanwhile is someone else's, and kept
            assert backends[0].scratch.path is None
            assert (root / "python_env_someone_elses").exists()
    finally:
        triton.stop()


class NewServer:
    """The server a restart attempt starts (``TritonServerProcess`` replaced): starts at once, makes nothing."""

    pid = 4343

    def __init__(self, argv: Any, env: Any, log_path: Any = None, data_headroom: Any = None) -> None:
        self.argv = argv

    def register_on_exit(self, callback: Any) -> None:
        pass

    def start(self) -> None:
        pass


def test_a_restart_attempt_that_failed_has_the_directory_its_server_made_meanwhile_removed(monkeypatch, scratch_root):
    # The supervisor's restart attempt failed while its server was still starting; the server initialized its
    # Python backend (its /tmp/python_env_* directory) until the next attempt ended it. The next attempt's
    # replace_server must decide on that directory only then, and remove it; on 1f85f7d the failed attempt's
    # window was closed at the failure, with nothing made yet, and the directory was left.
    from types import SimpleNamespace

    from pytriton._serving import launched
    from pytriton.server import _scratch

    root = scratch_root
    monkeypatch.setattr(launched, "TritonServerProcess", NewServer)
    monkeypatch.setattr(launched._segments, "sweep_segments", lambda prefix: None)
    backend = LaunchedBackend.__new__(LaunchedBackend)
    failed = LateBackendServer(root, backend_starts=True)
    backend._server = failed  # type: ignore[assignment]
    backend._watchdog_fd = None
    backend._launch = (SimpleNamespace(loading=lambda names: SimpleNamespace(to_argv=lambda: ["tritonserver"])), {})  # type: ignore[assignment]
    backend._config = SimpleNamespace(log_file=None)  # type: ignore[assignment]
    backend._settings = SimpleNamespace(server_data_headroom=None)  # type: ignore[assignment]
    backend._site = SimpleNamespace(shm_prefix="pytriton-test")  # type: ignore[assignment]
    backend.scratch = _scratch.ScratchDirTracker()
    backend.scratch.before_first_load()  # the failed attempt's window, still open
    new = backend.replace_server(["m"])
    try:
        assert new is backend._server and failed.python_backend_started
        assert not (root / "python_env_late").exists()  # claimed once the failed server had ended, and removed
    finally:
        backend.scratch.after_first_load(False)
        backend.scratch.remove()
