"""A model load returns only once the threads it started are idle (Triton 2.51's unload-right-after-load crash).

Why: Triton runs an instance's payloads (initialize, warm up, batches, exit) on a backend thread
that holds its instance in a deque while it waits for work; it takes the instance out while it
executes a payload and puts it back afterwards. The caller of a load is released from *inside* the
instance's last payload (the warm-up fulfils the promise the load waits on before the thread puts the
instance back). An unload (or ``stop()``) in that window starts the model deleter, whose
``TritonBackendThread::StopBackendThread`` reads the back of the empty deque, unsynchronized: a
garbage instance, so ``RateLimiter::EnqueuePayload`` finds no queue for it and
``InstanceQueue::DecrementConsumerCount`` locks a mutex at address 0xa0: SIGSEGV on the deleter
thread, no Python frame (core dumps: docs/inprocess.md "Known limitations of the server library").
The window is a few instructions long, but on a loaded machine the backend thread can be preempted
inside it for milliseconds: in unload/load loops beside two busy processes, about 1 unload in 110
crashed the process; tests/e2e/test_inprocess_reload.py makes the window certain with a preloaded shim.

How: :func:`tasks` before the call that loads (``ServerNew`` with startup models, ``ServerLoadModel``,
a repository poll); after it, :func:`wait_until_idle` waits, bounded, until every thread that
appeared (Python's own aside) has been *seen idle once*: sleeping (``S``), and not waiting for a
mutex (a ``futex`` ``FUTEX_WAIT``/``FUTEX_LOCK_PI`` in ``/proc/self/task/<tid>/syscall``: the thread
may be contending a lock inside the window). A backend thread is idle only in its condition wait for
the next payload (``FUTEX_WAIT_BITSET``), reached after it put its instance back; it leaves that
wait only for a new payload, so once seen there the load's window is closed for good. (The window of
an inference batch is harmless: there the thread takes its instance from the front of the deque, so
the stale slot the deleter reads still holds that instance.)

A thread that is never seen idle by the deadline (one kept busy by traffic from the start, or on a
machine where ``/proc`` cannot tell) is reported to the caller, which only logs it: the load itself
succeeded.

Unit tests: tests/unit/test_inprocess_settle.py (a fake ``/proc/self/task``).
"""

from __future__ import annotations

import time
from typing import FrozenSet, Optional, Set

from pytriton._platform import proc
from pytriton.inprocess._teardown import python_threads

TASK_DIR = proc.TASK_DIR


def tasks(task_dir: Optional[str] = None) -> Optional[FrozenSet[int]]:
    """The ids of this process's threads, or None where ``/proc`` cannot tell (then nothing is waited for)."""
    return proc.tasks(task_dir or TASK_DIR)


def _idle(tid: int, task_dir: str) -> bool:
    """True if thread ``tid`` sleeps, and not for a mutex; also True once it has exited."""
    fields = proc.stat_fields(tid, task_dir)
    if not fields:
        return True  # exited
    state = fields[proc.STATE]
    if state in ("Z", "X"):
        return True
    if state != "S":
        return False  # running or runnable (R), in uninterruptible sleep (D), stopped (T, t)
    wait = proc.futex_wait(tid, task_dir)
    # Asleep in another call (poll, nanosleep, read), or in a condition wait: idle; waiting for a mutex: not.
    return wait is None or wait.operation not in proc.FUTEX_LOCK_WAITS


def wait_until_idle(
    before: Optional[FrozenSet[int]], deadline: float, interval_s: float = 0.002, task_dir: Optional[str] = None
) -> FrozenSet[int]:
    """Wait until every thread not in ``before`` (Python's threads aside) has been seen idle at least once.

    Returns the threads not seen idle by ``deadline`` (``time.monotonic()``), or an empty set; nothing
    is waited for when ``before`` is None. Reads the new threads' stat files at most once per ``interval_s``.
    """
    if before is None:
        return frozenset()
    directory = task_dir or TASK_DIR
    seen_idle: Set[int] = set()
    while True:
        now = proc.tasks(directory)
        if now is None:
            return frozenset()
        pending = now - before - python_threads() - seen_idle
        seen_idle.update(tid for tid in pending if _idle(tid, directory))
        left = frozenset(pending - seen_idle)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(interval_s)
