"""Copies of Python source that come with their bytecode: the stub package a model version loads.

``Triton.bind`` copies pytriton's stub package (``proxy/stubside``) and ``model.py`` into every model
version directory (``_binding.copy_stub_package``). A fresh copy has no ``__pycache__``, so every stub
compiled the whole package before its first request: 0.1-0.2 s of the model's load on the 2-core
machine, for every instance and every kind, against 15-35 ms to load it from bytecode.

:func:`copy_with_bytecode` writes the copy and, in its ``__pycache__``, a hash-checked ``.pyc``
(PEP 552) of it: the stub's import system hashes the copied source, finds it equal to the hash in the
``.pyc`` and loads the bytecode; a source that differs (or a ``.pyc`` of another Python version, or a
damaged one) is compiled from source as before. The ``.pyc`` is the standard library's
(``py_compile`` with ``PycInvalidationMode.CHECKED_HASH``), compiled once per source text and
interpreter version into a cache directory of pytriton's own (``$PYTRITON_HOME/bytecode``, given by
the caller; directories 0700), not beside pytriton's sources, so it also works for an install without
bytecode and under ``PYTHONDONTWRITEBYTECODE``. Where that cache cannot be written the copy goes
without bytecode (its stub compiles it, as before). The stub's interpreter is the same
``major.minor`` as this one (the stub is picked for it).

Unit tests: tests/unit/test_bytecode.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pathlib
import py_compile
import sys
import threading
from typing import Callable, Dict, Optional

_memo: Dict[str, bytes] = {}  # cache file name -> its bytes, for the models bound after the first
_memo_lock = threading.Lock()


def bytecode(source: pathlib.Path, cache_dir: pathlib.Path) -> Optional[bytes]:
    """A hash-checked ``.pyc`` of the file ``source`` for this interpreter, from ``cache_dir`` or compiled there now.

    None where ``source`` does not compile, the interpreter keeps no bytecode (no cache tag) or
    ``cache_dir`` cannot be written.
    """
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    content = source.read_bytes()
    name = hashlib.sha256(importlib.util.MAGIC_NUMBER + content).hexdigest()[:40] + ".pyc"
    with _memo_lock:
        known = _memo.get(name)
    if known is not None:
        return known
    path = cache_dir / tag / name
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    if data[:4] != importlib.util.MAGIC_NUMBER or data[8:16] != importlib.util.source_hash(content):
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Written aside and renamed by py_compile; the source is pytriton's own file, whose text is `content`.
            py_compile.compile(
                str(source),
                cfile=str(path),
                dfile=source.name,
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )
            data = path.read_bytes()
        except (OSError, py_compile.PyCompileError):
            return None
        if data[8:16] != importlib.util.source_hash(content):  # the source changed meanwhile (an upgrade)
            return None
    with _memo_lock:
        _memo[name] = data
    return data


def copy_with_bytecode(
    source: pathlib.Path,
    target: pathlib.Path,
    write: Callable[[pathlib.Path, bytes], None],
    cache_dir: Optional[pathlib.Path],
) -> None:
    """Copy ``source`` to ``target`` with ``write``, and its bytecode (:func:`bytecode`) into ``target``'s ``__pycache__``.

    ``cache_dir`` None: the source alone. ``target``'s directory must exist; its ``__pycache__`` is
    created with mode 0700, and the bytecode replaces an earlier copy's at once (written aside with
    ``write``, then renamed), so a stub importing the package meanwhile never reads half a file.
    """
    content = source.read_bytes()
    write(target, content)
    data = bytecode(source, cache_dir) if cache_dir is not None else None
    if data is None or data[8:16] != importlib.util.source_hash(content):
        return
    cache = pathlib.Path(importlib.util.cache_from_source(str(target)))
    cache.parent.mkdir(mode=0o700, exist_ok=True)
    os.chmod(cache.parent, 0o700)
    partial = cache.with_name(f"{cache.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        write(partial, data)
        os.replace(partial, cache)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise
