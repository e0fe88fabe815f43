"""The restart policy and the supervisor's restart loop, with a fake clock and a fake server.

``pytriton/server/_restarts.py`` decides the delay before each restart; ``Supervisor._restart_server``
(pytriton/_serving/supervisor.py) applies it through the launched backend (pytriton/_serving/launched.py). A server that had been serving is restarted however often it dies
(requests can crash Triton 2.51); only starts that keep failing end ``serve()``.
"""

from __future__ import annotations

import errno
import logging
import pathlib
import threading
from typing import Any, Callable, List

import pytest

from pytriton._serving import launched as _launched
from pytriton._serving import supervisor as _supervisor
from pytriton._serving.backend import State
from pytriton._serving.plan import LaunchPlan, PythonBackendOptions
from pytriton.exceptions import PyTritonServerError
from pytriton.server._restarts import BACKOFF_CAP_S, MAX_FAILED_STARTS, RETRY_BASE_S, RestartPolicy
from pytriton.triton import Triton


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_crashes_in_the_window_restart_at_once_then_the_delay_doubles_to_its_cap():
    clock = FakeClock()
    policy = RestartPolicy(3, 60.0, clock=clock, base_s=0.05, cap_s=0.5)
    delays = []
    for _ in range(10):
        delays.append(policy.crashed())
        clock.now += 1.0
    assert delays == [0.0, 0.0, 0.0, 0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5]
    assert policy.recent_crashes() == 10


def test_a_flood_never_exhausts_the_policy_and_quiet_time_resets_the_delay():
    clock = FakeClock()
    policy = RestartPolicy(5, 60.0, clock=clock)
    for _ in range(1000):  # a crash every 0.5 s for over eight minutes
        delay = policy.crashed()
        assert delay is not None and 0.0 <= delay <= BACKOFF_CAP_S
        clock.now += 0.5
    assert policy.crashed() == BACKOFF_CAP_S
    clock.now += 61.0  # the flood stopped a window ago
    assert policy.recent_crashes() == 0
    assert policy.crashed() == 0.0


def test_failed_starts_give_up_after_the_limit_and_a_successful_start_resets_the_count():
    policy = RestartPolicy(5, 60.0, clock=FakeClock(), max_failed_starts=3)
    assert policy.start_failed() and policy.start_failed()
    policy.started()
    assert policy.start_failed() and policy.start_failed()
    assert not policy.start_failed()
    assert policy.failed_starts == 3


def test_zero_burst_turns_restarts_off():
    policy = RestartPolicy(0, 60.0, clock=FakeClock())
    assert not policy.enabled
    assert policy.crashed() is None
    assert not policy.start_failed()


class FakeServer:
    """Stands in for ``TritonServerProcess``: ``outcomes`` says how each successive start ends."""

    # "ready", "fails" (never listened), "killed" (listened, then died), "emfile" (start() raises EMFILE)
    outcomes: List[str] = []
    stop_errors: List[OSError] = []  # raised by the next stop() calls, one each
    started: List[FakeServer] = []

    def __init__(self, argv: List[str], env: Any, **_: Any) -> None:
        self.argv = argv
        self.pid = 4000 + len(FakeServer.started)
        self.alive = False
        self.listening = False
        self.python_backend_started = False  # no model instance starts in these scenarios

    def register_on_exit(self, callback: Callable[[int], None]) -> None:
        pass

    def start(self) -> None:
        if FakeServer.outcomes and FakeServer.outcomes[0] == "emfile":
            FakeServer.outcomes.pop(0)
            raise OSError(errno.EMFILE, "Too many open files")  # Popen's pipes: nothing was started
        FakeServer.started.append(self)
        self.alive = True

    def wait_until(self, probe: Callable[[], bool], timeout_s: float, what: str) -> None:
        outcome = FakeServer.outcomes.pop(0)
        if outcome != "ready":
            self.listening = outcome == "killed"
            self.alive = False
            raise PyTritonServerError(f"{what}: tritonserver exited with code 1. --bad-flag")

    def is_alive(self) -> bool:
        return self.alive

    def stop(self, grace_s: float = 0.0) -> None:
        self.alive = False
        if FakeServer.stop_errors:
            raise FakeServer.stop_errors.pop(0)

    def crash_lines(self) -> List[str]:
        return ["terminate called after throwing an instance of 'std::bad_alloc'"]


