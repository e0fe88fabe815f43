"""The ownership rule for the directories pytriton writes model files into, and how it writes them.

Why: the stub Triton starts for a model runs ``model.py``, the ``_pytriton_stubside`` package,
``pytriton_private.json`` and (``instance_kind="backend"``) unpickles ``pytriton_backend.pkl``, all
from the model repository, as the serving user. A directory another local user may change (one they
created first, or one writable by group or other) lets them rename their own code into place there,
or plant a symlink that pytriton's next write follows (docs/security.md, "Directories only the
serving user can change").

The rule (one place, used by ``Workspace``, ``Triton.run`` and ``BoundModel.write_repository``):

- the repository or workspace directory, and every directory pytriton writes below it, is a real
  directory (not a symlink) owned by the serving user (effective uid) and not writable by group or
  other; :func:`private_directory` and :func:`private_subdir` create missing ones with mode 0700;
- every directory above it (and above the target of each symlink on the given path) is owned by root
  or the serving user and, if group or other may write it, has the sticky bit (``/tmp``): nobody else
  can then rename the repository away and put their own in its place. Each symlink on the given path
  is owned by root or the serving user (in a sticky directory the symlink's owner could replace it);
- files are written by :func:`write_private`: a new 0600 file created exclusively, without following
  symlinks, in the same directory, then renamed over the target. A symlink planted at the target is
  replaced, never followed, and a reader never sees half a file.

A path that breaks the rule raises :class:`UnsafePathError`, naming the path, the owner and mode
found, and the fix. Checks are ``lstat`` calls on a handful of directories: microseconds, once per
``run()``/``bind()``. Unit tests: tests/unit/test_paths.py.
"""

from __future__ import annotations

import os
import pathlib
import pwd
import stat
import threading
from typing import Set, Union

from pytriton.exceptions import PyTritonValidationError

PathLike = Union[str, "os.PathLike[str]"]


class UnsafePathError(PyTritonValidationError):
    """A directory pytriton would write model files into can be changed by another local user."""


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _me() -> str:
    return _owner(os.geteuid())


def check_private_dir(path: PathLike, what: str) -> None:
    """Raise :class:`UnsafePathError` unless ``path`` is a directory (not a symlink) of mine that only I may write."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise UnsafePathError(f"The {what} {os.fspath(path)} does not exist.") from None
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePathError(
            f"The {what} {os.fspath(path)} is a symlink (to {os.readlink(path)}); pytriton writes into a real "
            f"directory only. Give the directory's own path, or choose another directory."
        )
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePathError(f"The {what} {os.fspath(path)} is not a directory.")
    if info.st_uid != os.geteuid():
        raise UnsafePathError(
            f"The {what} {os.fspath(path)} is owned by {_owner(info.st_uid)}, not by the serving user {_me()}: "
            f"its owner could put their own code where the stub loads it. Use a directory you created "
            f"yourself, or a new path (pytriton creates it 0700); taking this one over (`chown`) would keep "
            f"whatever its owner already put inside."
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(
            f"The {what} {os.fspath(path)} has mode {stat.S_IMODE(info.st_mode):04o}: group or other may write "
            f"it, and so rename their own files into it or plant symlinks there. Run `chmod go-w "
            f"{os.fspath(path)}`, or choose another directory."
        )


def _check_ancestor(directory: str) -> None:
    """A directory above a repository: owned by root or me; writable by group/other only with the sticky bit."""
    info = os.stat(directory)
    if info.st_uid not in (0, os.geteuid()):
        raise UnsafePathError(
            f"{directory}, a directory above pytriton's model files, is owned by {_owner(info.st_uid)}, neither "
            f"root nor the serving user {_me()}: its owner could replace what lies below it. Choose a "
            f"directory under one that root or you own."
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise UnsafePathError(
            f"{directory}, a directory above pytriton's model files, has mode {stat.S_IMODE(info.st_mode):04o}: "
            f"group or other may write it without the sticky bit, so they could rename the directory below "
            f"it and put their own in its place. Run `chmod go-w {directory}` (or `chmod +t`), or choose "
            f"another directory."
        )


def check_parents(path: PathLike) -> None:
    """Check every directory above ``path`` and every symlink on the way to it (see the module docstring)."""
    absolute = os.path.abspath(os.fspath(path))
    parts = pathlib.PurePosixPath(absolute).parts
    checked: Set[str] = set()
    for end in range(1, len(parts) + 1):
        prefix = os.path.join(*parts[:end])
        try:
            info = os.lstat(prefix)
        except FileNotFoundError:
            break  # not created yet: what exists above it was checked
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in (0, os.geteuid()):
            raise UnsafePathError(
                f"{prefix}, a symlink on the path {absolute}, is owned by {_owner(info.st_uid)}, neither root "
                f"nor the serving user {_me()}: its owner could point it elsewhere at any time. Give the "
                f"real path ({os.path.realpath(prefix)}) or choose another directory."
            )
        real = pathlib.PurePosixPath(os.path.realpath(prefix))
        above = [str(parent) for parent in real.parents]
        for directory in above if end == len(parts) else [str(real), *above]:
            if directory not in checked:
                checked.add(directory)
                _check_ancestor(directory)


def private_directory(path: PathLike, what: str) -> pathlib.Path:
    """``path`` resolved, created (missing components mode 0700) if needed, checked against the rule; raises otherwise.

    The returned path has no symlinks: pytriton writes through it, so a symlink swapped later changes nothing.
    """
    given = os.path.expanduser(os.fspath(path))
    check_parents(given)
    resolved = pathlib.Path(os.path.realpath(given))
    missing = []
    for candidate in (resolved, *resolved.parents):
        if os.path.lexists(candidate):
            break
        missing.append(candidate)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass  # created meanwhile: checked below like any existing one
    for directory in reversed(missing[1:]):
        _check_ancestor(str(directory))
    check_private_dir(resolved, what)
    return resolved


def private_subdir(parent: pathlib.Path, name: str, what: str = "directory") -> pathlib.Path:
    """``parent/name``, created with mode 0700 if missing, checked against the rule; ``parent`` was checked already."""
    target = parent / name
    try:
        os.mkdir(target, 0o700)
    except FileExistsError:
        pass
    check_private_dir(target, what)
    return target


def write_private(path: pathlib.Path, content: bytes) -> None:
    """Replace ``path`` with a 0600 file holding ``content``, never following a symlink at ``path``.

    Written to a new file beside it (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600 from creation),
    then renamed over ``path``: a symlink there is replaced, not followed, and a reader sees the old
    file or the new one, whole. The directory must have passed the rule (nobody else can write it).
    """
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        os.unlink(partial)  # a leftover of a killed writer with this pid and thread id
    except FileNotFoundError:
        pass
    descriptor = os.open(partial, flags, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(content)
        os.replace(partial, path)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise
