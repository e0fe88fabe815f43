"""Ends a stub process that has been stopped (``SIGSTOP``) for too long, so that the model is replaced cleanly.

Why (measured with tritonserver 2.51, docs/architecture.md "A stopped stub"): while a stub is stopped,
Triton's Python backend fails each request sent to it after about a second ("Stub process '<model>_0_0'
is not healthy."), yet the model stays ready; the messages it queued for the stub stay queued. When the
stub resumes it works through those stale messages, and tritonserver aborts with
``boost::interprocess::lock_exception`` (3 of 3 trials after a 5 s pause here; 2 of 6 after 30 s in the
issue's trials), which takes every model down until the supervisor has restarted the server. A stub
``SIGKILL``ed instead of resumed is what pytriton already handles: its connection ends, the model is
replaced by a new generation (the supervisor, ``pytriton/_serving/supervisor.py``) in about a second,
and the server keeps running.

So a process-wide watcher thread polls ``/proc/<pid>/stat`` of every attached stub (the Unix transport:
same host; over TCP the stub's pid is on another host and is not watched) and ``SIGKILL``s one that has
been in state ``T`` (stopped by a signal) for :data:`STOPPED_LIMIT_S`. A stub under a debugger is in
state ``t`` (tracing stop) and is left alone. A pid is only killed while its start time is the one
recorded when it said hello, so a reused pid is never hit.

Lifetime: the thread starts with the first :func:`watch` and ends once nothing is watched.
Unit tests: tests/unit/test_stub_watch.py.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from pytriton._platform import native, proc

LOGGER = logging.getLogger("pytriton.triton")

# How long a stub may stay stopped before it is killed (and replaced): Triton fails its requests
# after about 1 s anyway; at 2 s a stub paused by accident is replaced well before it resumes.
STOPPED_LIMIT_S = float(os.environ.get("PYTRITON_STUB_STOPPED_LIMIT_S", "2.0"))
POLL_S = 0.25


proc_stat = proc.stat_fields  # ``/proc/<pid>/stat`` fields after the command name; [] if the process is gone


def start_time(pid: int) -> Optional[int]:
    """The start time of ``pid`` (clock ticks since boot; stat field 22), or None if it is gone."""
    info = proc.stat(pid)
    return info.start_time if info is not None else None


def is_stub(pid: int) -> bool:
    """True if ``pid`` runs Triton's Python-backend stub (its first argument names the binary)."""
    return proc.program_is(pid, "triton_python_backend_stub")


def stopped(pid: int) -> bool:
    """True if ``pid`` is a Python-backend stub stopped by a signal (state ``T``; a debugger's ``t`` is not)."""
    fields = proc_stat(pid)
    return bool(fields) and fields[0] == "T" and is_stub(pid)


def _kill_outside_locks(pid: int) -> None:
    """SIGKILL ``pid`` once it holds none of the Python backend's locks (``native.kill_outside_robust_locks``).

    A stub stopped inside such a lock and killed there makes tritonserver abort. Raises
    ``ProcessLookupError`` if it was gone.
    """
    if native.kill_outside_robust_locks(pid) == "gone":
        raise ProcessLookupError(pid)


class StubWatch:
    """The watched stubs and the thread that polls them (one per process: :data:`WATCH`)."""

    def __init__(
        self, limit_s: float = STOPPED_LIMIT_S, poll_s: float = POLL_S, kill: Optional[Callable[[int], None]] = None
    ):
        self.limit_s = limit_s
        self.poll_s = poll_s
        self._kill = kill or _kill_outside_locks
        self._lock = threading.Lock()
        # key -> (pid, start time, description, monotonic time it was first seen stopped or None)
        self._watched: Dict[object, Tuple[int, int, str, Optional[float]]] = {}
        self._thread: Optional[threading.Thread] = None

    def watch(self, key: object, pid: int, description: str) -> None:
        """Watch stub ``pid`` under ``key`` (a session) until :meth:`forget`.

        Nothing is watched unless ``pid`` is a Python-backend stub seen from here (the user's process
        may live in another pid namespace, where the number names another process).
        """
        started = start_time(pid)
        if started is None or not is_stub(pid):
            return
        with self._lock:
            self._watched[key] = (pid, started, description, None)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pytriton-stub-watch", daemon=True)
                self._thread.start()

    def forget(self, key: object) -> None:
        with self._lock:
            self._watched.pop(key, None)

    def check(self, now: float) -> List[int]:
        """One round: kill each stub stopped for :attr:`limit_s` or longer; returns the pids killed."""
        killed = []
        with self._lock:
            entries = list(self._watched.items())
        for key, (pid, started, description, since) in entries:
            fields = proc_stat(pid)
            stopped = len(fields) > proc.START_TIME and fields[0] == "T" and int(fields[proc.START_TIME]) == started
            if not stopped:
                since = None
            elif since is None:
                since = now
            elif now - since >= self.limit_s:
                LOGGER.warning(
                    "The stub process of %s (pid %d) has been stopped for %.1f s: Triton fails its requests, and "
                    "would abort when it resumes; killing it so that the model is replaced.",
                    description,
                    pid,
                    now - since,
                )
                try:
                    self._kill(pid)
                    killed.append(pid)
                except OSError:  # gone meanwhile, or not ours to signal
                    pass
                with self._lock:
                    self._watched.pop(key, None)
                continue
            with self._lock:
                if key in self._watched:
                    self._watched[key] = (pid, started, description, since)
        return killed

    def _run(self) -> None:
        while True:
            time.sleep(self.poll_s)
            with self._lock:
                if not self._watched:
                    self._thread = None
                    return
            try:
                self.check(time.monotonic())
            except Exception:  # noqa: BLE001 - the watcher must outlive any surprise in /proc
                LOGGER.exception("pytriton's stub watcher failed one round")


WATCH = StubWatch()
