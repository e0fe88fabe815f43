"""The status page of a backend model (``instance_kind="backend"``): shared by the user's process and the stubs.

A backend instance runs its batches inside the stub, so the user's process cannot see them on its
worker's connection. Instead each model has one small file in its private endpoint directory,
mapped by both sides:

- per slot, written by the slot's stub: ``busy`` at each batch start and end, ``last_active`` at
  its end (``time.monotonic()``, a system-wide clock on Linux, so the two processes agree): ``stop()``,
  ``unbind()`` and the recycling read them as they read a thread worker's state;
- model-wide, written by the user's process when ``stop()`` drains: the ``draining`` flag and the
  admission budget (how many requests Triton had queued), which each stub takes from under an
  exclusive ``flock`` of the file before it runs a batch; once spent, batches are answered
  UNAVAILABLE as the other kinds' workers answer them;
- model-wide, written by a stub whose callable raised ``PyTritonUnrecoverableError``: the error's
  text (at most 1 KiB), which the user's process polls (``BackendInstance``) to stop the server as
  it does for the other kinds.

A batch costs three writes into the mapping and one read of the flag, each a single item of a
``memoryview`` over the mapping (no ``struct`` call: the stub's request path is short, see
``_inline.py``); the lock is taken only while draining. Numbers are in the machine's own byte order
(both sides run on the same host). The file is created 0600 by the user's process (``create``) before Triton loads the model
and removed with the endpoint directory.

Runs in the stub too: standard library only. Unit tests: tests/unit/test_backend_kind.py.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import time
from typing import Optional, Tuple

PAGE_NAME = "backend.page"
_HEADER = struct.Struct("=qqq")  # draining (0/1), budget left, length of the unrecoverable error's text
_MESSAGE = 1024  # bytes for that text, after the header
_SLOT = struct.Struct("=qd")  # busy (0/1), last_active
_SLOTS_AT = _HEADER.size + _MESSAGE
# The same fields as 8-byte items of the mapping: the draining flag is item 0, slot n's busy flag
# item _FIRST_SLOT + 2n and its last_active the item after it.
_FIRST_SLOT = _SLOTS_AT // 8
assert _SLOTS_AT % 8 == 0 and _SLOT.size == 16  # every field on its own 8-byte item


class Page:
    """One model's page (see the module docstring). Lifetime: :meth:`close` unmaps it and closes the file."""

    def __init__(self, fd: int, slots: int):
        self._fd = fd
        self.slots = slots
        self._map = mmap.mmap(fd, _SLOTS_AT + _SLOT.size * slots)
        # Views for the per-batch fields; released in close() (an mmap with views cannot be closed).
        self._ints = memoryview(self._map).cast("q")
        self._floats = memoryview(self._map).cast("d")

    @classmethod
    def create(cls, path: str, slots: int) -> Page:
        """Create (or reset) the page at ``path`` for ``slots`` instances, mode 0600."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, _SLOTS_AT + _SLOT.size * slots)
        return cls(fd, slots)

    @classmethod
    def open(cls, path: str, slots: int) -> Optional[Page]:
        """The page a stub maps, or None if there is none (a model bound by an older pytriton)."""
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            return None
        if os.fstat(fd).st_size < _SLOTS_AT + _SLOT.size * slots:
            os.close(fd)
            return None
        return cls(fd, slots)

    # -- the stub -------------------------------------------------------------------------------
    def enter(self, slot: int) -> None:
        """A batch starts on ``slot``."""
        self._ints[_FIRST_SLOT + 2 * slot] = 1

    def leave(self, slot: int) -> None:
        """The batch of ``slot`` is answered."""
        item = _FIRST_SLOT + 2 * slot
        self._floats[item + 1] = time.monotonic()
        self._ints[item] = 0

    def views(self, slot: int) -> Tuple[memoryview[int], memoryview[float], int]:
        """``(ints, floats, item)``: what :meth:`draining`, :meth:`enter` and :meth:`leave` write, for
        the backend kind's short path, which writes it inline. Why: a request spends a few hundred
        microseconds in the whole server and the stub's Python runs cold, so each method call per
        batch shows (docs/performance.md, "Backend instances"). ``ints[0]``: draining;
        ``ints[item]``: the slot's busy flag; ``floats[item + 1]``: its ``last_active``. Valid until
        :meth:`close`."""
        return self._ints, self._floats, _FIRST_SLOT + 2 * slot

    def draining(self) -> bool:
        return self._ints[0] != 0

    def admit(self, requests: int) -> bool:
        """While draining: take ``requests`` from the budget; False once it is spent (a batch that
        straddles the end runs whole, as ``pytriton.proxy._admission.Admission`` decides)."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            draining, budget, length = _HEADER.unpack_from(self._map, 0)
            if budget <= 0:
                return False
            _HEADER.pack_into(self._map, 0, draining, budget - requests, length)
            return True
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def report_unrecoverable(self, text: str) -> None:
        """The callable raised ``PyTritonUnrecoverableError`` with ``text``: the user's process stops the server."""
        data = text.encode("utf-8", "replace")[:_MESSAGE] or b"PyTritonUnrecoverableError"
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            draining, budget, _ = _HEADER.unpack_from(self._map, 0)
            self._map[_HEADER.size : _HEADER.size + len(data)] = data
            _HEADER.pack_into(self._map, 0, draining, budget, len(data))
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    # -- the user's process ---------------------------------------------------------------------
    def unrecoverable(self) -> Optional[str]:
        """The text a stub reported with :meth:`report_unrecoverable`, or None."""
        length = _HEADER.unpack_from(self._map, 0)[2]
        if not length:
            return None
        return bytes(self._map[_HEADER.size : _HEADER.size + length]).decode("utf-8", "replace")

    def busy(self, slot: int) -> bool:
        return self._ints[_FIRST_SLOT + 2 * slot] != 0

    def last_active(self, slot: int) -> float:
        """``time.monotonic()`` when ``slot`` last finished a batch (0.0: never); while it runs one, :meth:`busy`."""
        return float(self._floats[_FIRST_SLOT + 2 * slot + 1])

    def refuse(self, budget: int) -> None:
        """Start draining with ``budget`` more requests admitted; later calls change nothing."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            draining, _, length = _HEADER.unpack_from(self._map, 0)
            if not draining:
                _HEADER.pack_into(self._map, 0, 1, budget, length)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self._ints.release()
        self._floats.release()
        self._map.close()
        os.close(self._fd)
