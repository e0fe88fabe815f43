"""Close the Python backend's shared-memory regions to other users the moment they appear.

Triton's Python backend creates one region per model instance in ``/dev/shm`` and sets its mode to
0644 itself (``fchmod`` after ``shm_open``; a umask does not help). A server that
:class:`~pytriton.triton.Triton` starts never gets there: its launch (_platform/launch.py) refuses
that ``fchmod``, so its regions are 0600 from their first byte, and the in-process server
(pytriton/inprocess/_server.py) does the same from a confined start thread: this guard is only a
second line. It is the defence where seccomp or a thread's own umask is refused: :class:`ShmGuard` watches
``/dev/shm`` for names with the backend's prefix being created or having their mode changed, and
sets 0600 as soon as an inotify event reaches its thread.

A process that opened a region while it was still 0644 keeps its descriptor; see docs/security.md
for this residual window.

Unit test: tests/unit/test_security.py (new and reopened entries made private).
"""

from __future__ import annotations

import logging
import os
import select
import struct
import threading
from typing import Optional, Tuple

from pytriton._platform import native
from pytriton.proxy.stubside import _arena, _segments

LOGGER = logging.getLogger(__name__)

_IN_ATTRIB = 0x00000004
_IN_CREATE = 0x00000100
_IN_Q_OVERFLOW = 0x00004000
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)


class ShmGuard:
    """A thread that ``chmod 0600``s ``/dev/shm/<prefix>*`` entries as soon as they are created.

    Lifetime: :meth:`start` opens an inotify descriptor, a pipe and a daemon thread; :meth:`stop`
    ends the thread and closes both. Both are idempotent. Where inotify is unavailable, ``start``
    logs it and returns False (the stub's own ``chmod`` still applies).
    """

    def __init__(self, prefix: str):
        self._prefix = prefix.encode()
        self._inotify: Optional[int] = None
        self._wake: Optional[Tuple[int, int]] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> bool:
        """Start watching; False if inotify is unavailable here."""
        if self._thread is not None:
            return True
        try:
            descriptor = native.inotify_watch(_arena.SHM_DIR, _IN_CREATE | _IN_ATTRIB)
        except OSError as exc:
            LOGGER.info(
                "Cannot watch %s (%s); backend regions are made private by the stubs only.", _arena.SHM_DIR, exc
            )
            return False
        self._inotify = descriptor
        self._wake = os.pipe()
        self._thread = threading.Thread(target=self._run, name="pytriton-shm-guard", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        assert self._inotify is not None and self._wake is not None
        # poll, not select: run() raises the descriptor limit (server/process.py), so these may be >= 1024.
        poller = select.poll()
        poller.register(self._inotify, select.POLLIN)
        poller.register(self._wake[0], select.POLLIN)
        while True:
            ready = [descriptor for descriptor, _ in poller.poll()]
            if self._wake[0] in ready:
                return
            try:
                data = os.read(self._inotify, 64 * 1024)
            except BlockingIOError:
                continue
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & _IN_Q_OVERFLOW:
                    _segments.make_private(self._prefix.decode())  # events were lost: sweep instead
                elif name.startswith(self._prefix):
                    self._make_private(name.decode(errors="replace"))

    @staticmethod
    def _make_private(name: str) -> None:
        path = os.path.join(_arena.SHM_DIR, name)
        try:
            if os.stat(path).st_mode & 0o077:
                os.chmod(path, 0o600)  # our own chmod comes back as IN_ATTRIB, then as a no-op
        except (FileNotFoundError, PermissionError):
            pass

    def stop(self) -> None:
        """Stop the thread and close the descriptors."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        assert self._wake is not None and self._inotify is not None
        os.write(self._wake[1], b"x")
        thread.join(timeout=5.0)
        for descriptor in (*self._wake, self._inotify):
            os.close(descriptor)
        self._wake = None
        self._inotify = None
