"""The Python backend's scratch directory, which ``tritonserver`` removes only on a clean exit.

When Triton's Python backend is initialized (the server's first Python model load) it creates an
empty directory with ``mkdtemp("/tmp/python_env_XXXXXX")``, a fixed template that ``TMPDIR`` does not
change, for execution environments, and deletes it when the server exits cleanly. pytriton ends
the server with SIGKILL once its own workers are idle (a clean exit takes seconds), and a killed
user process takes the server down the same way, so without help every server run would leave one
directory behind.

The name is random and never printed, so it is found by elimination: a server creates exactly one
such directory, while its first Python model loads. If exactly one new directory appears during
that load, it is this server's. If several appear (another server started at the same moment),
none is claimed: removing a live server's directory would break that server's own clean-up.
Removal uses ``rmdir``, which only ever deletes an empty directory.
"""

from __future__ import annotations

import contextlib
import os
from typing import Optional, Set

SCRATCH_ROOT = "/tmp"
SCRATCH_PREFIX = "python_env_"


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


class ScratchDirTracker:
    """Finds and removes one server's Python-backend scratch directory.

    Call :meth:`before_first_load` right before the server may load its first Python model and
    :meth:`after_first_load` once that load has finished (or failed); later calls do nothing.
    :meth:`remove` is for after the server has exited.
    """

    def __init__(self) -> None:
        self._before: Optional[Set[str]] = None
        self._done = False
        self.path: Optional[str] = None

    def before_first_load(self) -> None:
        """Remember which scratch directories exist before this server's backend starts."""
        if not self._done and self._before is None:
            self._before = _scratch_dirs()

    def after_first_load(self, succeeded: bool) -> Optional[str]:
        """Claim the directory the load created, if unambiguous; returns the claimed one (or None).

        After a failed load nothing is claimed (the backend may not have started, so a new
        directory could be another server's), and tracking ends either way.
        """
        if self._done or self._before is None:
            return self.path
        self._done = True
        created = {path for path in _scratch_dirs() - self._before if _owned_by_us(path)} if succeeded else set()
        self._before = None
        if len(created) == 1:
            self.path = created.pop()
        return self.path

    def remove(self) -> None:
        """Remove the claimed directory if it is still there and empty. Idempotent."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.path)
