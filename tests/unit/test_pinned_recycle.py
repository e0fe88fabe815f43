"""The supervisor replacing tritonserver to free pinned model generations (pytriton/_serving/supervisor.py, server/_recycle.py).

Driven through its seams with fakes: a fake registry and backend, /dev/shm and /proc read through
monkeypatched ``_recycle.server_regions``/``live_stub_regions``, and ``_start_until_ready`` (the
restart's start loop, tested in tests/unit/test_restarts.py) replaced by a recorder.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any, List

from pytriton._serving import supervisor as _healing
from pytriton.server import _recycle
from pytriton.server._restarts import RestartPolicy

PREFIX = "pytriton-1-tok-pb"


class FakeRegistry:
    def __init__(self, models: List[Any]) -> None:
        self.lock = threading.RLock()
        self._models = models
        self.is_running = True

    def running(self) -> bool:
        return self.is_running

    def models(self) -> List[Any]:
        return list(self._models)

    def model_names(self) -> List[str]:
        return []

    def versions(self, name: str) -> List[Any]:
        return []

    def wake(self) -> None:
        pass


class FakeLocalBackend:
    """A local server the supervisor cannot start again (the embedded library): LocalServer only."""

    def __init__(self) -> None:
        self.server = SimpleNamespace(pid=100, is_alive=lambda: True)
        self.region_prefix = PREFIX

    def on_exit(self, callback: Any) -> None:
        pass

    def before_load(self) -> None:
        pass

    def after_load(self, loaded: bool) -> None:
        pass

    def loaded(self) -> None:
        pass

    def server_log(self) -> List[str]:
        return []


class FakeBackend(FakeLocalBackend):
    """A launched server: RestartableServer (the restart itself is the recorder of _supervisor)."""

    def replace_server(self, model_names: List[str]) -> Any:
        raise AssertionError("the recorder replaces _start_until_ready")

    def wait_ready(self, server: Any, what: str) -> None:
        pass


def _supervisor(monkeypatch, models, regions, live, restartable=True):
    registry, backend = FakeRegistry(models), (FakeBackend() if restartable else FakeLocalBackend())
    assert isinstance(backend, _healing.RestartableServer) is restartable
    settings = SimpleNamespace(recycle_idle_s=10.0, exit_timeout_s=1.0, recycle_byte_size=0)
    supervisor = _healing.Supervisor(registry, backend, settings, RestartPolicy(5, 60.0), "test-supervisor")
    now = [0.0]
    supervisor._pinned = _recycle.PinnedRegions(grace_s=5.0, clock=lambda: now[0])
    supervisor._pinned_server = 100
    monkeypatch.setattr(_recycle, "server_regions", lambda prefix: set(regions))
    scans: List[int] = []

    def live_regions(pid, prefix):
        scans.append(pid)
        return set(live)

    monkeypatch.setattr(_recycle, "live_stub_regions", live_regions)
    started: List[bool] = []

    def start_until_ready():
        assert supervisor.restarting  # the restart path's flag: stub losses and restarts wait meanwhile
        started.append(not any(model.busy for model in models))  # True: no batch was running any more
        backend.server = SimpleNamespace(pid=200, is_alive=lambda: True)
        return backend.server

    monkeypatch.setattr(supervisor, "_start_until_ready", start_until_ready)
    return supervisor, now, started, scans


def _model(busy=False, last_active=0.0):
    return SimpleNamespace(busy=busy, last_active=last_active)


def test_an_idle_server_with_a_pinned_region_is_replaced_after_the_grace(monkeypatch):
    models = [_model(last_active=time.monotonic() - 60)]
    supervisor, now, started, _ = _supervisor(monkeypatch, models, {"a", "dead"}, {"a"})
    supervisor._recycle_pinned_server()  # the dead stub's region: its grace starts
    assert not started
    now[0] = 5.0
    supervisor._recycle_pinned_server()
    assert started == [True] and supervisor.recycles == 1 and not supervisor.restarting


def test_a_busy_server_is_replaced_only_at_the_limit_and_after_its_batches(monkeypatch):
    model = _model(busy=True)
    regions = {f"dead{i}" for i in range(3)} | {"a"}
    supervisor, now, started, _ = _supervisor(monkeypatch, [model], regions, {"a"})
    supervisor._pinned_limit = 4
    supervisor._recycle_pinned_server()
    now[0] = 6.0
    supervisor._recycle_pinned_server()
    assert not started  # 3 pinned, a batch runs: below the limit nothing is refused
    supervisor._pinned_limit = 3
    finished = threading.Timer(0.2, lambda: setattr(model, "busy", False))
    finished.start()
    supervisor._recycle_pinned_server()
    assert started == [True]  # the new server started only once the batch in flight had ended


def test_healthy_servers_restarts_and_other_backends_are_left_alone(monkeypatch):
    idle = [_model(last_active=time.monotonic() - 60)]
    supervisor, now, started, scans = _supervisor(monkeypatch, idle, {"a", "b"}, {"a", "b"})
    for step in range(3):
        now[0] = 10.0 * step
        supervisor._recycle_pinned_server()
    assert not started  # every region has its live stub
    assert len(scans) == 1  # after a clean scan, the same number of regions needs no /proc scan
    supervisor, now, started, _ = _supervisor(monkeypatch, idle, {"a", "dead"}, {"a"})
    supervisor._recycle_pinned_server()  # the grace starts
    now[0] = 9.0
    supervisor.healing.add("Model")  # a stub replacement under way: not now
    supervisor._recycle_pinned_server()
    supervisor.healing.clear()
    supervisor.restarting = True  # a crash restart under way: not now
    supervisor._recycle_pinned_server()
    assert not started
    supervisor.restarting = False
    supervisor._recycle_pinned_server()
    assert started == [True]
    supervisor, now, started, _ = _supervisor(monkeypatch, idle, {"a", "dead"}, {"a"}, restartable=False)
    now[0] = 9.0
    supervisor._recycle_pinned_server()
    supervisor._recycle_pinned_server()
    assert not started  # embedded or remote: no server process of ours to replace


def test_a_new_server_starts_counting_afresh(monkeypatch):
    idle = [_model(last_active=time.monotonic() - 60)]
    supervisor, now, started, _ = _supervisor(monkeypatch, idle, {"a", "dead"}, {"a"})
    supervisor._recycle_pinned_server()
    supervisor._backend.server = SimpleNamespace(pid=300, is_alive=lambda: True)  # restarted meanwhile
    now[0] = 6.0
    supervisor._recycle_pinned_server()
    assert not started  # its grace started with the new server
    now[0] = 11.0
    supervisor._recycle_pinned_server()
    assert started == [True]


def test_the_upkeep_runs_on_time_while_events_keep_coming(monkeypatch):
    monkeypatch.setattr(_healing._unresponsive, "watch_for", lambda registry, post: None)
    registry, backend = FakeRegistry([]), FakeBackend()
    settings = SimpleNamespace(recycle_idle_s=1.0, exit_timeout_s=1.0, recycle_byte_size=0)
    supervisor = _healing.Supervisor(registry, backend, settings, RestartPolicy(5, 60.0), "test-supervisor")
    upkeeps: List[float] = []
    monkeypatch.setattr(supervisor, "_recycle_pinned_server", lambda: upkeeps.append(time.monotonic()))
    supervisor.start()
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # a stub loss every 20 ms, for an unbound model: a no-op each
            supervisor._events.put(("stub", ("Gone", 0)))
            time.sleep(0.02)
        assert len(upkeeps) >= 2  # poll every 0.25 s; without the fix, none while events kept coming
    finally:
        supervisor.request_stop()
        supervisor.join()


def test_a_bad_limit_is_logged_and_the_default_applies(monkeypatch, caplog):
    monkeypatch.setenv("PYTRITON_RECYCLE_PINNED_REGIONS", "lots")
    supervisor = _healing.Supervisor(
        FakeRegistry([]),
        FakeBackend(),
        SimpleNamespace(recycle_idle_s=1.0, exit_timeout_s=1.0, recycle_byte_size=0),
        RestartPolicy(5, 60.0),
        "x",
    )
    assert supervisor._pinned_limit == _recycle.PINNED_REGIONS_LIMIT
    assert "PYTRITON_RECYCLE_PINNED_REGIONS='lots'" in caplog.text and "Using the default, 64" in caplog.text
    monkeypatch.setenv("PYTRITON_RECYCLE_PINNED_REGIONS", "3")
    supervisor = _healing.Supervisor(
        FakeRegistry([]),
        FakeBackend(),
        SimpleNamespace(recycle_idle_s=1.0, exit_timeout_s=1.0, recycle_byte_size=0),
        RestartPolicy(5, 60.0),
        "x",
    )
    assert supervisor._pinned_limit == 3


def test_an_idle_server_is_not_replaced_while_a_request_may_still_wait_at_a_dead_instance(monkeypatch):
    """No batch for minutes, but a stub replacement has just ended: a request Triton handed to the dead
    instance may still be waiting (it is no batch), and a new server now would close its connection."""
    models = [_model(last_active=time.monotonic() - 60)]
    supervisor, now, started, _ = _supervisor(monkeypatch, models, {"a", "dead"}, {"a"})
    supervisor._healed_at = time.monotonic()
    supervisor._recycle_pinned_server()
    now[0] = 5.0  # the dead stub's region is pinned now
    supervisor._recycle_pinned_server()
    assert not started
    supervisor._healed_at = time.monotonic() - _recycle.DEAD_REQUEST_S - supervisor._settings.recycle_idle_s
    supervisor._recycle_pinned_server()
    assert started == [True]
