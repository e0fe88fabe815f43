"""Every low-level mechanism lives in the platform layer (``pytriton/_platform/``), or on the list below.

The mechanisms (issue 43): ``ctypes`` (C calls, machine structures), ``ptrace``/``prctl`` calls and ``PR_SET_*``
constants, reads of ``/proc`` paths, and imports of a third party's private modules or names (``from uvicorn.x
import _Y``, ``import numpy._core``). The source of ``pytriton/`` is read with ``ast`` (nothing is imported):
a string counts when it *starts* with ``/proc`` (a path, also as the first part of an f-string), so a message
that mentions ``/proc/<pid>/cmdline`` does not; comments and docstrings never count.

Outside ``_platform/``, a module may use a mechanism only if it is listed in :data:`ALLOWED` with the reason.
Two kinds of entry:

- for good: the in-process API's own binding of Triton's C API (``inprocess/``: ``ctypes`` is how a C library
  is called), and ``proxy/stubside/``, which runs inside Triton's stub process and may import only the
  standard library, numpy and itself (so it cannot use ``_platform``);
and nothing else: the private launch, the watchdog, the in-process server's confined start thread and the
OpenAI frontend's uvicorn protocol all live in ``_platform/``. A new file, or a new mechanism in a listed file,
fails this test; an entry whose mechanism is gone fails too (the list only shrinks).
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, FrozenSet, Iterator, List, Set, Tuple

ROOT = pathlib.Path(__file__).parents[2]
PACKAGE = ROOT / "pytriton"
PLATFORM = "pytriton/_platform/"

CTYPES, PTRACE, PRCTL, PROC, PRIVATE = "ctypes", "ptrace", "prctl", "/proc", "third-party private"

# path (relative to the repository) -> (mechanisms it may use, why)
ALLOWED: Dict[str, Tuple[FrozenSet[str], str]] = {
    # -- for good: the in-process API binds Triton's C API (libtritonserver.so) with ctypes.
    "pytriton/inprocess/_lib.py": (frozenset({CTYPES}), "binds Triton's C API (the in-process server)"),
    "pytriton/inprocess/_server.py": (frozenset({CTYPES}), "calls Triton's C API through _lib"),
    "pytriton/inprocess/_request.py": (frozenset({CTYPES}), "calls Triton's C API through _lib"),
    "pytriton/inprocess/_tensor.py": (frozenset({CTYPES}), "hands numpy buffers to Triton's C API"),
    "pytriton/inprocess/_options.py": (frozenset({CTYPES}), "asks NVML for GPUs, as Triton's C API needs"),
    # -- for good: runs inside Triton's stub process (stdlib, numpy and itself only; no pytriton._platform).
    "pytriton/proxy/stubside/_stub.py": (frozenset({PROC}), "the stub reads its own /proc/self/cmdline"),
    "pytriton/proxy/stubside/_stub_bytes.py": (
        frozenset({CTYPES, PRIVATE}),
        "the stub's numpy-2 shims (C structs, numpy._core); version-gated by issue 43 item 3",
    ),
    "pytriton/proxy/stubside/_stub_dlpack.py": (frozenset({CTYPES}), "the stub's DLPack exchange (C structs)"),
}


def _docstrings(tree: ast.AST) -> Set[int]:
    """ids of the constant nodes that are docstrings (of the module, a class or a function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


# Third-party modules whose names look public but that their projects do not document as an API.
INTERNAL = ("uvicorn.protocols",)


def _third_party(module: str) -> bool:
    top = module.split(".")[0]
    return top not in ("pytriton", "__future__", "_pytriton_stubside") and top not in _STDLIB


def _private(module: str) -> bool:
    """A third party's private (``_name``) or undocumented module."""
    parts = module.split(".")
    return _third_party(module) and (
        any(part.startswith("_") for part in parts[1:]) or any(module.startswith(name) for name in INTERNAL)
    )


try:
    import sys

    _STDLIB = frozenset(sys.stdlib_module_names)  # Python 3.10+
except AttributeError:  # pragma: no cover - 3.9: the stdlib's own modules, read from its directory
    import pkgutil
    import sysconfig

    _STDLIB = frozenset(sys.builtin_module_names) | frozenset(
        module.name for module in pkgutil.iter_modules([sysconfig.get_paths()["stdlib"]])
    )


def _by_name(node: ast.Call) -> str | None:
    """The module an ``importlib.import_module("...")`` or ``__import__("...")`` call names, if a constant."""
    function = node.func
    named = (isinstance(function, ast.Attribute) and function.attr == "import_module") or (
        isinstance(function, ast.Name) and function.id in ("import_module", "__import__")
    )
    if named and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def mechanisms(source: str, filename: str = "<source>") -> Iterator[Tuple[str, int]]:
    """``(mechanism, line)`` for each use of a low-level mechanism in ``source``, once per line."""
    seen: Set[Tuple[str, int]] = set()
    for use in _mechanisms(source, filename):
        if use not in seen:
            seen.add(use)
            yield use


def _mechanisms(source: str, filename: str) -> Iterator[Tuple[str, int]]:
    tree = ast.parse(source, filename)
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ctypes":
                    yield CTYPES, node.lineno
                elif _private(alias.name):
                    yield PRIVATE, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "ctypes":
                yield CTYPES, node.lineno
            elif _private(node.module) or (
                _third_party(node.module) and any(alias.name.startswith("_") for alias in node.names)
            ):
                yield PRIVATE, node.lineno
        elif isinstance(node, ast.Call) and _by_name(node) is not None and _private(_by_name(node) or ""):
            yield PRIVATE, node.lineno
        elif isinstance(node, ast.Attribute) and node.attr in (PTRACE, PRCTL):
            yield node.attr, node.lineno
        elif isinstance(node, ast.Name) and (node.id in (PTRACE, PRCTL) or "PR_SET_" in node.id):
            yield (PTRACE if "ptrace" in node.id.lower() else PRCTL), node.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value.startswith("/proc"):
                yield PROC, node.lineno
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and isinstance(head.value, str) and head.value.startswith("/proc"):
                yield PROC, node.lineno


def _uses() -> Dict[str, Dict[str, List[int]]]:
    """path -> mechanism -> lines, for every module of pytriton/ outside _platform/."""
    found: Dict[str, Dict[str, List[int]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(PLATFORM):
            continue
        for mechanism, line in mechanisms(path.read_text(), str(path)):
            found.setdefault(relative, {}).setdefault(mechanism, []).append(line)
    return found


def test_low_level_mechanisms_stay_in_the_platform_layer() -> None:
    outside = [
        f"{path}:{lines[0]}: {mechanism}"
        for path, uses in _uses().items()
        for mechanism, lines in sorted(uses.items())
        if mechanism not in ALLOWED.get(path, (frozenset(), ""))[0]
    ]
    assert not outside, (
        "low-level mechanisms outside pytriton/_platform/ (use the layer's seams, e.g. _platform.proc for /proc, "
        "_platform.native for prctl; see the module docstring):\n" + "\n".join(outside)
    )


def test_every_allowed_exception_is_still_needed() -> None:
    """An entry whose mechanism has moved into the layer leaves the list, so it cannot come back unnoticed."""
    uses = _uses()
    stale = [
        f"{path}: {mechanism}"
        for path, (allowed, _) in ALLOWED.items()
        for mechanism in sorted(allowed)
        if mechanism not in uses.get(path, {})
    ]
    assert not stale, "ALLOWED entries no longer needed (remove them):\n" + "\n".join(stale)


def test_the_scanner_sees_each_mechanism_and_ignores_prose() -> None:
    source = '''
"""A docstring that says /proc/self/status and ctypes."""
import ctypes
from ctypes import CDLL
from uvicorn.protocols.http.h11_impl import _Private
import numpy._core
PR_SET_PDEATHSIG = 1
libc.prctl(1)
libc.ptrace(0)
open(f"/proc/{pid}/stat")
open("/proc/self/maps")
message = "readable in /proc/<pid>/cmdline"  # prose: not a path
import _thread
from os import path
from uvicorn.protocols.http.h11_impl import H11Protocol
api = importlib.import_module("numpy._core._multiarray_umath")
importlib.import_module("numpy")
'''
    found = sorted(set(mechanisms(source)))
    assert found == [
        (PROC, 10),
        (PROC, 11),
        (CTYPES, 3),
        (CTYPES, 4),
        (PRCTL, 7),
        (PRCTL, 8),
        (PTRACE, 9),
        (PRIVATE, 5),
        (PRIVATE, 6),
        (PRIVATE, 15),
        (PRIVATE, 16),
    ]


def _count(revision: str) -> str:
    """Uses outside the layer at a git revision: the figure docs/architecture.md gives before and after."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    uses: Dict[str, int] = {}
    for path in git("ls-tree", "-r", "--name-only", revision, "pytriton").split():
        if path.endswith(".py") and not path.startswith(PLATFORM):
            found = len(list(mechanisms(git("show", f"{revision}:{path}"), path)))
            if found:
                uses[path] = found
    return f"{revision}: {sum(uses.values())} uses in {len(uses)} modules outside pytriton/_platform/"


if __name__ == "__main__":  # python -m tests.unit.test_platform_boundary REVISION...
    import sys

    for revision in sys.argv[1:]:
        print(_count(revision))
