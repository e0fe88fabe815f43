"""The few C-library and CPython calls pytriton makes outside the in-process API's binding of Triton.

- :func:`die_with_parent`: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so the kernel kills a child (the
  server, a process instance's worker) when the thread that started it ends, even by SIGKILL. Safe
  between ``fork`` and ``exec``: ``prctl`` is resolved at import, so the child loads no library.
- :func:`raise_in_thread`: CPython's ``PyThreadState_SetAsyncExc`` (a callable past its deadline).
- :func:`inotify_watch`: an inotify descriptor on one directory (the shared-memory guard).
- :func:`robust_locks_held` and :func:`kill_outside_robust_locks`: end a process (a Python-backend
  stub) at a moment none of its threads holds a robust mutex (``get_robust_list``).

Everything else that needs ``ctypes`` lives in this package too: the private launch's ``ptrace`` and
seccomp filter, and the in-process server's confined start thread, are in ``launch.py``
(tests/unit/test_platform_boundary.py keeps such calls inside the layer).
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import struct
import time
from typing import Callable, Optional, Type

from pytriton._platform import proc

PR_SET_PDEATHSIG = 1


def _load_prctl() -> Optional[Callable[..., int]]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # pragma: no cover - every Linux libc has prctl
        return None


_PRCTL = _load_prctl()  # resolved before any fork: the child must not load libraries


def die_with_parent() -> bool:
    """Ask the kernel for SIGKILL when the parent (the thread that forked this process) ends; False if refused."""
    return _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0


def inotify_watch(directory: str, mask: int) -> int:
    """A new non-blocking, close-on-exec inotify descriptor watching ``directory`` for ``mask``; raises ``OSError``.

    The caller owns the descriptor (``os.close`` it); events are read from it with ``os.read``.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        descriptor = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
    except AttributeError as exc:  # pragma: no cover - a libc without inotify
        raise OSError(f"no inotify in this C library: {exc}") from None
    if descriptor < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1 failed")
    if libc.inotify_add_watch(descriptor, directory.encode(), mask) < 0:
        error = ctypes.get_errno()
        os.close(descriptor)
        raise OSError(error, f"cannot watch {directory}")
    return int(descriptor)


def raise_in_thread(ident: int, exc_type: Type[BaseException]) -> bool:
    """Ask Python to raise ``exc_type`` in the thread ``ident``; False if that thread is gone.

    Python raises it at the thread's next eval-breaker check (a loop's backward jump, a function's
    start), which in pure-Python code comes within a few bytecodes.
    """
    return bool(ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc_type)))


# get_robust_list(2): its number per architecture (the generic table, aarch64's, has 100).
_GET_ROBUST_LIST = {"x86_64": 274, "aarch64": 100}.get(platform.machine())
_HEAD = struct.Struct("@PlP")  # struct robust_list_head: list.next, futex_offset, list_op_pending


def _robust_list_head(tid: int) -> Optional[int]:
    """The address of thread ``tid``'s robust-futex list head (in its process), 0 if it has none, None if not known."""
    if _GET_ROBUST_LIST is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - there is always a C library
        return None
    head, size = ctypes.c_void_p(), ctypes.c_size_t()
    if libc.syscall(_GET_ROBUST_LIST, tid, ctypes.byref(head), ctypes.byref(size)) != 0:
        return None  # gone, or not ours to look at (EPERM)
    # 0: the thread registered no list (a process stopped right after exec, before the C library set
    # one up); it cannot hold a robust mutex then, since glibc takes one only on a registered list.
    return head.value or 0


def robust_locks_held(pid: int) -> Optional[bool]:
    """Whether a thread of the stopped process ``pid`` holds a robust mutex, or is taking or releasing one.

    Why: the Python backend's shared memory is guarded by process-shared robust mutexes (Boost's);
    when a stub dies holding one, tritonserver's next lock of it throws
    ``boost::interprocess::lock_exception``, which nothing catches: the server aborts. The kernel
    keeps, per thread, the list glibc links a thread's robust mutexes into while it holds them
    (``set_robust_list``): an empty list with no operation pending means none is held. Read it only
    while every thread of ``pid`` is stopped, or it may change meanwhile. None where that cannot be
    read (another user's process, no ``get_robust_list`` here, the process gone).
    """
    threads = proc.tasks(f"{proc.PROC}/{pid}/task")
    if not threads:
        return None
    for tid in threads:
        head = _robust_list_head(tid)
        if head == 0:
            continue  # no list registered: it holds none
        raw = proc.read_memory(pid, head, _HEAD.size) if head is not None else None
        if raw is None:
            return None
        following, _, pending = _HEAD.unpack(raw)
        if following != head or pending:
            return True
    return False


STOP_WAIT_S = 10.0
"""How long :func:`kill_outside_robust_locks` waits, each time, for a process it stopped to be stopped."""


def _wait_stopped(pid: int, deadline: float) -> bool:
    """Until every thread of ``pid`` is stopped by a signal (or gone): True if so by ``deadline``."""
    while True:
        states = proc.task_states(pid)
        if all(state in "TtZX" for state in states.values()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0005)


def kill_outside_robust_locks(pid: int, limit_s: float = 1.0) -> str:
    """SIGKILL ``pid`` at a moment none of its threads holds a robust mutex; returns how it went.

    The process is stopped (``SIGSTOP``) and looked at (:func:`robust_locks_held`); while a thread
    holds a lock, it runs for a moment (``SIGCONT``, a few milliseconds, ``SIGSTOP``) to let go, for
    at most ``limit_s`` in all (plus the wait for each stop to take effect, :data:`STOP_WAIT_S` at most). A process stopped inside such a lock is what a ``SIGSTOP`` at a random
    moment can leave (a stub preempted inside it on a loaded host), and killing it there aborts
    tritonserver (see :func:`robust_locks_held`); letting it finish the lock is safe, since the server
    cannot have freed what that lock guards meanwhile. Returns ``"free"`` (killed holding none),
    ``"unknown"`` (killed without being able to tell, as before this existed), ``"held"`` (killed
    still holding one after ``limit_s``) or ``"gone"``. Raises nothing: a process that vanished is gone.
    """
    deadline = time.monotonic() + limit_s
    step_s = 0.001
    outcome = "unknown"
    try:
        os.kill(pid, signal.SIGSTOP)
        # Waiting for the stop itself is not bounded by ``limit_s``: a process stops once the kernel
        # schedules each of its threads, which on a loaded host can take longer than the budget for
        # letting go of a lock, and killing it before it stopped would be the blind kill this avoids.
        while _wait_stopped(pid, time.monotonic() + STOP_WAIT_S):
            held = robust_locks_held(pid)
            if held is None:
                break
            if not held:
                outcome = "free"
                break
            outcome = "held"
            if time.monotonic() >= deadline:
                break
            os.kill(pid, signal.SIGCONT)
            time.sleep(step_s)
            step_s = min(step_s * 2, 0.016)
            os.kill(pid, signal.SIGSTOP)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "gone"
    return outcome
