"""Before ``stop()`` or ``unload()``: end this server's stopped stubs outside the Python backend's locks.

Why: when Triton finalizes a Python-backend model instance (an unload, or ``ServerStop``), the
backend asks the stub for a sign of life and waits 1 s (python_backend r24.10,
``src/stub_launcher.cc``, ``StubLauncher::UpdateHealth``); a stub that gave none is SIGKILLed
wherever it is (``TerminateStub`` → ``KillStubProcess``), and right after that the backend frees
the stub's IPC control block, which locks the region's allocator mutex (``ipc_control_.reset()``).
A stub stopped (``SIGSTOP``, state ``T``) while it held that mutex therefore makes the lock throw
``boost::interprocess::lock_exception`` inside Triton's call: ``std::terminate``, and the user's
process ends with ``Fatal Python error: Aborted`` inside ``stop()`` (tests/e2e/test_inprocess_stop.py,
docs/inprocess.md "Known limitations of the server library"). A stub stopped while a server thread
waits for one of its mutexes makes ``stop()`` wait out the exit timeout instead, and leaves the
server undeleted.

A stopped stub gives no sign of life, so Triton would kill it at that random point anyway. pytriton
kills it first, at a moment none of its threads holds a robust mutex
(``native.kill_outside_robust_locks``: it lets the stub run a few milliseconds at a time until it
let go); Triton's kill then meets a dead stub that holds nothing. Except a stub holding a lock
that one of Triton's threads waits for (:func:`lock_waited_for`): it stopped mid-request and the
backend gave up on that request, so letting it run would make it work on a message the backend
freed (tritonserver aborted so, gate ``stub-stop-destruction``), and killing it would abort too. It
is left to Triton, with a WARNING: the stop then waits out the exit timeout, as before. A stub that is running but does
not answer within the second (starved on a loaded host) cannot be told from a healthy one in time:
that case stays Triton's.

Which stubs are this server's: children of this process (the backend forks them) that run
``triton_python_backend_stub``, with a region named with the backend's shared-memory prefix, whose
model file lies in one of this server's repositories (for ``unload()``: that model's directory).
Two in-process servers of one process over the same repository cannot be told apart this way (the
backend and its prefix are shared): a stopped stub of the other one is ended too; it could not serve.

Unit tests: tests/unit/test_inprocess_stopped_stubs.py (a fake ``/proc``).
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Iterable, List, Tuple

from pytriton._platform import native, proc

LOGGER = logging.getLogger(__name__)
STUB_EXECUTABLE = "triton_python_backend_stub"
KILL_LIMIT_S = 5.0  # how long a stub may run, a few ms at a time, to let go of a lock before it is killed anyway


def _under(path: str, directories: Iterable[str]) -> bool:
    real = os.path.realpath(path)
    return any(real.startswith(os.path.realpath(directory).rstrip(os.sep) + os.sep) for directory in directories)


def stopped_stubs(
    parent: int, region_prefix: str, directories: Iterable[str], root: str = proc.PROC
) -> List[Tuple[int, str]]:
    """``(pid, region)`` of ``parent``'s stopped (``T``) stubs with a ``region_prefix...`` region and a model file under ``directories``.

    A stub's command line is ``<stub> <model file> <region> ...``. A process stopped by a tracer
    (``t``) is left alone: a debugger holds it, and signals cannot let it run.
    """
    wanted = list(directories)
    found = []
    for pid in proc.children(parent, root, running_only=True):
        status = proc.stat(pid, root)
        if status is None or status.state != "T":
            continue
        argv = proc.cmdline(pid, root) or []
        if len(argv) < 3 or os.path.basename(argv[0]) != STUB_EXECUTABLE:
            continue
        regions = [arg for arg in argv[2:] if arg.startswith(region_prefix) and "/" not in arg]
        if regions and _under(argv[1], wanted):
            found.append((pid, regions[0]))
    return sorted(found)


def lock_waited_for(region: str, root: str = proc.PROC) -> bool:
    """Whether a thread of this process is blocked taking a mutex that lies in its mapping of ``/dev/shm/<region>``.

    Such a thread is Triton's, waiting for a lock the stopped stub holds: a request was in flight
    when the stub stopped, and the backend gave up on it (``Stub process ... is not healthy``) and
    now frees its message. A mutex's slow path waits with ``FUTEX_WAIT`` on the mutex's word
    (``/proc/self/task/<tid>/syscall``); the backend's semaphores and conditions wait with
    ``FUTEX_WAIT_BITSET``, so idle threads do not count. False where that cannot be read.
    """
    ranges = [(start, end) for start, end, path in proc.mappings("self", root) if path == f"/dev/shm/{region}"]
    if not ranges:
        return False
    for tid in proc.tasks(os.path.join(root, "self", "task")) or ():
        wait = proc.futex_wait(f"self/task/{tid}", root)
        if (
            wait
            and wait.operation in proc.FUTEX_LOCK_WAITS
            and any(start <= wait.address < end for start, end in ranges)
        ):
            return True
    return False


def end_stopped_stubs(
    region_prefix: str,
    directories: Iterable[str],
    why: str,
    kill: Callable[[int, float], str] = native.kill_outside_robust_locks,
    root: str = proc.PROC,
) -> List[Tuple[int, str]]:
    """Kill this process's stopped stubs that :func:`stopped_stubs` selects, each outside the backend's locks.

    Returns ``(pid, outcome)`` pairs (outcomes of ``native.kill_outside_robust_locks``); logs a
    WARNING per stub, naming ``why`` (the call about to hand the stubs to Triton). Raises nothing.
    """
    outcomes = {"free": "holding none", "held": f"still holding one after {KILL_LIMIT_S:.0f} s"}
    ended = []
    for pid, region in stopped_stubs(os.getpid(), region_prefix, directories, root):
        if lock_waited_for(region, root):
            ended.append((pid, "left"))
            LOGGER.warning(
                "%s: the Python-backend stub %d is stopped (SIGSTOP) holding a lock that one of Triton's threads "
                "waits for (a request was in flight): it is left to Triton, since letting it run would make it "
                "work on a request the backend gave up, and killing it could abort this process; the stop may "
                "take the exit timeout. Resume the stub (SIGCONT) or end it before stopping the server.",
                why,
                pid,
            )
            continue
        outcome = kill(pid, KILL_LIMIT_S)
        ended.append((pid, outcome))
        LOGGER.warning(
            "%s: the Python-backend stub %d was stopped (SIGSTOP); Triton would kill it wherever it is, which "
            "aborts this process if it holds one of the backend's locks, so it was killed first (%s)",
            why,
            pid,
            outcomes.get(outcome, outcome),
        )
    return ended