@pytest.fixture
def supervised(monkeypatch):
    """A ``Triton`` in the RUNNING state whose restarts start fake servers and whose backoff sleeps are recorded."""
    FakeServer.started = []
    FakeServer.outcomes = []
    FakeServer.stop_errors = []
    sleeps: List[float] = []
    monkeypatch.setattr(_launched, "TritonServerProcess", FakeServer)
    monkeypatch.setattr(_launched._segments, "sweep_segments", lambda prefix: None)
    triton = Triton(max_server_restarts=2, restart_window_s=60)
    backend = triton._backend
    monkeypatch.setattr(backend, "_probe", lambda: lambda: True)
    monkeypatch.setattr(triton._traces, "apply", lambda names: None)
    # Backoff waits end when (fake) time passes; the fake sleep advances the clock it reads.
    clock = FakeClock()
    monkeypatch.setattr(_supervisor.time, "monotonic", clock)
    monkeypatch.setattr(_supervisor.time, "sleep", lambda s: (sleeps.append(s), setattr(clock, "now", clock.now + s)))
    supervisor = triton._supervisor
    supervisor.policy = RestartPolicy(2, 60.0, clock=clock)
    backend._launch = (
        LaunchPlan(
            binary=pathlib.Path("tritonserver"),
            model_repository=pathlib.Path("/nowhere"),
            backend_directory=pathlib.Path("/nowhere/backends"),
            python_backend=PythonBackendOptions(shm_region_prefix="p"),
        ),
        {},
    )
    backend._server = FakeServer([], {})  # the server that "died": never started, so not alive
    triton._state = State.RUNNING
    try:
        yield triton, supervisor, sleeps
    finally:
        triton._state = State.STOPPED  # no real server to stop: only the files stop() would remove
        backend._server = None
        triton._workspace.clean()


def test_twenty_crashes_in_a_row_are_all_restarted_with_bounded_delays(supervised):
    triton, supervisor, sleeps = supervised
    FakeServer.outcomes = ["ready"] * 20
    for _ in range(20):
        triton._backend.server.alive = False  # it crashed
        supervisor._restart_server(-6)
        assert supervisor.failure is None and triton._backend.server.alive
    assert triton.server_restarts == 20 and len(FakeServer.started) == 20
    assert sum(sleeps) > 0 and max(sleeps) <= BACKOFF_CAP_S  # later restarts waited, none long


def test_a_server_that_cannot_start_ends_serve_after_the_failed_start_limit(supervised):
    triton, supervisor, _ = supervised
    FakeServer.outcomes = ["fails"] * MAX_FAILED_STARTS
    supervisor._restart_server(-6)
    assert len(FakeServer.started) == MAX_FAILED_STARTS
    assert isinstance(supervisor.failure, PyTritonServerError)
    assert "could not be started again (8 failed attempts in a row)" in str(supervisor.failure)
    assert "--bad-flag" in str(supervisor.failure)
    assert triton._wakeup.is_set()  # serve() wakes up to raise it


def test_servers_killed_right_after_they_listen_are_crashes_not_failed_starts(supervised):
    # An attacker polling readiness faster than pytriton's probe kills each new server before the
    # probe sees it ready: that must never count towards giving up.
    triton, supervisor, sleeps = supervised
    FakeServer.outcomes = ["killed"] * (MAX_FAILED_STARTS * 3) + ["ready"]
    supervisor._restart_server(-6)
    assert supervisor.failure is None and triton.server_restarts == 1
    assert len(FakeServer.started) == MAX_FAILED_STARTS * 3 + 1
    assert max(sleeps) <= BACKOFF_CAP_S


def test_one_failed_start_is_retried(supervised):
    triton, supervisor, _ = supervised
    FakeServer.outcomes = ["fails", "ready"]
    supervisor._restart_server(-6)
    assert supervisor.failure is None and triton.server_restarts == 1 and len(FakeServer.started) == 2


def test_without_restarts_the_first_crash_is_final(supervised):
    triton, supervisor, _ = supervised
    supervisor.policy = RestartPolicy(0, 60.0)
    supervisor._restart_server(-6)
    assert FakeServer.started == []
    assert "restarts are off (max_server_restarts=0): giving up" in str(supervisor.failure)


def test_failed_attempts_are_retried_after_a_doubling_delay_and_a_start_resets_it():
    policy = RestartPolicy(5, 60.0, clock=FakeClock(), max_failed_starts=6, retry_base_s=0.5, retry_cap_s=4.0)
    assert policy.retry_delay() == 0.0  # nothing failed: no delay
    delays = []
    while policy.start_failed():
        delays.append(policy.retry_delay())
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0] and policy.failed_starts == 6
    policy.started()
    assert policy.retry_delay() == 0.0 and policy.start_failed() and policy.retry_delay() == 0.5


def _emfile_on_proc() -> OSError:
    return OSError(errno.EMFILE, "Too many open files", "/proc")  # what os.listdir("/proc") raised


