"""Shared-memory segment names, and sweeping the segments of processes that are gone.

Every segment pytriton creates is named ``pytriton-<user pid>-<token>-...`` (or
``pytriton-inproc-<pid>-...`` for an in-process server's regions), so the user's process can find
the leftovers of a run that died (:func:`sweep_segments`, :func:`sweep_dead_owners`) and close
Triton's own regions to other users (:func:`make_private`).

Imported on both sides (the stub and the user's process): standard library only.
Unit tests: tests/unit/test_wire.py.
"""

from __future__ import annotations

import contextlib
import os
from typing import List, Optional

from ._arena import SHM_DIR


def shm_prefix(user_pid: int, token: str) -> str:
    """Common name prefix of every segment belonging to one ``Triton`` instance."""
    return f"pytriton-{user_pid}-{token}"


def _shm_names() -> List[str]:
    try:
        return os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []


def _unlink_all(names: List[str]) -> List[str]:
    removed = []
    for name in names:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except (FileNotFoundError, PermissionError):
            pass
    return removed


def sweep_segments(prefix: str) -> List[str]:
    """Remove every ``/dev/shm`` entry whose name starts with ``prefix``; return the names removed."""
    return _unlink_all([name for name in _shm_names() if name.startswith(prefix)])


def _owner_pid(name: str) -> Optional[int]:
    """The pid in ``pytriton-<pid>-...`` (a Triton's user process) or ``pytriton-inproc-<pid>-...``
    (a process running an in-process server), else None."""
    parts = name.split("-")
    if parts[0] != "pytriton" or len(parts) < 3:
        return None
    field = parts[2] if parts[1] == "inproc" and len(parts) > 3 else parts[1]
    return int(field) if field.isdigit() else None


def _owner_gone(name: str) -> bool:
    pid = _owner_pid(name)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def sweep_dead_owners() -> List[str]:
    """Remove pytriton segments whose owning user process no longer exists."""
    return _unlink_all([name for name in _shm_names() if _owner_gone(name)])


def make_private(prefix: str) -> List[str]:
    """``chmod 0600`` every ``/dev/shm`` entry of ours whose name starts with ``prefix``; return their names.

    Triton's Python backend creates its regions 0644 (it sets the mode explicitly, so a umask does not
    help): anyone on the machine could read the request tensors in them. An entry owned by someone else
    or already gone is skipped. This closes the file to new openers only; see docs/configuration.md.
    """
    changed = []
    for name in _shm_names():
        if not name.startswith(prefix):
            continue
        path = os.path.join(SHM_DIR, name)
        with contextlib.suppress(FileNotFoundError, PermissionError):
            if os.stat(path).st_mode & 0o077:
                os.chmod(path, 0o600)
                changed.append(name)
    return changed
