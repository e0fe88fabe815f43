"""Copies of Python source that come with their bytecode: the stub package a model version loads.

``Triton.bind`` copies pytriton's stub package (``proxy/stubside``) and ``model.py`` into every model
version directory (``_binding.copy_stub_package``). A fresh copy has no ``__pycache__``, so every stub
compiled the whole package before its first request: 0.1-0.2 s of the model's load on the 2-core
machine, for every instance and every kind, against 15-35 ms to load it from bytecode.

:func:`copy_with_bytecode` writes the copy and, in its ``__pycache__``, a hash-checked ``.pyc``
(PEP 552) of it: the stub's import system hashes the copied source, finds it equal to the hash in the
``.pyc`` and loads the bytecode; a source that differs (or a ``.pyc`` of another Python version, or a
damaged one) is compiled from source as before. The bytecode is compiled once per source text and
interpreter version into a cache directory of pytriton's own (``$PYTRITON_HOME/bytecode``, given by
the caller; files 0600, directories 0700), not beside pytriton's sources, so it also works for an
install without bytecode and under ``PYTHONDONTWRITEBYTECODE``. The stub's interpreter is the same
``major.minor`` as this one (the stub is picked for it).

Unit tests: tests/unit/test_bytecode.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import pathlib
import sys
import threading
from typing import Callable, Dict, Optional

_CHECKED_HASH = 0b11  # PEP 552 flags: hash-based, checked against the source when imported
_memo: Dict[str, bytes] = {}  # cache file name -> its bytes, for the models bound after the first
_memo_lock = threading.Lock()


def bytecode(source: bytes, filename: str, cache_dir: pathlib.Path) -> Optional[bytes]:
    """A hash-checked ``.pyc`` of ``source`` for this interpreter, from ``cache_dir`` or compiled (and stored) now.

    None where ``source`` does not compile or the interpreter keeps no bytecode (no cache tag). A cache
    that cannot be written only costs the compile next time.
    """
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    name = hashlib.sha256(importlib.util.MAGIC_NUMBER + source).hexdigest()[:40] + ".pyc"
    with _memo_lock:
        known = _memo.get(name)
    if known is not None:
        return known
    path = cache_dir / tag / name
    source_hash = importlib.util.source_hash(source)
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    if data[:4] != importlib.util.MAGIC_NUMBER or data[8:16] != source_hash:
        try:
            code = compile(source, filename, "exec", dont_inherit=True, optimize=0)
        except (SyntaxError, ValueError):
            return None
        data = importlib.util.MAGIC_NUMBER + _CHECKED_HASH.to_bytes(4, "little") + source_hash + marshal.dumps(code)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _replace(path, data, _write_0600)
        except OSError:
            pass
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
    created with mode 0700, and the bytecode replaces an earlier copy's at once (written aside, then
    renamed), so a stub importing the package meanwhile never reads half a file.
    """
    content = source.read_bytes()
    write(target, content)
    if cache_dir is None:
        return
    data = bytecode(content, target.name, cache_dir)
    if data is None:
        return
    cache = pathlib.Path(importlib.util.cache_from_source(str(target)))
    cache.parent.mkdir(mode=0o700, exist_ok=True)
    os.chmod(cache.parent, 0o700)
    _replace(cache, data, write)


def _replace(path: pathlib.Path, data: bytes, write: Callable[[pathlib.Path, bytes], None]) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        write(partial, data)
        os.replace(partial, path)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise


def _write_0600(path: pathlib.Path, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
