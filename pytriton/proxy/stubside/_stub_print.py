"""Stub side of output: what a backend instance's callable prints reaches your process's stdout/stderr.

Part of the stub-side package (``stubside/__init__.py``); like the stub itself it may use only the standard library.

Why. An ``instance_kind="backend"`` callable runs in Triton's stub process, whose stdout and stderr
are the server's output: pytriton reads that pipe for ``Triton.server_log`` and the
``pytriton.server.log`` logger (DEBUG), so a ``print`` there was invisible by default, where the same
callable as a thread or process instance printed to your terminal.

What. When the server was launched by pytriton (it sets :data:`FORWARD_VARIABLE` in the server's
environment, which its stubs inherit), :func:`install` replaces the stub's ``sys.stdout`` and
``sys.stderr`` with :class:`LineForwarder` objects. Each complete line goes to the original stream
as one line starting with :data:`PREFIX`, the stream's name and the instance's label; the
server-output reader in your process (``pytriton/server/process.py``) recognises those lines with
:func:`parse` and writes the text to your own ``sys.stdout``/``sys.stderr``. An embedded server's
stubs write to your process's file descriptors already, and a ``RemoteTriton``'s server is not
ours: neither sets the variable, so nothing is replaced there.

Unit tests: tests/unit/test_stub_print.py.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from typing import Optional, TextIO, Tuple

FORWARD_VARIABLE = "PYTRITON_FORWARD_STUB_OUTPUT"
PREFIX = "@pytriton-output "
# A line longer than this is forwarded in pieces: the reader holds whole lines in memory.
MAX_LINE = 64 * 1024


class LineForwarder(io.TextIOBase):
    """A text stream that writes each complete line to ``target`` as ``PREFIX<stream> <label>|<text>``.

    Incomplete text is held until its newline, :meth:`flush` or :data:`MAX_LINE` characters.
    Thread-safe (a callable may print from several threads). ``target`` stays open and owned by
    its owner; this object never closes it.
    """

    def __init__(self, target: TextIO, stream: str, label: str) -> None:
        super().__init__()
        self._target = target
        self._head = f"{PREFIX}{stream} {label.replace('|', '/')}|"
        self._pending = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        """The original stream's descriptor: faulthandler and the unload deadline write there directly."""
        return self._target.fileno()

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            self._pending += text
            lines = self._pending.split("\n")
            self._pending = lines.pop()
            while len(self._pending) >= MAX_LINE:
                lines.append(self._pending[:MAX_LINE])
                self._pending = self._pending[MAX_LINE:]
            if lines:
                self._emit(lines)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                pending, self._pending = self._pending, ""
                self._emit([pending])
            else:
                self._target.flush()

    def _emit(self, lines: list) -> None:  # type: ignore[type-arg]
        self._target.write("".join(f"{self._head}{line}\n" for line in lines))
        self._target.flush()  # the stub's stdout is a pipe: block-buffered otherwise

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"


def install(label: str) -> bool:
    """Forward this process's ``sys.stdout``/``sys.stderr`` (see the module docstring); whether it did.

    Only where the launching pytriton asked for it through :data:`FORWARD_VARIABLE`; idempotent.
    """
    if os.environ.get(FORWARD_VARIABLE) != "1":
        return False
    for name in ("stdout", "stderr"):
        current = getattr(sys, name)
        if isinstance(current, LineForwarder) or current is None:
            continue
        setattr(sys, name, LineForwarder(current, name, label))
    return True


def parse(line: str) -> Optional[Tuple[str, str, str]]:
    """``(stream, label, text)`` of a forwarded line, or None for any other line of the server's output."""
    if not line.startswith(PREFIX):
        return None
    stream, _, rest = line[len(PREFIX) :].partition(" ")
    label, sep, text = rest.partition("|")
    if stream not in ("stdout", "stderr") or not sep:
        return None
    return stream, label, text
