"""Ending a stub outside its robust locks (pytriton/_platform/native.py), on real child processes, no server.

A Python-backend stub killed while it holds one of the backend's robust shared-memory mutexes makes
tritonserver abort (``boost::interprocess::lock_exception``) at the server's next use of it; a stub
stopped by a signal at a random moment can be inside such a lock. Here a child takes a robust
``pthread`` mutex through ctypes, as the stub's Boost code does, and stops itself inside it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from pytriton._platform import native, proc
from tests.conftest import wait_for

pytestmark = pytest.mark.skipif(
    native._GET_ROBUST_LIST is None, reason="get_robust_list is known for x86_64 and aarch64"
)

# The child: a robust mutex in its own memory; ACTION says what it does with it before stopping itself.
CHILD = textwrap.dedent(
    """
    import ctypes, os, signal, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    attr, mutex = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)
    assert libc.pthread_mutexattr_init(attr) == 0
    assert libc.pthread_mutexattr_setrobust(attr, 1) == 0  # PTHREAD_MUTEX_ROBUST
    assert libc.pthread_mutex_init(mutex, attr) == 0
    action = sys.argv[1]
    if action in ("hold", "hold-forever"):
        assert libc.pthread_mutex_lock(mutex) == 0
    print("ready", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # stopped here: inside the lock for "hold"
    if action == "hold":
        libc.pthread_mutex_unlock(mutex)  # what a resumed stub does: leaves the lock at once
    time.sleep(60)
    """
)


def _child(action: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", CHILD, action], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    assert wait_for(
        lambda: proc.task_states(child.pid) and set(proc.task_states(child.pid).values()) == {"T"}, 10, 0.01
    )
    return child


def _end(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.kill()
    child.wait(10)


@pytest.mark.parametrize("action, held", [("hold", True), ("idle", False)])
def test_robust_locks_held_tells_a_process_stopped_inside_a_lock_from_one_that_holds_none(action, held):
    child = _child(action)
    try:
        assert native.robust_locks_held(child.pid) is held
    finally:
        _end(child)


def test_a_process_stopped_inside_a_lock_runs_until_it_lets_go_and_is_killed_then():
    child = _child("hold")
    try:
        assert native.kill_outside_robust_locks(child.pid) == "free"  # it ran, unlocked, and was killed
        assert child.wait(10) == -signal.SIGKILL
    finally:
        _end(child)


def test_a_process_holding_none_is_killed_at_once_and_one_that_never_lets_go_after_the_limit():
    idle = _child("idle")
    forever = _child("hold-forever")
    try:
        assert native.kill_outside_robust_locks(idle.pid) == "free"
        assert idle.wait(10) == -signal.SIGKILL
        assert native.kill_outside_robust_locks(forever.pid, limit_s=0.3) == "held"  # killed anyway: bounded
        assert forever.wait(10) == -signal.SIGKILL
    finally:
        _end(idle)
        _end(forever)


def test_a_running_process_is_stopped_to_be_looked_at_and_a_gone_one_is_reported():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert wait_for(lambda: proc.task_states(child.pid), 10, 0.01)
        assert native.kill_outside_robust_locks(child.pid) == "free"
        assert child.wait(10) == -signal.SIGKILL
        assert native.kill_outside_robust_locks(child.pid) == "gone"  # reaped: nothing to signal
    finally:
        _end(child)


def test_robust_locks_held_is_none_for_a_process_that_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(10)
    assert native.robust_locks_held(child.pid) is None


def test_a_stop_that_takes_longer_than_the_lock_budget_is_waited_for(monkeypatch):
    """On a loaded host the stop itself can outlast ``limit_s``: the process is still looked at before the kill.

    Before, the wait for the stop shared the 1 s budget, and a process slow to stop was killed blind
    ("unknown"): every unit leg of a loaded CI run failed this way.
    """
    clock = [0.0]
    sent = []
    looked = []
    monkeypatch.setattr(native.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(native.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    monkeypatch.setattr(native.os, "kill", lambda pid, number: sent.append(number))
    # Running ("R") for 3 s of the fake clock after the SIGSTOP, then stopped.
    monkeypatch.setattr(native.proc, "task_states", lambda pid: {pid: "T" if clock[0] >= 3.0 else "R"})
    monkeypatch.setattr(native, "robust_locks_held", lambda pid: looked.append(clock[0]) or False)
    assert native.kill_outside_robust_locks(4242, limit_s=0.3) == "free"
    assert looked and looked[0] >= 3.0 and sent == [signal.SIGSTOP, signal.SIGKILL]


def test_a_process_that_never_stops_is_killed_after_the_stop_wait(monkeypatch):
    clock = [0.0]
    sent = []
    monkeypatch.setattr(native.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(native.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    monkeypatch.setattr(native.os, "kill", lambda pid, number: sent.append(number))
    monkeypatch.setattr(native.proc, "task_states", lambda pid: {pid: "D"})  # uninterruptible, for good
    assert native.kill_outside_robust_locks(4242) == "unknown"
    assert sent == [signal.SIGSTOP, signal.SIGKILL] and native.STOP_WAIT_S <= clock[0] <= native.STOP_WAIT_S + 1


def test_a_thread_with_no_robust_list_holds_no_lock(monkeypatch):
    """A process stopped right after ``exec``, before the C library registered its list (a loaded host).

    The kernel clears a thread's robust list at ``exec``; glibc registers one before ``main``. Such a
    thread cannot hold a robust mutex, so it counts as holding none. Before, it made the answer
    "cannot tell" and the stub was killed blind (every unit leg of a loaded CI run: a child stopped
    before it ran).
    """
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert wait_for(lambda: proc.task_states(child.pid), 10, 0.01)
        monkeypatch.setattr(native, "_robust_list_head", lambda tid: 0)
        assert native.robust_locks_held(child.pid) is False
        monkeypatch.setattr(native, "_robust_list_head", lambda tid: None)  # not ours to read
        assert native.robust_locks_held(child.pid) is None
    finally:
        _end(child)
