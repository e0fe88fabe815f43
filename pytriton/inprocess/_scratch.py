"""The scratch directory of this process's Python backend, removed even when the backend cannot finalize.

Triton's Python backend creates ``/tmp/python_env_XXXXXX`` when it initializes, at the first Python
model load of the first in-process server, and removes it when it finalizes, after the last server
is deleted. A model that cannot unload (its stub died) keeps the backend from ever finalizing, so
that directory outlived the process: one per dead stub. (A later server initializes a backend of
its own, with a new directory, so the old one is never used again.)

The directory is found as ``server/_scratch.py`` finds a launched server's: by elimination, in a
window around the call that initializes the backend (``Server.start()``, ``load()`` or
``poll_model_repository()``), holding the same lock as every pytriton start of this user. A window
is opened only while the backend is not known to be up, and only one at a time in this process:
a call made while another is in its window does not wait, since there is one backend per process
and that window watches for it. The backend is known to be up once its shared-memory regions
(named with the backend's prefix) exist. :meth:`BackendScratch.remove` runs after the last server
of the process is deleted; ``rmdir`` removes only an empty directory, and one the backend removed
already is simply gone.

``Triton(embedded=True)`` tracks the directory itself (``pytriton/_serving/launched.py``), so its server
opens no window here (``Server._tracks_scratch``).

Unit tests: tests/unit/test_inprocess_scratch.py; end to end: tests/e2e/test_inprocess_lifecycle.py.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import threading
from typing import Iterator, Optional

from pytriton.server._scratch import ScratchDirTracker

SHM_ROOT = "/dev/shm"


def _regions_exist(prefix: str) -> bool:
    """Whether a Python-backend region named ``prefix*`` exists: the backend is up."""
    root = pathlib.Path(SHM_ROOT)
    try:
        return any(True for _ in root.glob(f"{prefix}*"))
    except OSError:
        return False


class BackendScratch:
    """The claimed scratch directory of this process's current Python backend (None until claimed)."""

    def __init__(self) -> None:
        self._window = threading.Lock()
        self.path: Optional[str] = None

    @contextlib.contextmanager
    def window(self, prefix: str) -> Iterator[None]:
        """Around a call that may initialize the backend: claim the directory it creates, if unambiguous.

        ``prefix`` is the backend's shared-memory prefix. The body runs whatever happens here; the
        window lock is held at most until the directory appears or the body ends.
        """
        if self.path is not None or _regions_exist(prefix) or not self._window.acquire(blocking=False):
            yield
            return
        try:
            tracker = ScratchDirTracker()
            tracker.before_first_load()
            try:
                yield
            finally:
                # Only a backend seen up can have made the new directory: a failed load may not
                # have started it, and then a new directory would be another server's.
                claimed = tracker.after_first_load(_regions_exist(prefix))
                if claimed is not None:
                    self.path = claimed
        finally:
            self._window.release()

    def remove(self) -> None:
        """After the last server of the process is deleted: remove the directory if it is left, empty."""
        path, self.path = self.path, None
        if path is not None:
            with contextlib.suppress(OSError):
                os.rmdir(path)


BACKEND_SCRATCH = BackendScratch()
