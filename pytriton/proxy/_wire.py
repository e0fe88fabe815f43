"""Wire protocol between the proxy model (in Triton's stub) and the user's process.

This module is imported on both sides. Inside the stub only the standard library and numpy (1.x,
or 2 on Python 3.13) are available, so it must not import anything else from pytriton. The
encoding does not depend on either version: numeric tensors travel as raw bytes with their dtype
string, string tensors in Triton's serialized layout (:func:`serialize_bytes`).

Transport: one Unix stream socket per model instance, one message each way per batch (the stub
asks, the user's worker answers; a streamed batch gets one reply per yielded result, see
``STREAM_WINDOW``). A message is a 4-byte length followed by a
``marshal``-encoded tuple (both ends run the same Python version, so the format matches, and it is
several times faster than JSON). A plain socket is used rather than ZeroMQ because ZeroMQ routes
every message through its I/O threads: on the 2-core reference machine a ZeroMQ ``ipc://`` round
trip took 88 us against 24 us for the socket, and 188 us against 58 us after 600 us of idleness
(``python -m bench.transport_pingpong``, docs/architecture.md).

Each tensor is described by ``(name, dtype, shape, payload)``. Small tensors (up to 64 KiB) carry
their bytes in ``payload`` inside the message: measured inside the stub, that is cheaper than any
shared-memory bookkeeping. Larger tensors are written into a shared-memory *arena* owned by the
sending side, and ``payload`` is ``(offset, nbytes)`` in it.

Arenas are reused for every message, so steady-state traffic creates no segments. An arena grows
by replacing its segment with a bigger one; after a pause in traffic its pages past the first MiB
are given back to the system (``IdleReleaser``), so one large request does not pin its memory. A segment is unlinked by the *reader* as soon as it
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
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

# -- messages ---------------------------------------------------------------------------------
# Every message is a tuple whose first field is its kind. Build them with the functions below and
# read them through the field constants and parsers: both ends then agree on one definition.
# stub -> user
HELLO = 1  # (HELLO, stub_pid, generation)
INFER = (
    2  # (INFER, segment, entries[, trace])  entries: [(inputs, parameters, requested_outputs[, sequence, timeout_s])]
)
NEXT = 3  # (NEXT,)  acknowledges streamed chunks: send more
BYE = 4  # (BYE,)  the instance is going away
CANCEL = 5  # (CANCEL,)  instead of NEXT: nobody wants the rest of this stream; close the generator
CANCELLED = 6  # (CANCELLED, [bool per request])  the answer to ASK
# user -> stub
OK = 10  # (OK, segment, results, retire[, duration_s])  results: [outputs] one per request
ERROR = 11  # (ERROR, text, retire[, duration_s])  the whole batch failed
CHUNK = 12  # (CHUNK, segment, results)  one streamed response per request, more follow
END = 13  # (END, retire[, duration_s])  the stream finished
WELCOME = 14  # (WELCOME, slot)
# (ASK,)  sent while a batch runs, before its final reply: which requests of the batch did Triton
# cancel? The stub answers CANCELLED and keeps waiting for the reply (Request.is_cancelled()).
ASK = 15

KIND = 0
STUB_PID = 1  # HELLO: the stub's process id
GENERATION = 2  # HELLO: the stub's generation (see proxy/_stub.py)
SLOT = 1  # WELCOME: the worker's name for the slot
SEGMENT = 1  # INFER, OK, CHUNK: the sender's arena segment to map, or None if every tensor is inline
BODY = 2  # INFER: the entries; OK, CHUNK: the results
# INFER, optional trailing field, present only while Triton traces a request of the batch (OpenTelemetry
# mode): (stub_started_ns, [Triton's trace context (a JSON string with "traceparent") or None per request]).
TRACE = 3
TEXT = 1  # ERROR: the error text for every request of the batch
FINAL_KINDS = (OK, ERROR, END)
# OK, ERROR, END (the final reply of a batch): where the mandatory retire flag is (``retires``); an
# optional trailing field after it says how long the callable ran (``callable_duration``).
RETIRE_AT = {OK: 3, ERROR: 2, END: 1}

ASK_MESSAGE = (ASK,)
NEXT_MESSAGE = (NEXT,)
CANCEL_MESSAGE = (CANCEL,)
BYE_MESSAGE = (BYE,)


# The receiving side reads a message through its parser: one NamedTuple per message, its fields
# named (the kind, already dispatched on, is left out). NEXT, CANCEL and BYE carry no fields.
class Hello(NamedTuple):
    stub_pid: int
    generation: int


class Welcome(NamedTuple):
    slot: Any


class Infer(NamedTuple):
    segment: Optional[str]
    entries: List[Any]  # [(inputs, parameters, requested_outputs)] per request


class Ok(NamedTuple):
    segment: Optional[str]
    results: List[Any]  # [outputs] one per request
    retire: bool


class Error(NamedTuple):
    text: str
    retire: bool


class Chunk(NamedTuple):
    segment: Optional[str]
    results: List[Any]


class End(NamedTuple):
    retire: bool


def hello(stub_pid: int, generation: int) -> Tuple[int, int, int]:
    return (HELLO, stub_pid, generation)


def parse_hello(message: Sequence[Any]) -> Hello:
    """The fields of a HELLO message (compares equal to ``(stub_pid, generation)``)."""
    return Hello(int(message[STUB_PID]), int(message[GENERATION]))


def welcome(slot: Any) -> Tuple[int, Any]:
    return (WELCOME, slot)


def parse_welcome(message: Sequence[Any]) -> Welcome:
    return Welcome(message[SLOT])


def infer(segment: Optional[str], entries: List[Any], trace: Optional[Tuple[int, List[Any]]] = None) -> Tuple[Any, ...]:
    """An INFER message; ``trace`` (see ``TRACE``) is appended only when given, so untraced batches
    keep the three-field message."""
    return (INFER, segment, entries) if trace is None else (INFER, segment, entries, trace)


def parse_infer(message: Sequence[Any]) -> Infer:
    return Infer(message[SEGMENT], message[BODY])


def entry(
    metas: List[Any], parameters: Any, requested: Any, sequence: Any = None, timeout_s: float = 0.0
) -> Tuple[Any, ...]:
    """One request of an INFER message. ``sequence`` is ``(sequence_id, start, end)`` for a sequence
    model (docs/sequences.md); ``timeout_s`` the request's timeout (0: none). Both are left out when
    neither is set, so plain requests keep the three-field entry."""
    if sequence is None and not timeout_s:
        return (metas, parameters, requested)
    return (metas, parameters, requested, sequence, timeout_s)


class Entry(NamedTuple):
    metas: List[Any]
    parameters: Any
    requested: Any
    sequence: Optional[Tuple[Any, bool, bool]]
    timeout_s: float


def parse_entry(raw: Sequence[Any]) -> Entry:
    if len(raw) == 3:
        return Entry(raw[0], raw[1], raw[2], None, 0.0)
    return Entry(raw[0], raw[1], raw[2], raw[3], float(raw[4]))


def cancelled(flags: List[bool]) -> Tuple[int, List[bool]]:
    return (CANCELLED, flags)


def parse_cancelled(message: Sequence[Any]) -> List[bool]:
    return [bool(flag) for flag in message[1]]


def parse_trace(message: Sequence[Any]) -> Optional[Tuple[int, List[Any]]]:
    """The ``TRACE`` field of an INFER message, or None (the message has none)."""
    return message[TRACE] if len(message) > TRACE else None


def ok(segment: Optional[str], results: List[Any], retire: bool = False) -> Tuple[int, Optional[str], List[Any], bool]:
    return (OK, segment, results, retire)


def parse_ok(message: Sequence[Any]) -> Ok:
    return Ok(message[SEGMENT], message[BODY], bool(message[RETIRE_AT[OK]]))


def error(text: str, retire: bool = False) -> Tuple[int, str, bool]:
    return (ERROR, text, retire)


# What a worker answers to a batch once its Triton drains (``Triton.stop``). The stub sends it with
# Triton's UNAVAILABLE code, which clients get as HTTP 503 or gRPC UNAVAILABLE: the answers load
# balancers and client retry policies retry on. A callable's own errors read ``Type: message``,
# which never starts with ``pytriton:``.
UNAVAILABLE_TEXT = "pytriton: the server is shutting down; retry the request on another replica"
UNAVAILABLE_MESSAGE = (ERROR, UNAVAILABLE_TEXT, False)


def parse_error(message: Sequence[Any]) -> Error:
    return Error(message[TEXT], bool(message[RETIRE_AT[ERROR]]))


def chunk(segment: Optional[str], results: List[Any]) -> Tuple[int, Optional[str], List[Any]]:
    return (CHUNK, segment, results)


def parse_chunk(message: Sequence[Any]) -> Chunk:
    return Chunk(message[SEGMENT], message[BODY])


def end(retire: bool = False) -> Tuple[int, bool]:
    return (END, retire)


def parse_end(message: Sequence[Any]) -> End:
    return End(bool(message[RETIRE_AT[END]]))


def with_retire(final: Tuple[Any, ...], retire: bool) -> Tuple[Any, ...]:
    """``final`` (an OK, ERROR or END reply) with its retire flag set to ``retire`` (other fields kept)."""
    at = RETIRE_AT[final[KIND]]
    return (*final[:at], retire, *final[at + 1 :])


def with_duration(final: Tuple[Any, ...], duration_s: float) -> Tuple[Any, ...]:
    """``final`` (an OK, ERROR or END reply, without a duration yet) carrying ``duration_s``."""
    return (*final, duration_s)


def callable_duration(final: Sequence[Any]) -> Optional[float]:
    """Seconds the callable ran for this batch (a stream: until its generator finished), or None.

    The optional field after the retire flag: the worker measures it around the call when the
    model's metrics are on (docs/metrics.md). Older messages without it stay valid.
    """
    at = RETIRE_AT[final[KIND]] + 1
    return final[at] if len(final) > at else None


def retires(final: Sequence[Any]) -> bool:
    """True if the stub must not write its arena again after this final reply.

    The worker sets it when the callable kept views of the stub's arena (large inputs are handed
    over without a copy): the stub then moves to a fresh segment and the kept arrays stay valid.
    Every builder of a final reply writes the flag, at ``RETIRE_AT[kind]``.
    """
    return bool(final[RETIRE_AT[final[KIND]]])


def must_acknowledge(chunk_message: Sequence[Any], unacknowledged: int) -> bool:
    """The streaming window, applied by both ends after each CHUNK.

    ``unacknowledged`` counts the chunks since the last acknowledgement, this one included. The
    worker then waits for NEXT or CANCEL and the stub sends one: always after a chunk that used the
    arena (its memory is reused for the next chunk), and after ``STREAM_WINDOW`` inline chunks.
    """
    return chunk_message[SEGMENT] is not None or unacknowledged >= STREAM_WINDOW


BYTES = "BYTES"
SHM_DIR = "/dev/shm"
# Written 0600 by Triton.bind next to the stub's model.py: what the stub needs to find its worker
# (pids, socket paths, segment prefixes), kept out of the model config that any client can read.
PRIVATE_FILE = "pytriton_private.json"
_ALIGN = 64
_SMALL = 1 << 16  # tensors up to this size travel inside the message
IN_RECEIVER = 1  # payload marker: the bytes are already in the receiver's own arena
# Streamed chunks the worker may send before it waits for the stub's NEXT (or CANCEL). Without a
# limit a fast generator runs far ahead of the stub and takes the CPU the first responses need to
# reach the client, and it could not be stopped; an arena chunk is always acknowledged (its memory
# is reused for the next one).
STREAM_WINDOW = 16
_UINT32 = struct.Struct("<I")  # frame lengths and BYTES element lengths


class Channel:
    """Length-prefixed marshal frames over a connected stream socket.

    Bytes read past the end of a frame are kept for the next :meth:`recv`, so any number of
    frames may be in flight (streamed chunks are sent back to back). Not thread-safe: one
    reader and one writer thread at most.

    ``poll_s`` > 0 lets :meth:`recv` poll for up to that long before it sleeps, so that a message
    arriving within the window is picked up without paying for a wake-up of this thread. It
    polls only while messages usually come that fast (a moving average of the time from this
    side's previous send or receive to the next message), so a peer that is slow or idle costs
    no CPU spent polling in vain. Each poll is a non-blocking ``recv`` that releases the GIL.
    """

    def __init__(self, sock: socket.socket, poll_s: float = 0.0):
        self.sock = sock
        self.poll_s = poll_s
        self._buffer = bytearray()
        self._last_activity = 0.0  # perf_counter() at the previous send or completed receive
        self._typical_wait_s = 0.0

    def send(self, message: Any) -> None:
        """Send one frame."""
        payload = marshal.dumps(message)
        self.sock.sendall(_UINT32.pack(len(payload)) + payload)
        self._last_activity = time.perf_counter()

    def recv(self) -> Any:
        """Receive one frame; raise ``EOFError`` if the peer closed the connection."""
        poll_s = self.poll_s if self._typical_wait_s < self.poll_s else 0.0
        buffer = self._buffer
        while True:
            if len(buffer) >= 4:
                end = 4 + _UINT32.unpack_from(buffer)[0]
                if len(buffer) >= end:
                    with memoryview(buffer) as view:
                        message = marshal.loads(view[4:end])
                    del buffer[:end]
                    self._note_arrival()
                    return message
                wanted = end - len(buffer)
            else:
                wanted = 4 - len(buffer)
            buffer += self._read(max(wanted, 1 << 16), poll_s)

    def _note_arrival(self) -> None:
        now = time.perf_counter()
        if self._last_activity:
            self._typical_wait_s = 0.9 * self._typical_wait_s + 0.1 * (now - self._last_activity)
        self._last_activity = now

    def _read(self, size: int, poll_s: float) -> bytes:
        if poll_s > 0.0:
            deadline = time.perf_counter() + poll_s
            while time.perf_counter() < deadline:
                try:
                    data = self.sock.recv(size, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                if not data:
                    raise EOFError("peer closed the connection")
                return data
        data = self.sock.recv(size)
        if not data:
            raise EOFError("peer closed the connection")
        return data


TensorMeta = Tuple[str, str, Tuple[int, ...], Any]  # name, dtype, shape, bytes or (offset, nbytes)


def shm_prefix(user_pid: int, token: str) -> str:
    """Common name prefix of every segment belonging to one ``Triton`` instance."""
    return f"pytriton-{user_pid}-{token}"


def _round_up(value: int, step: int) -> int:
    return (value + step - 1) // step * step


# Arena memory above this many bytes (the initial arena size) is given back to the system once its
# owner has been idle for ``RELEASE_IDLE_S`` (see ``IdleReleaser``). Only after idleness: re-touching
# released memory costs about 8x a plain copy (256 MiB: 180 ms first touch against 22 ms, measured
# here), which traffic that keeps coming should not pay on every request.
RELEASE_KEEP = 1 << 20
RELEASE_IDLE_S = 2.0


def close_quietly(resource: Any, *ignored: type) -> None:
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


class Arena:
    """A growable shared-memory buffer owned (written) by one side.

    Lifetime: the owner creates segments; the reader unlinks each one after mapping it. ``close``
    unmaps and unlinks (ignoring segments the reader already unlinked).
    """

    inline_limit = _SMALL  # tensors up to this size travel in the message (write_tensors)

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

    def offset_of(self, array: npt.NDArray[Any]) -> Optional[int]:
        """Offset of ``array``'s memory in the peer's arena if it lies there (contiguously), else None."""
        if self.buffer is None or not array.flags.c_contiguous:
            return None
        start = array.__array_interface__["data"][0] - self.address
        return start if start >= 0 and start + array.nbytes <= self.size else None


class SerializedBytes:
    """A BYTES tensor already in Triton's serialized layout: the stub forwards inputs this way.

    ``data`` is a buffer (bytes or a 1-D uint8 array) with each element as a 4-byte little-endian
    length and its bytes (:func:`serialize_bytes`). :func:`write_tensors` sends it unchanged, so
    the receiver sees an ordinary BYTES tensor. ``valid`` is False when the stub could not read the
    tensor (``_stub_bytes``); ``reshape`` is what the stub calls with the tensor's shape.
    """

    __slots__ = ("data", "shape", "valid")
    dtype = np.dtype(object)  # routes it to write_tensors' BYTES branch

    def __init__(self, data: Any, shape: Tuple[int, ...], valid: bool = True):
        self.data = data
        self.shape = shape
        self.valid = valid

    def reshape(self, shape: Sequence[int]) -> SerializedBytes:
        self.shape = tuple(shape)
        return self


def bytes_payload(buffer: Any, meta: TensorMeta) -> Any:
    """The serialized content of a BYTES tensor (bytes, or a view of the sender's arena)."""
    payload = meta[3]
    if type(payload) is bytes:
        return payload
    return memoryview(buffer)[payload[0] : payload[0] + payload[1]]


class IdleReleaser:
    """Gives arena memory back to the system once its owner has been idle for a while.

    A large request grows an arena (and the peer's) to its size; without this the memory stays
    resident for the life of the process. A daemon thread checks every ``idle_s / 2`` whether the
    owner has been idle (no :meth:`enter` without its :meth:`leave`) for ``idle_s`` and, if so,
    calls ``release(keep)`` once on every arena ``arenas()`` returns; traffic that keeps coming
    keeps its arenas hot and pays nothing. :meth:`enter` waits while a release runs (a few ms per
    hundred MiB), so memory is never released under a message in flight.

    Lifetime: the thread starts with the object and ends at :meth:`close` (or with the process).
    """

    def __init__(
        self,
        arenas: Callable[[], Sequence[Any]],
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
        """The owner is done with the message; the idle clock starts."""
        with self._lock:
            self._active -= 1
            self._last = time.monotonic()

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


def serialize_bytes(array: npt.NDArray[Any]) -> bytes:
    """Triton's BYTES layout: each element as a 4-byte little-endian length and its bytes."""
    pack = _UINT32.pack
    parts: List[bytes] = []
    for item in array.reshape(-1).tolist():
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray)):
            item = str(item).encode("utf-8")
        parts.append(pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def deserialize_bytes(buffer: Any, offset: int, nbytes: int, shape: Tuple[int, ...]) -> npt.NDArray[Any]:
    """Inverse of :func:`serialize_bytes`: an object array of ``bytes`` with ``shape``."""
    view = memoryview(buffer)[offset : offset + nbytes]
    count = 1
    for dim in shape:
        count *= dim
    items: List[bytes] = []
    position = 0
    unpack = _UINT32.unpack_from
    for _ in range(count):
        (length,) = unpack(view, position)
        position += 4
        items.append(bytes(view[position : position + length]))
        position += length
    view.release()
    result = np.empty(count, dtype=object)
    result[:] = items
    return result.reshape(shape)


def write_tensors(
    arena: Arena, groups: Sequence[Sequence[Tuple[str, Any]]], peer: Optional[ArenaReader] = None
) -> Tuple[Optional[str], List[List[TensorMeta]]]:
    """Describe every tensor of every group, group by group, copying large ones into ``arena``.

    Returns the arena's segment name if anything was written to it (the receiver must map it),
    else None, and the tensors' headers group by group.

    Small tensors travel inline (their bytes are the payload). Large numeric tensors are copied
    by numpy straight from their source, even non-contiguous or Fortran-ordered, into the arena,
    with no intermediate copy. A large tensor that already lies in the receiver's own arena (seen
    here through ``peer``, e.g. an input returned unchanged) is not copied at all: its payload is
    ``(offset, nbytes, IN_RECEIVER)``. BYTES tensors are serialised first (Triton's layout), unless
    they come as :class:`SerializedBytes`.
    """
    metas: List[List[TensorMeta]] = []
    pending: List[Tuple[int, Any]] = []  # (offset, source) for the arena
    # None: the caller knows everything is small; the TCP transport's arena keeps everything inline.
    inline_limit = _SMALL if arena is None else arena.inline_limit
    total = 0
    for group in groups:
        group_meta: List[TensorMeta] = []
        for name, array in group:
            if array.dtype.kind in "SUO":
                data: Any = array.data if type(array) is SerializedBytes else serialize_bytes(array)
                dtype = BYTES
                nbytes = len(data)
            else:
                data = array
                dtype = array.dtype.str
                nbytes = array.nbytes
            if nbytes <= inline_limit:
                # bytes() returns a bytes object itself; a SerializedBytes' array is copied (small).
                group_meta.append((name, dtype, array.shape, bytes(data) if dtype == BYTES else array.tobytes()))
                continue
            if peer is not None and dtype != BYTES:
                offset = peer.offset_of(array)
                if offset is not None:
                    group_meta.append((name, dtype, array.shape, (offset, nbytes, IN_RECEIVER)))
                    continue
            group_meta.append((name, dtype, array.shape, (total, nbytes)))
            pending.append((total, data))
            total = (total + nbytes + _ALIGN - 1) & ~(_ALIGN - 1)
        metas.append(group_meta)
    if not pending:
        return None, metas
    buffer = arena.reserve(total)
    for offset, data in pending:
        if isinstance(data, bytes):
            buffer[offset : offset + len(data)] = data
        else:
            target = np.frombuffer(buffer, dtype=data.dtype, count=data.size, offset=offset).reshape(data.shape)
            np.copyto(target, data, casting="no")
            del target  # release the export so the arena can be closed
    return arena.name, metas


_DTYPES: Dict[str, np.dtype[Any]] = {}


def _dtype(code: str) -> np.dtype[Any]:
    dtype = _DTYPES.get(code)
    if dtype is None:
        dtype = _DTYPES[code] = np.dtype(code)
    return dtype


def read_tensor(buffer: Any, meta: TensorMeta, copy: bool, own: Any = None) -> npt.NDArray[Any]:
    """The array ``meta`` describes; ``buffer`` is the sender's arena, ``own`` the receiver's.

    ``copy=True`` returns memory the caller owns and may keep. ``copy=False`` returns a view where
    it can: of the message itself (read-only), or of the arena (writable; the view keeps the mapping
    alive, but the sender writes that memory again for a later message unless a final reply told it
    not to, see :func:`retires`). BYTES tensors are always decoded into a new object array.
    """
    _, code, shape, payload = meta
    if type(payload) is bytes:
        if code == BYTES:
            return deserialize_bytes(payload, 0, len(payload), shape)
        array = np.frombuffer(payload, dtype=_dtype(code)).reshape(shape)
        return array.copy() if copy else array
    offset, nbytes = payload[0], payload[1]
    if len(payload) == 3:
        buffer = own
    if code == BYTES:
        return deserialize_bytes(buffer, offset, nbytes, shape)
    dtype = _dtype(code)
    # np.frombuffer holds a buffer export on the mapping, so it cannot be unmapped under this
    # array (np.ndarray(buffer=mmap) does not, and a closed mapping would crash the process).
    array = np.frombuffer(buffer, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset).reshape(shape)
    return array.copy() if copy else array


def _shm_names() -> List[str]:
    try:
        return os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []


def _unlink_all(names: List[str]) -> List[str]:
    removed = []
    for name in names:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except (FileNotFoundError, PermissionError):
            pass
    return removed


def sweep_segments(prefix: str) -> List[str]:
    """Remove every ``/dev/shm`` entry whose name starts with ``prefix``; return the names removed."""
    return _unlink_all([name for name in _shm_names() if name.startswith(prefix)])


def _owner_pid(name: str) -> Optional[int]:
    """The pid in ``pytriton-<pid>-...`` (a Triton's user process) or ``pytriton-inproc-<pid>-...``
    (a process running an in-process server), else None."""
    parts = name.split("-")
    if parts[0] != "pytriton" or len(parts) < 3:
        return None
    field = parts[2] if parts[1] == "inproc" and len(parts) > 3 else parts[1]
    return int(field) if field.isdigit() else None


def _owner_gone(name: str) -> bool:
    pid = _owner_pid(name)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def sweep_dead_owners() -> List[str]:
    """Remove pytriton segments whose owning user process no longer exists."""
    return _unlink_all([name for name in _shm_names() if _owner_gone(name)])


def make_private(prefix: str) -> List[str]:
    """``chmod 0600`` every ``/dev/shm`` entry of ours whose name starts with ``prefix``; return their names.

    Triton's Python backend creates its regions 0644 (it sets the mode explicitly, so a umask does not
    help): anyone on the machine could read the request tensors in them. An entry owned by someone else
    or already gone is skipped. This closes the file to new openers only; see docs/configuration.md.
    """
    changed = []
    for name in _shm_names():
        if not name.startswith(prefix):
            continue
        path = os.path.join(SHM_DIR, name)
        with contextlib.suppress(FileNotFoundError, PermissionError):
            if os.stat(path).st_mode & 0o077:
                os.chmod(path, 0o600)
                changed.append(name)
    return changed
