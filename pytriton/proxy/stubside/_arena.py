"""Shared-memory arenas: growable segments written by one side and mapped by the other.

Part of the wire protocol (``_wire`` describes the messages; ``_tensors`` what goes in an arena).
An arena is reused for every message, so steady-state traffic creates no segments; it grows by
replacing its segment with a bigger one. The reader unlinks a segment's name as soon as it has
mapped it, so nothing stays in ``/dev/shm`` even if a process is later killed. After a pause in
traffic the pages past the first MiB are given back to the system (:class:`IdleReleaser`).

Imported on both sides (the stub and the user's process): standard library and numpy only.
Unit tests: tests/unit/test_wire.py.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from typing import Callable, Optional, Protocol, Sequence

import numpy as np
import numpy.typing as npt

SHM_DIR = "/dev/shm"
INLINE_LIMIT = 1 << 16  # tensors up to this size travel inside the message (_tensors.write_tensors)


def _round_up(value: int, step: int) -> int:
    return (value + step - 1) // step * step


# Arena memory above this many bytes (the initial arena size) is given back to the system once its
# owner has been idle for ``RELEASE_IDLE_S`` (see ``IdleReleaser``). Only after idleness: re-touching
# released memory costs about 8x a plain copy (256 MiB: 180 ms first touch against 22 ms, measured
# here), which traffic that keeps coming should not pay on every request.
RELEASE_KEEP = 1 << 20
RELEASE_IDLE_S = 2.0


class Closable(Protocol):
    def close(self) -> None: ...


class Releasable(Protocol):
    """Memory that can be given back past ``keep`` bytes (an :class:`Arena`, an :class:`ArenaReader`)."""

    def release(self, keep: int) -> int: ...


def close_quietly(resource: Optional[Closable], *ignored: type) -> None:
    """``resource.close()`` unless ``resource`` is None, ignoring the exception types ``ignored``.

    A mapping with a numpy view still alive raises ``BufferError``: it is then unmapped when the
    last view goes.
    """
    if resource is not None:
        with contextlib.suppress(*ignored):
            resource.close()


def _release_pages(buffer: Optional[mmap.mmap], keep: int) -> int:
    """Free the pages of a shared mapping past ``keep`` bytes; the mapping stays valid.

    ``MADV_REMOVE`` punches a hole in the tmpfs file behind the mapping, so the memory goes back to
    the system for every process that maps it; later reads see zeros and writes fault pages in
    again. Returns how many bytes were released (0 if nothing was past ``keep``).
    """
    if buffer is None or buffer.closed:
        return 0
    start = _round_up(keep, mmap.PAGESIZE)
    length = len(buffer) - start
    if length <= 0:
        return 0
    buffer.madvise(mmap.MADV_REMOVE, start, length)
    return length


class Arena(Protocol):
    """Where a sender puts the tensors too large for the message (``_tensors.write_tensors``).

    Implemented by :class:`SharedArena` (shared memory the receiver maps by ``name``) and by
    ``_zmq_channel.InlineArena`` (the TCP transport: nothing is shared, every tensor is inline).
    ``reserve`` returns a buffer of at least ``nbytes`` under the current ``name``, and is only
    asked for tensors larger than ``inline_limit``; ``buffer`` is the current buffer (None before
    the first ``reserve`` and after ``close``); ``release`` gives back memory past ``keep`` bytes
    and returns how many bytes it gave back.
    """

    @property
    def name(self) -> Optional[str]: ...

    @property
    def buffer(self) -> Optional[mmap.mmap]: ...

    @property
    def inline_limit(self) -> int: ...

    def reserve(self, nbytes: int) -> mmap.mmap: ...

    def release(self, keep: int) -> int: ...

    def close(self) -> None: ...


class SharedArena:
    """An :class:`Arena` in shared memory: a growable buffer owned (written) by one side.

    Lifetime: the owner creates segments; the reader unlinks each one after mapping it. ``close``
    unmaps and unlinks (ignoring segments the reader already unlinked).
    """

    inline_limit = INLINE_LIMIT  # tensors up to this size travel in the message (write_tensors)

    def __init__(self, prefix: str, initial_size: int = 1 << 20):
        self._prefix = prefix
        self._counter = 0
        self._initial = initial_size
        self.name: Optional[str] = None
        self.buffer: Optional[mmap.mmap] = None
        self.size = 0

    def reserve(self, nbytes: int) -> mmap.mmap:
        """Return a buffer of at least ``nbytes``; may switch to a new, larger segment."""
        if self.buffer is None or nbytes > self.size:
            self._grow(max(nbytes, self.size * 2, self._initial))
        assert self.buffer is not None
        return self.buffer

    def _grow(self, size: int) -> None:
        self.close()
        size = _round_up(size, mmap.PAGESIZE)
        self._counter += 1
        name = f"{self._prefix}-{os.getpid()}-{self._counter}"
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            self.buffer = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        self.name = name
        self.size = size

    def release(self, keep: int) -> int:
        """Give back the memory past ``keep`` bytes (the segment stays usable); see ``_release_pages``."""
        return _release_pages(self.buffer, keep)

    def close(self) -> None:
        """Unmap the current segment and remove its name if the reader has not yet done so."""
        close_quietly(self.buffer, BufferError)
        self.buffer = None
        if self.name is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, self.name))
            self.name = None


class ArenaReader:
    """Maps the peer's current arena segment by name (and unlinks the name once mapped)."""

    def __init__(self) -> None:
        self.name: Optional[str] = None
        self.buffer: Optional[mmap.mmap] = None
        self.address = 0  # where the mapping starts in this process (to recognise views into it)
        self.size = 0

    def attach(self, name: str) -> mmap.mmap:
        """The buffer of segment ``name``, mapping it on first use."""
        if name != self.name or self.buffer is None:
            self.close()
            path = os.path.join(SHM_DIR, name)
            fd = os.open(path, os.O_RDWR)
            try:
                self.buffer = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            self.name = name
            self.size = len(self.buffer)
            probe = np.frombuffer(self.buffer, dtype=np.uint8, count=1)
            self.address = probe.__array_interface__["data"][0]
            del probe  # release the buffer export so the mapping can be closed later
        return self.buffer

    def close(self) -> None:
        """Drop the current mapping."""
        close_quietly(self.buffer, BufferError)
        self.buffer = None
        self.name = None
        self.address = self.size = 0

    def release(self, keep: int) -> int:
        """Give back the memory of the peer's segment past ``keep`` bytes (call only while the peer
        is not writing it, i.e. between messages); see ``_release_pages``."""
        return _release_pages(self.buffer, keep)

    def offset_of(self, array: npt.NDArray[np.generic]) -> Optional[int]:
        """Offset of ``array``'s memory in the peer's arena if it lies there (contiguously), else None."""
        if self.buffer is None or not array.flags.c_contiguous:
            return None
        start = array.__array_interface__["data"][0] - self.address
        return start if start >= 0 and start + array.nbytes <= self.size else None


