"""``Workspace``: the directory holding a ``Triton`` instance's model repository and files."""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import tempfile
import weakref
from typing import List, Optional, Union

from pytriton._platform import paths as _paths
from pytriton.server.distribution import pytriton_home

LOGGER = logging.getLogger(__name__)


class Workspace:
    """A working directory, removed again by :meth:`clean`.

    With no path, a fresh ``workspace_*`` directory is created under ``$PYTRITON_HOME`` and
    removed entirely on clean. With a path, the directory is created if needed; on clean pytriton
    removes what it created there, and the directory itself only if pytriton created it.

    Lifetime of a fresh directory: :meth:`clean` removes it; if nobody calls it (a ``Workspace``
    dropped by its user, or an owner that never cleaned it), it is removed when this object
    is garbage-collected or, at the latest, when the interpreter exits normally (``weakref.finalize``,
    which runs after the ``atexit`` handlers registered later, ``Triton.stop`` among them). Only the
    process that created it removes it that way: a forked child that exits leaves it alone. A
    killed process leaves it to the crash guard (``_platform/watchdog.py``, see :func:`cleanup_paths`).

    Ownership (``_platform/paths.py``, docs/security.md): the directory, given or fresh, and every
    directory :meth:`subdir` makes must be owned by the serving user and not writable by group or
    other (missing ones are created 0700); the directories above it must be owned by root or that user
    and not writable by others unless sticky. Otherwise the constructor (or :meth:`subdir`) raises
    ``UnsafePathError`` naming the path and the fix: another user could plant code the stub runs.
    For the fresh default directory (always 0700 and the user's own) a problem above it is only
    logged as a WARNING, so that the default keeps working where ``$HOME``'s parents are not the
    user's.
    """

    def __init__(self, path: Union[str, pathlib.Path, None] = None):
        self._created: List[pathlib.Path] = []
        if path is None:
            home = pytriton_home()
            home.mkdir(parents=True, exist_ok=True)
            self._path = pathlib.Path(tempfile.mkdtemp(prefix="workspace_", dir=os.path.realpath(home)))
            self._owned = True
            try:  # mkdtemp made it 0700 and mine; what is above it should not let others swap it
                _paths.check_parents(self._path)
            except _paths.UnsafePathError as exc:
                # Warned, not refused: the default must serve where $HOME's parents belong to an image's
                # build user (OpenShift runs containers under a random uid); a path given explicitly is refused.
                LOGGER.warning("%s (Used anyway for the default workspace; set PYTRITON_HOME to avoid it.)", exc)
            self._remover: Optional[weakref.finalize[[pathlib.Path, int], Workspace]] = weakref.finalize(
                self, _remove, self._path, os.getpid()
            )
        else:
            self._remover = None
            given = pathlib.Path(path).expanduser()
            self._owned = not os.path.lexists(given)
            self._path = _paths.private_directory(given, "workspace")

    @property
    def path(self) -> pathlib.Path:
        """The workspace directory."""
        return self._path

    def subdir(self, name: str) -> pathlib.Path:
        """Create (if needed, mode 0700) and return ``path/name``; it is removed by :meth:`clean`.

        Raises ``UnsafePathError`` if it exists and is not a directory only the serving user may change.
        """
        target = self._path / name
        created = not os.path.lexists(target)
        _paths.private_subdir(self._path, name, "workspace directory")
        if created:
            self._created.append(target)
        return target

    def clean(self) -> None:
        """Remove what this workspace created. Idempotent."""
        if self._remover is not None:
            self._remover()  # removes the directory once, then never again
        elif self._owned:
            shutil.rmtree(self._path, ignore_errors=True)
        else:
            for target in self._created:
                shutil.rmtree(target, ignore_errors=True)
        self._created = []

    def exists(self) -> bool:
        """True while the directory exists."""
        return self._path.exists()

    def __repr__(self) -> str:
        return f"Workspace({str(self._path)!r})"


def _remove(path: pathlib.Path, creator_pid: int) -> None:
    """Remove a workspace directory nobody cleaned, in the process that created it only."""
    if os.getpid() == creator_pid:
        shutil.rmtree(path, ignore_errors=True)


def cleanup_paths(workspace: Workspace) -> Optional[pathlib.Path]:
    """The path a crash guard should remove for ``workspace`` (only one pytriton created)."""
    return workspace.path if workspace._owned else None
