"""The ``model.py`` Triton's Python backend loads: pytriton's proxy model, from the package beside it.

``Triton.bind`` writes this file as ``<model>/<version>/model.py`` and copies
``pytriton/proxy/stubside`` beside it as ``_pytriton_stubside/``. The package is loaded from that
directory by its location (``importlib``), under the name ``_pytriton_stubside``, so the stub
needs no ``sys.path`` entry: nothing else in the version directory becomes importable, and no
other copy of a module with the same name (another pytriton installed in the stub's environment)
can be picked up instead. Each stub process hosts one model instance, so the one name in
``sys.modules`` is never shared by two models.

When the version directory also holds ``pytriton_backend.pkl`` (``bind(..., instance_kind="backend")``,
``proxy/_backend_kind.py``), the model is ``_inline.InlineModel`` instead: the callable runs here.

Before running any of the package, :func:`load` checks that nobody but the stub's own user could
have put it there (:func:`check_owned`): the model's and the version's directories, the package
directory, its ``__pycache__`` and every file in them must be owned by the stub's effective uid,
not writable by group or other, and not symlinks; otherwise the model's load fails with an
``ImportError`` naming the path. The package then reads ``pytriton_private.json`` and
``pytriton_backend.pkl`` with the same rule (``_wire.read_owned``). ``model.py`` itself runs before
any check can: only the server side's rule for the repository (``_platform/paths.py``) protects it.

Runs inside the stub: standard library only. Unit tests: tests/unit/test_stub_package.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import stat
import sys
from typing import Any

PACKAGE = "_pytriton_stubside"


# Its presence in the version directory means the callable runs in the stub (instance_kind="backend").
BACKEND_PAYLOAD = "pytriton_backend.pkl"


def check_owned(path: str, directory: bool) -> None:
    """Raise ``ImportError`` unless ``path`` is a directory (or regular file) of this user that group/other cannot write."""
    info = os.lstat(path)
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    if not kind(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise ImportError(
            f"pytriton refuses to load {path} (owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)}): the "
            f"stub loads only {'directories' if directory else 'regular files'} of its own user (uid "
            f"{os.geteuid()}) that group and other cannot write, so that no other user's code runs here. "
            "Bind the model again into a repository only the serving user can change (docs/security.md)."
        )


def _check_package(directory: str, package_dir: str) -> None:
    """:func:`check_owned` for what :func:`load` runs: the directories down to the package and everything in it."""
    for path in (os.path.dirname(os.path.abspath(directory)), directory, package_dir):
        check_owned(path, directory=True)
    cache = os.path.join(package_dir, "__pycache__")
    folders = [package_dir, cache] if os.path.lexists(cache) else [package_dir]
    for folder in folders:
        for entry in os.listdir(folder):
            path = os.path.join(folder, entry)
            check_owned(path, directory=path == cache)


def load(directory: str) -> Any:
    """The proxy model module (``_stub``) of the stub-side package copied into ``directory``.

    Raises ``ImportError`` if the package is missing or another user could have changed it (:func:`check_owned`).
    """
    if PACKAGE not in sys.modules:
        package_dir = os.path.join(directory, PACKAGE)
        init = os.path.join(package_dir, "__init__.py")
        if os.path.lexists(package_dir):
            _check_package(directory, package_dir)
        spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[package_dir])
        if not os.path.isfile(init) or spec is None or spec.loader is None:
            raise ImportError(f"pytriton's stub package is missing from {package_dir}: bind the model again")
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package  # before running it: its modules import each other through it
        spec.loader.exec_module(package)
    return importlib.import_module(f"{PACKAGE}._stub")


if os.path.basename(__file__) == "model.py":  # the copy Triton loads (pytriton imports this module too)
    _here = os.path.dirname(os.path.abspath(__file__))
    TritonPythonModel = load(_here).TritonPythonModel
    if os.path.isfile(os.path.join(_here, BACKEND_PAYLOAD)):  # the callable runs here (stubside/_inline.py)
        TritonPythonModel = importlib.import_module(f"{PACKAGE}._inline").InlineModel