class IdleReleaser:
    """Gives arena memory back to the system once its owner has been idle for a while.

    A large request grows an arena (and the peer's) to its size; without this the memory stays
    resident for the life of the process. A daemon thread checks every ``idle_s / 2`` whether the
    owner has been idle (no :meth:`enter` without its :meth:`leave`) for ``idle_s`` and, if so,
    calls ``release(keep)`` once on every arena ``arenas()`` returns; traffic that keeps coming
    keeps its arenas hot and pays nothing. :meth:`enter` waits while a release runs (a few ms per
    hundred MiB), so memory is never released under a message in flight. The owner calls
    :meth:`enter` and :meth:`leave` from one thread (the stub's execute thread).

    Lifetime: the thread starts with the object and ends at :meth:`close` (or with the process).
    """

    def __init__(
        self,
        arenas: Callable[[], Sequence[Releasable]],
        idle_s: float = RELEASE_IDLE_S,
        keep: int = RELEASE_KEEP,
        name: str = "pytriton-arena-release",
    ):
        self._arenas = arenas
        self._idle_s = idle_s
        self._keep = keep
        self._lock = threading.Lock()
        self._active = 0
        self._last = time.monotonic()
        self._pending = False  # something was used since the last release
        self._closed = threading.Event()
        self.released = 0  # bytes given back so far (for tests and diagnostics)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def enter(self) -> None:
        """The owner starts using its arenas (a message is being written or read)."""
        with self._lock:
            self._active += 1
            self._pending = True

    def leave(self) -> None:
        """The owner is done with the message; the idle clock starts.

        No lock: only the owner's thread writes these two fields, and the clock is set before the
        count falls, so the releasing thread (which reads both under the lock) sees either the batch
        still active or a fresh clock; either way it releases nothing.
        """
        self._last = time.monotonic()
        self._active -= 1

    def _run(self) -> None:
        while not self._closed.wait(self._idle_s / 2):
            with self._lock:
                if self._active or not self._pending or time.monotonic() - self._last < self._idle_s:
                    continue
                self._pending = False
                for arena in self._arenas():
                    try:
                        self.released += arena.release(self._keep)
                    except (OSError, ValueError):  # MADV_REMOVE unsupported here: keep the memory
                        pass

    def close(self) -> None:
        """Stop the thread (waits for a release in progress)."""
        self._closed.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
