"""The Python backend's scratch directory, which ``tritonserver`` removes only on a clean exit.

When Triton's Python backend is initialized (the server's first Python model load) it creates an
empty directory with ``mkdtemp("/tmp/python_env_XXXXXX")``, a fixed template that ``TMPDIR`` does not
change, for execution environments, and deletes it when the server exits cleanly. pytriton ends
the server with SIGKILL once its own workers are idle (a clean exit takes seconds), and a killed
user process takes the server down the same way, so without help every server run would leave one
directory behind.

The name is random and never printed, and nothing links the directory to the process that made
it (no open descriptor, no log line, no argument of the stubs), so it cannot be identified
positively; it is found by elimination: a server creates exactly one such directory, while its
first Python model loads. If exactly one new directory of this user appears during that load, it
is this server's. If several appear, none is claimed: removing a live server's directory would
break that server's own clean-up.

Elimination is made unambiguous between pytriton processes of one user: each holds an exclusive
``flock`` on ``$PYTRITON_HOME/.python_env.lock`` from just before its first load until its
directory has appeared (a watcher thread polls for it) or the load has ended, so no two pytriton
servers are ever in that window at once, however loaded the machine. The lock is released as soon
as the directory is seen (starts are serialized only for the moment the backend takes to
initialize), and by the kernel if the process dies. A process that cannot get the lock within
:data:`LOCK_WAIT_S` goes ahead without it (and may then find its window ambiguous). A
``tritonserver`` not started by pytriton can still make a window ambiguous.
Removal uses ``rmdir``, which only ever deletes an empty directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from typing import Optional, Set

from pytriton.server.distribution import pytriton_home

SCRATCH_ROOT = "/tmp"
SCRATCH_PREFIX = "python_env_"
LOCK_NAME = ".python_env.lock"
# How long a start waits for another pytriton process's window to close (a server's first load).
LOCK_WAIT_S = 60.0
# How long the lock is held at most while no directory appears (the load itself is not bounded here).
WATCH_LIMIT_S = 120.0
_POLL_S = 0.01


def _scratch_dirs() -> Set[str]:
    try:
        with os.scandir(SCRATCH_ROOT) as entries:
            return {entry.path for entry in entries if entry.name.startswith(SCRATCH_PREFIX)}
    except OSError:
        return set()


def _owned_by_us(path: str) -> bool:
    try:
        return os.stat(path).st_uid == os.geteuid()
    except OSError:
        return False


def _new_dirs(before: Set[str]) -> Set[str]:
    return {path for path in _scratch_dirs() - before if _owned_by_us(path)}


def _acquire_window_lock(wait_s: float) -> Optional[int]:
    """An open descriptor holding the exclusive window lock, or None (no lock within ``wait_s``)."""
    try:
        home = pytriton_home()
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(home / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(_POLL_S)


class ScratchDirTracker:
    """Finds and removes one server's Python-backend scratch directory.

    Call :meth:`before_first_load` right before the server may load its first Python model and
    :meth:`after_first_load` once that load has finished (or failed); later calls do nothing.
    :meth:`remove` is for after the server has exited. Between the first two calls this object
    holds the window lock and runs a daemon watcher thread (both end by ``after_first_load``, or
    when the directory appears, or after :data:`WATCH_LIMIT_S`).
    """

    def __init__(self) -> None:
        self._before: Optional[Set[str]] = None
        self._done = False
        self.path: Optional[str] = None
        self._mutex = threading.Lock()
        self._lock_fd: Optional[int] = None
        self._seen: Optional[Set[str]] = None  # new directories seen while holding the lock
        self._stop = threading.Event()
        self._watcher: Optional[threading.Thread] = None

    def before_first_load(self) -> None:
        """Take the window lock, remember which scratch directories exist, watch for the new one."""
        if self._done or self._before is not None:
            return
        self._lock_fd = _acquire_window_lock(LOCK_WAIT_S)
        self._before = _scratch_dirs()
        if self._lock_fd is not None:
            self._stop.clear()
            self._watcher = threading.Thread(
                target=self._watch, args=(self._before,), name="pytriton-scratch-watch", daemon=True
            )
            self._watcher.start()

    def _watch(self, before: Set[str]) -> None:
        """Until a new directory appears (or the window ends): then note it and let others in."""
        deadline = time.monotonic() + WATCH_LIMIT_S
        while not self._stop.wait(_POLL_S):
            created = _new_dirs(before)
            if created or time.monotonic() >= deadline:
                with self._mutex:
                    if self._lock_fd is not None:  # after_first_load has not taken over
                        self._seen = created or None
                        self._release_lock()
                return

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def after_first_load(self, succeeded: bool) -> Optional[str]:
        """Claim the directory the load created, if unambiguous; returns the claimed one (or None).

        ``succeeded``: the server's Python backend is known to have initialized (a model loaded, or
        the server's log showed it starting an instance of one before the start failed). Otherwise
        nothing is claimed (the backend may not have started, so a new directory could be another
        server's), and tracking ends either way.
        """
        if self._done or self._before is None:
            return self.path
        self._done = True
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(5.0)
            self._watcher = None
        with self._mutex:
            # Seen while holding the lock: no other pytriton server was in its window meanwhile.
            created = set(self._seen) if self._seen is not None else _new_dirs(self._before)
            self._release_lock()
        self._before = None
        if succeeded and len(created) == 1:
            self.path = created.pop()
        return self.path

    def remove(self) -> None:
        """Remove the claimed directory if it is still there and empty. Idempotent."""
        with self._mutex:
            self._release_lock()
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.path)
