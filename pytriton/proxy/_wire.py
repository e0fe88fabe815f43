"""Wire protocol between the proxy model (in Triton's stub) and the user's process.

This module is imported on both sides. Inside the stub only the standard library and numpy 1.x
are available, so it must not import anything else from pytriton.

Transport: one Unix stream socket per model instance, one message each way per batch, strictly
alternating (the stub asks, the user's worker answers). A message is a 4-byte length followed by a
``marshal``-encoded tuple (both ends run the same Python version, so the format matches, and it is
several times faster than JSON). A plain socket is used rather than ZeroMQ because ZeroMQ routes
every message through its I/O threads: on the 2-core reference machine a ZeroMQ ``ipc://`` round
trip took 84 us against 23 us for the socket (see docs/architecture.md).

Each tensor is described by ``(name, dtype, shape, payload)``. Small tensors (up to 64 KiB) carry
their bytes in ``payload`` inside the message: measured inside the stub, that is cheaper than any
shared-memory bookkeeping. Larger tensors are written into a shared-memory *arena* owned by the
sending side, and ``payload`` is ``(offset, nbytes)`` in it.

Arenas are reused for every message, so steady-state traffic creates no segments. An arena grows
by replacing its segment with a bigger one. A segment is unlinked by the *reader* as soon as it
has mapped it, so nothing stays in ``/dev/shm`` even if a process is later killed; the names
(``pytriton-<user pid>-<token>-...``) also let the user's process sweep leftovers of processes
that died in between.
"""

from __future__ import annotations

import contextlib
import marshal
import mmap
import os
import socket
import struct
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

# Message kinds. stub -> user
HELLO = 1  # (HELLO, stub_pid)
INFER = 2  # (INFER, segment, requests) requests: [(inputs, parameters, requested_outputs)]
NEXT = 3  # (NEXT,)  ask for the next chunk of a stream
BYE = 4  # (BYE,)
# user -> stub
OK = 10  # (OK, segment, results) results: [outputs] one per request
ERROR = 11  # (ERROR, message)  the whole batch failed
CHUNK = 12  # (CHUNK, segment, results) one streamed response per request, more follow
END = 13  # (END,)  stream finished
WELCOME = 14  # (WELCOME, slot)

BYTES = "BYTES"
SHM_DIR = "/dev/shm"
_ALIGN = 64
_SMALL = 1 << 16  # tensors up to this size travel inside the message
_LENGTH = struct.Struct("<I")

_FRAME = struct.Struct("<I")


def send_message(sock: socket.socket, message: Any) -> None:
    """Send one length-prefixed marshal frame."""
    payload = marshal.dumps(message)
    sock.sendall(_FRAME.pack(len(payload)) + payload)


def recv_message(sock: socket.socket, spin_s: float = 0.0) -> Any:
    """Receive one frame sent by :func:`send_message`; raise ``EOFError`` if the peer closed.

    With ``spin_s`` > 0 the caller first polls without sleeping for up to that long: a reply that
    arrives within it is picked up without the cost of a process wake-up.
    The protocol never has two messages in flight in one direction, so reading greedily never
    swallows the start of a following message.
    """
    data = b""
    if spin_s > 0.0:
        deadline = time.perf_counter() + spin_s
        while True:
            try:
                data = sock.recv(1 << 16, socket.MSG_DONTWAIT)
                break
            except BlockingIOError:
                if time.perf_counter() > deadline:
                    break
    if not data:
        data = sock.recv(1 << 16)
    if not data:
        raise EOFError("peer closed the connection")
    while len(data) < 4:
        more = sock.recv(1 << 16)
        if not more:
            raise EOFError("peer closed the connection")
        data += more
    (size,) = _FRAME.unpack_from(data)
    if len(data) - 4 < size:
        parts = [data]
        received = len(data) - 4
        while received < size:
            more = sock.recv(min(size - received, 1 << 20))
            if not more:
                raise EOFError("peer closed the connection")
            parts.append(more)
            received += len(more)
        data = b"".join(parts)
    return marshal.loads(memoryview(data)[4:])


TensorMeta = Tuple[str, str, Tuple[int, ...], Any]  # name, dtype, shape, bytes or (offset, nbytes)


def shm_prefix(user_pid: int, token: str) -> str:
    """Common name prefix of every segment belonging to one ``Triton`` instance."""
    return f"pytriton-{user_pid}-{token}"


def _round_up(value: int, step: int) -> int:
    return (value + step - 1) // step * step


class Arena:
    """A growable shared-memory buffer owned (written) by one side.

    Lifetime: the owner creates segments; the reader unlinks each one after mapping it. ``close``
    unmaps and unlinks (ignoring segments the reader already unlinked).
    """

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

    def close(self) -> None:
        """Unmap the current segment and remove its name if the reader has not yet done so."""
        if self.buffer is not None:
            try:
                self.buffer.close()
            except BufferError:
                pass  # an exported view is still alive; the mapping goes when it is collected
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
        return self.buffer

    def close(self) -> None:
        """Drop the current mapping."""
        if self.buffer is not None:
            with contextlib.suppress(BufferError):
                self.buffer.close()
        self.buffer = None
        self.name = None


