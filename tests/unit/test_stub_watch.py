"""The stopped-stub watcher (pytriton/proxy/_stub_watch.py) against real processes it may not kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pytriton.proxy import _stub_watch


@pytest.fixture()
def child():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def _wait_state(pid: int, state: str) -> None:
    deadline = time.monotonic() + 5.0
    while _stub_watch.proc_stat(pid)[0] != state:
        assert time.monotonic() < deadline, f"pid {pid} never reached state {state!r}"
        time.sleep(0.01)


def test_a_stopped_process_is_killed_after_the_limit_only(child, monkeypatch):
    monkeypatch.setattr(_stub_watch, "is_stub", lambda pid: True)  # a plain child stands in for a stub
    killed = []
    watch = _stub_watch.StubWatch(limit_s=2.0, kill=killed.append)
    watch.watch("session", child.pid, "model M (M-0)")
    assert watch.check(100.0) == []  # running: nothing
    os.kill(child.pid, signal.SIGSTOP)
    _wait_state(child.pid, "T")
    assert watch.check(101.0) == []  # first seen stopped
    assert watch.check(102.5) == []  # 1.5 s
    os.kill(child.pid, signal.SIGCONT)  # resumed in time: the clock starts again
    _wait_state(child.pid, "S")
    assert watch.check(103.5) == []
    os.kill(child.pid, signal.SIGSTOP)
    _wait_state(child.pid, "T")
    assert watch.check(104.0) == []
    assert watch.check(106.1) == [child.pid] == killed
    assert watch.check(110.0) == []  # forgotten once killed
    os.kill(child.pid, signal.SIGCONT)


def test_only_python_backend_stubs_are_watched(child):
    watch = _stub_watch.StubWatch(limit_s=0.0, kill=lambda pid: pytest.fail("not a stub: must not be killed"))
    watch.watch("session", child.pid, "model M")  # a python process, not triton_python_backend_stub
    os.kill(child.pid, signal.SIGSTOP)
    _wait_state(child.pid, "T")
    assert watch.check(1.0) == [] and watch.check(5.0) == []
    os.kill(child.pid, signal.SIGCONT)
    assert not _stub_watch.is_stub(os.getpid())


def test_a_reused_pid_is_not_killed(child, monkeypatch):
    monkeypatch.setattr(_stub_watch, "is_stub", lambda pid: True)
    watch = _stub_watch.StubWatch(limit_s=0.5, kill=lambda pid: pytest.fail("another process behind the same pid"))
    watch.watch("session", child.pid, "model M")
    key_pid, started, description, since = watch._watched["session"]
    watch._watched["session"] = (key_pid, started - 1, description, since)  # as if the stub had been replaced
    os.kill(child.pid, signal.SIGSTOP)
    _wait_state(child.pid, "T")
    assert watch.check(1.0) == [] and watch.check(3.0) == []
    os.kill(child.pid, signal.SIGCONT)


def test_the_thread_ends_when_nothing_is_watched(child, monkeypatch):
    monkeypatch.setattr(_stub_watch, "is_stub", lambda pid: True)
    watch = _stub_watch.StubWatch(limit_s=60.0, poll_s=0.01)
    watch.watch("a", child.pid, "model M")
    thread = watch._thread
    assert thread is not None and thread.is_alive()
    watch.forget("a")
    thread.join(5.0)
    assert not thread.is_alive() and watch._thread is None


def test_stopped_is_true_only_for_a_stub_in_a_signal_stop(child):
    """``stopped()`` (read by pytriton/_serving/unresponsive.py): a process named like the stub, stopped; not any process."""
    stub = subprocess.Popen(["/bin/bash", "-c", "exec -a /opt/x/triton_python_backend_stub sleep 60"])
    try:
        deadline = time.monotonic() + 5.0
        while not _stub_watch.is_stub(stub.pid):  # until bash has exec'd
            assert time.monotonic() < deadline, "the fake stub never started"
            time.sleep(0.01)
        assert not _stub_watch.stopped(stub.pid)
        os.kill(stub.pid, signal.SIGSTOP)
        os.kill(child.pid, signal.SIGSTOP)
        _wait_state(stub.pid, "T")
        _wait_state(child.pid, "T")
        assert _stub_watch.stopped(stub.pid) and not _stub_watch.stopped(child.pid)  # the child is no stub
        os.kill(stub.pid, signal.SIGCONT)
        _wait_state(stub.pid, "S")
        assert not _stub_watch.stopped(stub.pid)
    finally:
        os.kill(child.pid, signal.SIGCONT)
        stub.kill()
        stub.wait()
    assert not _stub_watch.stopped(stub.pid)  # gone