def test_a_transient_emfile_in_a_restart_is_retried_after_the_first_retry_delay(supervised):
    # The scenario: every descriptor is taken when the server dies, so ending its process
    # group (reading /proc) fails twice, then the new server's pipes cannot be made: each attempt
    # is retried, and once descriptors are free again the server serves.
    triton, supervisor, sleeps = supervised
    FakeServer.stop_errors = [_emfile_on_proc(), _emfile_on_proc()]
    FakeServer.outcomes = ["emfile", "ready"]
    supervisor._restart_server(-11)
    assert supervisor.failure is None and not supervisor.restarting
    assert triton.server_restarts == 1 and triton._backend.server.alive and len(FakeServer.started) == 1
    # Two failed attempts (the first stop failure is repeated by attempt 1), so two retry delays.
    assert sum(sleeps) == pytest.approx(RETRY_BASE_S + 2 * RETRY_BASE_S)
    assert supervisor.policy.failed_starts == 0
    triton._backend.server.alive = False  # the next crash is restarted at once, without a retry delay
    sleeps.clear()
    FakeServer.outcomes = ["ready"]
    supervisor._restart_server(-11)
    assert triton.server_restarts == 2 and sleeps == []


def test_a_restart_whose_steps_keep_failing_gives_up_with_one_line(supervised, caplog):
    triton, supervisor, sleeps = supervised
    FakeServer.outcomes = ["emfile"] * MAX_FAILED_STARTS
    with caplog.at_level(logging.ERROR, logger="pytriton._serving.supervisor"):
        supervisor._restart_server(-11)
    assert FakeServer.started == [] and triton.server_restarts == 0 and not supervisor.restarting
    assert isinstance(supervisor.failure, PyTritonServerError)
    message = str(supervisor.failure)
    assert "\n" not in message
    assert f"could not be started again ({MAX_FAILED_STARTS} failed attempts in a row); giving up" in message
    assert "OSError: [Errno 24] Too many open files" in message
    assert triton._wakeup.is_set()  # serve() wakes up to raise it
    assert sum(sleeps) == pytest.approx(0.5 + 1.0 + 2.0 + 4.0 * 4)  # bounded: about 20 s, then the program ends
    given_up = [r.getMessage() for r in caplog.records if "giving up" in r.getMessage()]
    assert given_up == [message]


def test_a_failure_escaping_the_restart_ends_serve_instead_of_leaving_a_dead_server(supervised, monkeypatch):
    triton, supervisor, _ = supervised

    def broken(returncode: int) -> None:
        raise RuntimeError("a bug in the restart")

    monkeypatch.setattr(supervisor, "_restart_server", broken)
    monkeypatch.setattr(_supervisor._unresponsive, "watch_for", lambda registry, report: None)
    thread = threading.Thread(target=supervisor._supervise, daemon=True)
    thread.start()
    supervisor.on_server_exit(-11)
    supervisor.request_stop()
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(supervisor.failure, PyTritonServerError) and "a bug in the restart" in str(supervisor.failure)
    assert triton._wakeup.is_set()


def test_a_restart_loads_the_live_bound_models_at_its_start_and_the_warmed_ones_after(supervised, monkeypatch):
    # Models bound while the server ran (the server started on entering `with Triton()`) are loaded by
    # the restarted server at its start, as models bound before run() are: the soak's crash probes
    # saw a restarted 2.51 die (SIGSEGV) while it loaded them one by one. A model with a warmup is
    # still loaded through the repository API after the start, as at the first start.
    triton, supervisor, _ = supervised
    triton._startup_models = ["early", "live"]  # "live" was appended by its live bind (Triton._load_live)
    monkeypatch.setattr(triton, "_model_names", lambda: ["early", "live", "warmed"])
    loads: List[str] = []
    monkeypatch.setattr(triton, "_request_load", loads.append)
    FakeServer.outcomes = ["ready"]
    supervisor._restart_server(-11)
    argv = FakeServer.started[-1].argv
    assert [arg for arg in argv if arg.startswith("--load-model=")] == ["--load-model=early", "--load-model=live"]
    assert loads == ["warmed"]


def test_a_failed_restart_attempts_scratch_directory_is_decided_once_its_server_ended(
    supervised, monkeypatch, scratch_root
):
    # A restart attempt failed while its server was still starting; that server made its Python backend's
    # /tmp/python_env_* directory until the next attempt ended it. On 1f85f7d the supervisor closed the
    # attempt's first-load window at the failure, with nothing made yet, and the directory was left behind.
    root = scratch_root
    triton, supervisor, _ = supervised
    triton._startup_models = ["m"]
    monkeypatch.setattr(triton, "_model_names", lambda: ["m"])
    late = FakeServer.stop

    def stop(server: FakeServer, grace_s: float = 0.0) -> None:
        if FakeServer.started[:1] == [server] and not server.python_backend_started:  # the failed attempt's server
            (root / "python_env_late").mkdir()
            server.python_backend_started = True
        late(server, grace_s)

    monkeypatch.setattr(FakeServer, "stop", stop)
    FakeServer.outcomes = ["fails", "ready"]
    supervisor._restart_server(-6)
    assert supervisor.failure is None and len(FakeServer.started) == 2
    assert not (root / "python_env_late").exists()
    triton._backend.after_load(False)  # the successful attempt's window, as the fixture's stop would