def serialize_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES layout: each element as a 4-byte little-endian length and its bytes."""
    pack = _LENGTH.pack
    parts: List[bytes] = []
    for item in array.reshape(-1).tolist():
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray)):
            item = str(item).encode("utf-8")
        parts.append(pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def deserialize_bytes(buffer: Any, offset: int, nbytes: int, shape: Tuple[int, ...]) -> np.ndarray:
    """Inverse of :func:`serialize_bytes`: an object array of ``bytes`` with ``shape``."""
    view = memoryview(buffer)[offset : offset + nbytes]
    count = 1
    for dim in shape:
        count *= dim
    items: List[bytes] = []
    position = 0
    unpack = _LENGTH.unpack_from
    for _ in range(count):
        (length,) = unpack(view, position)
        position += 4
        items.append(bytes(view[position : position + length]))
        position += length
    view.release()
    result = np.empty(count, dtype=object)
    result[:] = items
    return result.reshape(shape)


def is_bytes_array(array: np.ndarray) -> bool:
    """True if the array holds strings/bytes (Triton BYTES)."""
    return array.dtype.kind in "SUO"


def write_tensors(arena: Arena, groups: Sequence[Sequence[Tuple[str, np.ndarray]]]) -> List[List[TensorMeta]]:
    """Describe every tensor of every group, group by group, copying large ones into ``arena``.

    Small tensors travel inline (their bytes are the payload). Large numeric tensors are copied
    by numpy straight from their source, even non-contiguous or Fortran-ordered, into the arena,
    with no intermediate copy. BYTES tensors are serialised first (Triton's length-prefixed layout).
    """
    metas: List[List[TensorMeta]] = []
    pending: List[Tuple[int, Any]] = []  # (offset, source) for the arena
    total = 0
    for group in groups:
        group_meta: List[TensorMeta] = []
        for name, array in group:
            if array.dtype.kind in "SUO":
                data: Any = serialize_bytes(array)
                dtype = BYTES
                nbytes = len(data)
            else:
                data = array
                dtype = array.dtype.str
                nbytes = array.nbytes
            if nbytes <= _SMALL:
                group_meta.append((name, dtype, array.shape, data if dtype == BYTES else array.tobytes()))
                continue
            group_meta.append((name, dtype, array.shape, (total, nbytes)))
            pending.append((total, data))
            total = (total + nbytes + _ALIGN - 1) & ~(_ALIGN - 1)
        metas.append(group_meta)
    if pending:
        buffer = arena.reserve(total)
        for offset, data in pending:
            if isinstance(data, bytes):
                buffer[offset : offset + len(data)] = data
            else:
                np.copyto(np.ndarray(data.shape, dtype=data.dtype, buffer=buffer, offset=offset), data, casting="no")
    return metas


def uses_arena(metas: Sequence[Sequence[TensorMeta]]) -> bool:
    """True if any tensor of the message lives in the sender's arena."""
    return any(type(meta[3]) is not bytes for group in metas for meta in group)


_DTYPES: Dict[str, np.dtype] = {}


def _dtype(code: str) -> np.dtype:
    dtype = _DTYPES.get(code)
    if dtype is None:
        dtype = _DTYPES[code] = np.dtype(code)
    return dtype


def read_tensor(buffer: Any, meta: TensorMeta, copy: bool) -> np.ndarray:
    """The array ``meta`` describes; ``buffer`` is the sender's arena (needed for large tensors).

    ``copy=True`` returns memory the caller owns and may keep; ``copy=False`` may return a
    read-only view of the message or of the arena, valid until the next message.
    """
    _, code, shape, payload = meta
    if type(payload) is bytes:
        if code == BYTES:
            return deserialize_bytes(payload, 0, len(payload), shape)
        array = np.frombuffer(payload, dtype=_dtype(code)).reshape(shape)
        return array.copy() if copy else array
    offset, nbytes = payload
    if code == BYTES:
        return deserialize_bytes(buffer, offset, nbytes, shape)
    array = np.ndarray(shape, dtype=_dtype(code), buffer=buffer, offset=offset)
    return array.copy() if copy else array


def read_tensors(buffer: Any, metas: Sequence[TensorMeta], copy: bool) -> Dict[str, np.ndarray]:
    """All tensors of one group, keyed by name."""
    return {meta[0]: read_tensor(buffer, meta, copy) for meta in metas}


def sweep_segments(prefix: str) -> List[str]:
    """Remove every ``/dev/shm`` entry whose name starts with ``prefix``; return the names removed."""
    removed: List[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except (FileNotFoundError, PermissionError):
                pass
    return removed


def sweep_dead_owners() -> List[str]:
    """Remove pytriton segments whose owning user process no longer exists."""
    removed: List[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for name in names:
        parts = name.split("-")
        if len(parts) < 3 or parts[0] != "pytriton" or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except (FileNotFoundError, PermissionError):
                pass
        except PermissionError:
            continue
    return removed
