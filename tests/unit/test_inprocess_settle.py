"""pytriton/inprocess/_settle.py on a fake ``/proc/self/task``, and ``Server.load()`` on a fake library.

A load must not return while a thread it started (a model instance's backend thread finishing the
load's warm-up) is still running or contending a lock: an unload in that window crashes Triton 2.51.
A thread asleep in a condition wait (the backend thread waiting for its next payload) is idle.
"""

from __future__ import annotations

import logging
import pathlib
import threading
import time
from types import SimpleNamespace

import pytest

import pytriton.inprocess as tritonserver
from pytriton._platform import proc
from pytriton.inprocess import _lib, _server, _settle
from tests.unit.test_inprocess import FakeCDLL

FUTEX = "202"  # x86_64's; the fixture makes it this machine's for the test
CONDITION_WAIT = f"{FUTEX} 0x7f00000010 0x189 0x0 0x0 0x0 0xffffffff 0x7ffd0 0x7f001"  # FUTEX_WAIT_BITSET|PRIVATE|CLOCK
MUTEX_WAIT = f"{FUTEX} 0x7f00000020 0x80 0x2 0x0 0x0 0x0 0x7ffd0 0x7f002"  # FUTEX_WAIT|PRIVATE: a contended mutex
NANOSLEEP = "230 0x0 0x0 0x7f00000030 0x7f00000030 0x0 0x0 0x7ffd0 0x7f003"


@pytest.fixture(autouse=True)
def _known_futex(monkeypatch):
    monkeypatch.setattr(proc, "FUTEX", int(FUTEX))  # the fake syscall lines use it on any machine


def _thread(directory: pathlib.Path, tid: int, state: str, syscall: str = "running") -> None:
    """A fake ``/proc/self/task/<tid>`` with ``state`` and ``syscall`` (rewritten if it exists)."""
    task = directory / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    (task / "stat").write_text(f"{tid} (python) {state} 1 1 1 0 -1 0 " + "0 " * 40 + "\n")
    (task / "syscall").write_text(syscall + "\n")


def _later(delay_s: float, action) -> None:
    timer = threading.Timer(delay_s, action)
    timer.daemon = True
    timer.start()


def test_a_running_thread_is_waited_for_until_it_sleeps_in_a_condition_wait(tmp_path):
    directory = tmp_path / "task"
    _thread(directory, 1, "S", CONDITION_WAIT)
    _thread(directory, 5, "R")  # the backend thread, still finishing the load's last payload
    events = []
    _later(0.3, lambda: (events.append("idle"), _thread(directory, 5, "S", CONDITION_WAIT)))
    left = _settle.wait_until_idle(frozenset({1}), time.monotonic() + 30, 0.01, str(directory))
    assert left == frozenset() and events == ["idle"]


def test_a_thread_waiting_for_a_mutex_is_not_idle(tmp_path):
    directory = tmp_path / "task"
    _thread(directory, 1, "S", CONDITION_WAIT)
    _thread(directory, 6, "S", MUTEX_WAIT)  # asleep, but inside the window (a contended lock)
    _thread(directory, 7, "D", "running")  # uninterruptible: not idle either
    assert _settle.wait_until_idle(frozenset({1}), time.monotonic() + 0.1, 0.01, str(directory)) == {6, 7}


def test_idle_exited_python_and_old_threads_are_not_waited_for(tmp_path, monkeypatch):
    """Healthy case: the threads a load started are asleep; the wait ends at the first read."""
    directory = tmp_path / "task"
    _thread(directory, 1, "R")  # existed before the load: never waited for
    _thread(directory, 8, "S", CONDITION_WAIT)
    _thread(directory, 9, "S", NANOSLEEP)
    _thread(directory, 10, "S", "-1 0x7ffd0 0x7f004")  # blocked outside a system call
    _thread(directory, 11, "Z")
    _thread(directory, threading.get_native_id(), "R")  # a Python thread
    (directory / "12").mkdir()  # a thread that exited while it was listed (no stat file)
    sleeps = []
    monkeypatch.setattr(_settle, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleeps.append))
    assert _settle.wait_until_idle(frozenset({1}), time.monotonic() + 30, 0.5, str(directory)) == frozenset()
    assert sleeps == []  # settled at the first read
    assert _settle.wait_until_idle(None, time.monotonic() + 30, 0.01, str(directory)) == frozenset()
    assert _settle.wait_until_idle(frozenset(), time.monotonic() + 30, 0.01, str(tmp_path / "none")) == frozenset()


