"""Wire protocol between the proxy model (in Triton's stub) and the user's process.

This module is imported on both sides. Inside the stub only the standard library and numpy (1.x,
or 2 on Python 3.13) are available, so it imports nothing outside its package
(``stubside/__init__.py``). The encoding does not depend on either version: numeric tensors travel
as raw bytes with their dtype string, string tensors in Triton's serialized layout
(``_tensors.serialize_bytes``).

Transport: one Unix stream socket per model instance, one message each way per batch (the stub
asks, the user's worker answers; a streamed batch gets one reply per yielded result, see
``STREAM_WINDOW``). A message is a 4-byte length followed by a
``marshal``-encoded tuple (both ends run the same Python version, so the format matches, and it is
several times faster than JSON). A plain socket is used rather than ZeroMQ because ZeroMQ routes
every message through its I/O threads: on the 2-core reference machine a ZeroMQ ``ipc://`` round
trip took 88 us against 24 us for the socket, and 188 us against 58 us after 600 us of idleness
(``python -m bench.transport_pingpong``, docs/architecture.md).

The rest of the protocol lives beside this module in the package: ``_tensors`` (how a tensor is
described and encoded), ``_arena`` (the shared-memory arenas and their idle release) and
``_segments`` (segment names and sweeping the leftovers of dead processes).

Each tensor is described by ``(name, dtype, shape, payload)``. Small tensors (up to 64 KiB) carry
their bytes in ``payload`` inside the message: measured inside the stub, that is cheaper than any
shared-memory bookkeeping. Larger tensors are written into a shared-memory *arena* owned by the
sending side, and ``payload`` is ``(offset, nbytes)`` in it.

Arenas are reused for every message, so steady-state traffic creates no segments. An arena grows
by replacing its segment with a bigger one; after a pause in traffic its pages past the first MiB
are given back to the system (``_arena.IdleReleaser``), so one large request does not pin its
memory. A segment is unlinked by the *reader* as soon as it has mapped it, so nothing stays in ``/dev/shm`` even if a process is later killed; the names
(``pytriton-<user pid>-<token>-...``) also let the user's process sweep leftovers of processes
that died in between.
"""

from __future__ import annotations

import marshal
import socket
import struct
import time
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

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
GENERATION = 2  # HELLO: the stub's generation (see stubside/_stub.py)
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


# Written 0600 by Triton.bind next to the stub's model.py: what the stub needs to find its worker
# (pids, socket paths, segment prefixes), kept out of the model config that any client can read.
PRIVATE_FILE = "pytriton_private.json"
# Streamed chunks the worker may send before it waits for the stub's NEXT (or CANCEL). Without a
# limit a fast generator runs far ahead of the stub and takes the CPU the first responses need to
# reach the client, and it could not be stopped; an arena chunk is always acknowledged (its memory
# is reused for the next one).
STREAM_WINDOW = 16
_UINT32 = struct.Struct("<I")  # frame lengths


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
