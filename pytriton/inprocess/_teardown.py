"""Deleting a stopped server only once Triton's model deleters are done with it.

Why: Triton 2.51 destroys an unloaded model on a detached thread (its model deleter) that, after
destroying the model, marks it ``UNAVAILABLE`` and then takes the model lifecycle's map lock to
forget it. ``TRITONSERVER_ServerStop`` returns as soon as no model is live, which can be between
those two steps; a ``TRITONSERVER_ServerDelete`` right then frees the lifecycle, mutex included,
under that thread, and glibc can abort the whole process on the freed mutex. That is the likeliest
cause of the one ``Fatal Python error: Aborted`` in ``Server.stop()`` seen on a loaded machine
(Python 3.13; not reproduced here in 19 runs of tests/e2e/test_inprocess_server.py, three at a
time). When ``ServerStop`` gives up at its exit timeout, models may still be in the middle of that
destruction, a much wider window.

How: :func:`tasks` lists this process's threads (``/proc/self/task``) before ``ServerStop``; the
deleters that the stop starts are the threads that appear during it and are not Python threads.
:func:`wait_for_new_tasks` waits, bounded, until they have exited. ``Server.stop()`` deletes the
server only then; if one is still running at the bound (a model that cannot finish unloading), the
server is left undeleted (its memory stays until the process exits) rather than freed under it.

Unit tests: tests/unit/test_inprocess_teardown.py (a fake ``/proc``).
"""

from __future__ import annotations

import threading
import time
from typing import FrozenSet, Optional

from pytriton._platform import proc

TASK_DIR = proc.TASK_DIR


def tasks(task_dir: Optional[str] = None) -> Optional[FrozenSet[int]]:
    """The ids of this process's threads, or None where ``/proc`` cannot tell (then nothing is waited for)."""
    return proc.tasks(task_dir or TASK_DIR)


def python_threads() -> FrozenSet[int]:
    """The native ids of this process's Python threads (never Triton's)."""
    return frozenset(thread.native_id for thread in threading.enumerate() if thread.native_id is not None)


def wait_for_new_tasks(
    before: Optional[FrozenSet[int]], deadline: float, interval_s: float = 0.005, task_dir: Optional[str] = None
) -> FrozenSet[int]:
    """Wait until every thread not in ``before`` (Python's own threads aside) has exited.

    Returns the ones still running at ``deadline`` (``time.monotonic()``), or an empty set. Reads
    ``task_dir`` at most once per ``interval_s``.
    """
    if before is None:
        return frozenset()
    while True:
        now = tasks(task_dir)
        if now is None:
            return frozenset()
        left = now - before - python_threads()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(interval_s)