def test_a_thread_seen_idle_once_is_not_waited_for_again(tmp_path, monkeypatch):
    """Once a backend thread is back in its wait, later work (traffic) does not hold the load."""
    directory = tmp_path / "task"
    _thread(directory, 5, "S", CONDITION_WAIT)
    _thread(directory, 6, "R")
    # The changes happen between the function's looks (its sleeps), not on timers: on a loaded host a
    # 50 ms timer could fire before the first look, and 5 was then never seen idle (CI run 8, 3.10 leg).
    changes = [
        lambda: _thread(directory, 5, "R"),  # after the first look: 5 picks up a batch
        lambda: _thread(directory, 6, "S", CONDITION_WAIT),  # after the second: 6 is back in its wait
    ]
    clock = SimpleNamespace(monotonic=time.monotonic, sleep=lambda seconds: changes.pop(0)() if changes else None)
    monkeypatch.setattr(_settle, "time", clock)  # this module's sleeps only
    assert _settle.wait_until_idle(frozenset(), time.monotonic() + 30, 0.01, str(directory)) == frozenset()
    assert not changes  # both happened while it waited


def _loading_server(monkeypatch, tmp_path, busy_s: float) -> tuple:
    """A started server on a fake library whose ServerLoadModel leaves a new thread running for ``busy_s``."""
    directory = tmp_path / "task"
    _thread(directory, 1, "S", CONDITION_WAIT)
    monkeypatch.setattr(_settle, "TASK_DIR", str(directory))
    events = []

    def load(handle, name):
        events.append("load")
        _thread(directory, 42, "R")  # the new instance's backend thread, still in its warm-up payload
        if busy_s >= 0:
            _later(busy_s, lambda: (events.append("idle"), _thread(directory, 42, "S", CONDITION_WAIT)))

    fake = FakeCDLL(TRITONSERVER_ServerLoadModel=load)
    server = tritonserver.Server(model_repository="/nonexistent")
    server._lib = _lib.Library(fake)
    server._handle = 1
    monkeypatch.setattr(server, "_wait_while_unloading", lambda name: None)
    return server, events


def test_load_returns_only_once_the_threads_it_started_are_idle(monkeypatch, tmp_path):
    server, events = _loading_server(monkeypatch, tmp_path, busy_s=0.3)
    model = server.load("identity")
    events.append("returned")
    assert model.name == "identity" and events == ["load", "idle", "returned"]


def test_a_load_whose_thread_never_settles_still_returns_at_the_bound(monkeypatch, tmp_path, caplog):
    """The load succeeded: a thread kept busy (traffic from the start) delays it by the bound only."""
    monkeypatch.setattr(_server, "_SETTLE_WAIT_S", 0.2)
    server, events = _loading_server(monkeypatch, tmp_path, busy_s=-1)
    with caplog.at_level(logging.DEBUG, logger="pytriton.inprocess._server"):
        assert server.load("identity").name == "identity"
    assert events == ["load"] and "not seen idle" in caplog.text


def test_a_failed_load_is_raised_without_waiting(monkeypatch, tmp_path):
    monkeypatch.setattr(_server, "_SETTLE_WAIT_S", 30.0)
    fake = FakeCDLL(
        TRITONSERVER_ServerLoadModel=lambda handle, name: 99,
        TRITONSERVER_ErrorCode=lambda error: 2,
        TRITONSERVER_ErrorMessage=lambda error: b"failed to load 'broken'",
    )
    server = tritonserver.Server(model_repository="/nonexistent")
    server._lib = _lib.Library(fake)
    server._handle = 1
    monkeypatch.setattr(server, "_wait_while_unloading", lambda name: None)
    waits = []
    monkeypatch.setattr(_settle, "wait_until_idle", lambda *args: waits.append(args) or frozenset())
    with pytest.raises(tritonserver.TritonError, match="failed to load"):
        server.load("broken")
    assert waits == []
