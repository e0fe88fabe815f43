"""The messages between the proxy model (in Triton's stub) and the user's worker: one record per kind.

Every message kind is a small record class with named, typed fields, its ``encode`` (the plain tuple
that goes on the wire, its kind first) and a decoder; :func:`decode` turns any frame back into its
record. Each kind has a fixed arity: an optional field that is absent travels as ``None`` (or 0 /
False where the record says so), so no reader tells fields apart by the length of a tuple.

The exchange (docs/architecture.md, "Where to change the wire protocol"): the stub sends
:class:`Hello` and gets :class:`Welcome`; per batch it sends :class:`Infer` and gets one final
reply (:class:`Ok`, :class:`Error`, or for a stream several :class:`Chunk` then :class:`End` or
:class:`Error`), answering any :class:`Ask` on the way with :class:`Cancelled`; it acknowledges
streamed chunks with :class:`Next` (or :class:`Cancel`, see :func:`must_acknowledge`) and says
:class:`Bye` when the instance goes away.

Each tensor is described by a :class:`TensorMeta`: small tensors carry their bytes in the message
(``place == INLINE``), larger ones are at ``offset`` in the sender's arena (``SENDER``) or, when the
sender found them in the receiver's own arena, there (``RECEIVER``; see ``_tensors.write_tensors``).

Records are ``__slots__`` classes rather than ``NamedTuple`` or frozen dataclasses: on CPython 3.11
constructing one took about 290 ns against 940 ns for a ``NamedTuple`` and 1,750 ns for a frozen
dataclass with slots, and reading a field was no slower (a one-off benchmark, ``bench/history.md``, measured the whole
data path). Their fields are ``Final``, so the type checker refuses to change a record: a final
reply with its retire flag or duration set is a new record (:meth:`Ok.settled`). ``marshal`` carries
only plain tuples, so ``encode`` builds one.

Imported on both sides (inside the stub: standard library only). Unit tests: tests/unit/test_wire.py.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Callable, ClassVar, Dict, Final, List, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:
    from marshal import _Marshallable

# -- kinds: the first field of every frame ------------------------------------------------------
# stub -> user
HELLO = 1
INFER = 2
NEXT = 3
BYE = 4
CANCEL = 5
CANCELLED = 6
# user -> stub
OK = 10
ERROR = 11
CHUNK = 12
END = 13
WELCOME = 14
ASK = 15

# Where a tensor's bytes are (TensorMeta.place).
INLINE = 0  # in the message (TensorMeta.data)
SENDER = 1  # in the sender's arena, the segment the message names
RECEIVER = 2  # in the receiver's own arena (an input returned unchanged: no copy either way)
BYTES = "BYTES"  # TensorMeta.dtype of a string tensor (Triton's serialized layout, _tensors.serialize_bytes)

# Streamed chunks the worker may send before it waits for the stub's NEXT (or CANCEL). Without a
# limit a fast generator runs far ahead of the stub and takes the CPU the first responses need to
# reach the client, and it could not be stopped; an arena chunk is always acknowledged (its memory
# is reused for the next one).
STREAM_WINDOW = 16

# What a worker answers to a batch once its Triton drains (``Triton.stop``). The stub sends it with
# Triton's UNAVAILABLE code, which clients get as HTTP 503 or gRPC UNAVAILABLE: the answers load
# balancers and client retry policies retry on. A callable's own errors read ``Type: message``,
# which never starts with ``pytriton:``.
UNAVAILABLE_TEXT = "pytriton: the server is shutting down; retry the request on another replica"
# What a stub answers for a call that pytriton's unresponsive-model watch failed (pytriton/_serving/unresponsive.py):
# every instance of the model had been in one call for PYTRITON_UNRESPONSIVE_AFTER_S. Also UNAVAILABLE:
# the instance serves again at once, so a retry succeeds.
STUCK_TEXT = (
    "pytriton: the call ran past PYTRITON_UNRESPONSIVE_AFTER_S while every instance of the model was busy, and was "
    "abandoned so that the requests queued behind it are served; retry the request (give the model an "
    "execution_timeout_s, more instances or a larger PYTRITON_UNRESPONSIVE_AFTER_S if its calls rightly run this long)"
)
RETRYABLE_TEXTS = frozenset({UNAVAILABLE_TEXT, STUCK_TEXT})  # answered with Triton's UNAVAILABLE code
# A backend instance's call runs in its stub (stubside/_inline.py): the watch fails it by sending the stub
# this signal (signal.SIGUSR2), whose handler raises in the call so that its batch is answered STUCK_TEXT;
# a call younger than STUCK_MIN_AGE_S is not the one the watch saw stuck (it reports only calls it saw at
# two polls, 0.25 s apart) and is left alone. A stub that does not answer so is killed (proxy/_backend_kind.py).
STUCK_SIGNAL = signal.SIGUSR2
STUCK_MIN_AGE_S = 0.1

Frame = Tuple["_Marshallable", ...]  # what marshal carries: a plain tuple of plain values
# A request parameter as Triton passes it (the JSON of ``InferenceRequest.parameters()``).
ParameterValue = Union[bool, int, float, str]
Parameters = Dict[str, ParameterValue]
SequenceId = Union[int, str]
# A sequence request's (sequence id, start flag, end flag) (docs/sequences.md).
SequenceFields = Tuple[SequenceId, bool, bool]
# Present only while Triton traces a request of the batch (OpenTelemetry mode): when the stub started
# the batch (ns) and per request Triton's trace context (a JSON string with "traceparent") or None.
TraceFields = Tuple[int, List[Optional[str]]]


class _Record:
    """Equality and ``repr`` by field, for tests and logs (the data path never compares records)."""

    __slots__: Tuple[str, ...] = ()

    def fields(self) -> Tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, _Record) and self.fields() == other.fields()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"


class TensorMeta(_Record):
    """One tensor of a message: its name, dtype, shape and where its bytes are (``place``).

    ``dtype`` is numpy's dtype string (``"<f4"``) or :data:`BYTES`. ``data`` holds the bytes when
    ``place`` is :data:`INLINE` (else None); ``offset`` and ``nbytes`` locate them in an arena
    (``nbytes`` is also set for inline data).
    """

    __slots__ = ("name", "dtype", "shape", "place", "data", "offset", "nbytes")

    def __init__(
        self, name: str, dtype: str, shape: Tuple[int, ...], place: int, data: Optional[bytes], offset: int, nbytes: int
    ):
        self.name: Final = name
        self.dtype: Final = dtype
        self.shape: Final = shape
        self.place: Final = place
        self.data: Final = data
        self.offset: Final = offset
        self.nbytes: Final = nbytes

    def encode(self) -> Frame:
        return (self.name, self.dtype, self.shape, self.place, self.data, self.offset, self.nbytes)

    @staticmethod
    def decode(raw: Sequence[object]) -> TensorMeta:
        name, dtype, shape, place, data, offset, nbytes = raw
        if type(name) is not str or type(dtype) is not str or type(shape) is not tuple or type(offset) is not int:
            raise TypeError("malformed tensor header")
        if type(place) is not int or type(nbytes) is not int or not (data is None or type(data) is bytes):
            raise TypeError("malformed tensor header")
        return TensorMeta(name, dtype, shape, place, data, offset, nbytes)


Tensors = List[TensorMeta]  # the tensors of one request or response


def _encode_groups(groups: List[Tensors]) -> List[List[Frame]]:
    return [[meta.encode() for meta in group] for group in groups]


def _trace(raw: object) -> TraceFields:
    if type(raw) is tuple and len(raw) == 2:
        started_ns, contexts = raw
        if type(started_ns) is int and type(contexts) is list:
            return started_ns, contexts
    raise TypeError("malformed trace field")


def _duration(raw: object) -> Optional[float]:
    if raw is None or type(raw) is float:
        return raw
    raise TypeError("malformed duration")


def _decode_groups(raw: object) -> List[Tensors]:
    if type(raw) is not list:
        raise TypeError("malformed tensor groups")
    decode_meta = TensorMeta.decode
    return [[decode_meta(meta) for meta in group] for group in raw]


# -- stub -> user ---------------------------------------------------------------------------------
class Hello(_Record):
    """The stub's first message on a connection: its process id and its model generation."""

    KIND: ClassVar[int] = HELLO
    __slots__ = ("stub_pid", "generation")

    def __init__(self, stub_pid: int, generation: int):
        self.stub_pid: Final = stub_pid
        self.generation: Final = generation

    def encode(self) -> Frame:
        return (HELLO, self.stub_pid, self.generation)

    @staticmethod
    def decode(frame: Frame) -> Hello:
        _, stub_pid, generation = frame
        if type(stub_pid) is not int or type(generation) is not int:
            raise TypeError("malformed HELLO message")
        return Hello(stub_pid, generation)


class Entry(_Record):
    """One request of an :class:`Infer`: its inputs, parameters, requested outputs (None: all),
    its sequence fields (None unless the model is a sequence model) and its timeout (0: none)."""

    __slots__ = ("tensors", "parameters", "requested", "sequence", "timeout_s")

    def __init__(
        self,
        tensors: Tensors,
        parameters: Optional[Parameters] = None,
        requested: Optional[List[str]] = None,
        sequence: Optional[SequenceFields] = None,
        timeout_s: float = 0.0,
    ):
        self.tensors: Final = tensors
        self.parameters: Final = parameters
        self.requested: Final = requested
        self.sequence: Final = sequence
        self.timeout_s: Final = timeout_s

    def encode(self) -> Frame:
        return ([m.encode() for m in self.tensors], self.parameters, self.requested, self.sequence, self.timeout_s)

    @staticmethod
    def decode(raw: Sequence[object]) -> Entry:
        tensors, parameters, requested, sequence, timeout_s = raw
        if not (parameters is None or type(parameters) is dict):
            raise TypeError("malformed request entry")
        if requested is not None:
            if type(requested) is not list and type(requested) is not tuple:
                raise TypeError("malformed request entry")
            requested = [str(name) for name in requested]
        if not (sequence is None or (type(sequence) is tuple and len(sequence) == 3)):
            raise TypeError("malformed request entry")
        if type(tensors) is not list or not (type(timeout_s) is float or type(timeout_s) is int):
            raise TypeError("malformed request entry")
        decode_meta = TensorMeta.decode
        return Entry([decode_meta(m) for m in tensors], parameters, requested, sequence, timeout_s)


class Infer(_Record):
    """A batch: the stub's arena segment to map (None if every tensor is inline), one entry per request."""

    KIND: ClassVar[int] = INFER
    __slots__ = ("segment", "entries", "trace")

    def __init__(self, segment: Optional[str], entries: List[Entry], trace: Optional[TraceFields] = None):
        self.segment: Final = segment
        self.entries: Final = entries
        self.trace: Final = trace

    def encode(self) -> Frame:
        return (INFER, self.segment, [entry.encode() for entry in self.entries], self.trace)

    @staticmethod
    def decode(frame: Frame) -> Infer:
        _, segment, entries, trace = frame
        if not (segment is None or type(segment) is str) or type(entries) is not list:
            raise TypeError("malformed INFER message")
        decode_entry = Entry.decode
        return Infer(segment, [decode_entry(entry) for entry in entries], None if trace is None else _trace(trace))


class Cancelled(_Record):
    """The answer to :class:`Ask`: per request of the batch, whether Triton cancelled it."""

    KIND: ClassVar[int] = CANCELLED
    __slots__ = ("flags",)

    def __init__(self, flags: List[bool]):
        self.flags: Final = flags

    def encode(self) -> Frame:
        return (CANCELLED, self.flags)

    @staticmethod
    def decode(frame: Frame) -> Cancelled:
        _, flags = frame
        if type(flags) is not list:
            raise TypeError("malformed CANCELLED message")
        return Cancelled([bool(flag) for flag in flags])


class _Signal(_Record):
    """A message with no fields (its kind says everything); each has one shared instance."""

    KIND: ClassVar[int] = 0

    def encode(self) -> Frame:
        return (self.KIND,)


class Next(_Signal):
    """Acknowledges streamed chunks: send more."""

    KIND: ClassVar[int] = NEXT


class Cancel(_Signal):
    """Instead of :class:`Next`: nobody wants the rest of this stream; close the generator."""

    KIND: ClassVar[int] = CANCEL


class Bye(_Signal):
    """The instance is going away (answered with an empty :class:`Ok`)."""

    KIND: ClassVar[int] = BYE


class Ask(_Signal):
    """Sent while a batch runs, before its final reply: which requests did Triton cancel? The stub
    answers :class:`Cancelled` and keeps waiting for the reply (``Request.is_cancelled()``)."""

    KIND: ClassVar[int] = ASK


NEXT_MESSAGE: Final = Next()
CANCEL_MESSAGE: Final = Cancel()
BYE_MESSAGE: Final = Bye()
ASK_MESSAGE: Final = Ask()


# -- user -> stub ---------------------------------------------------------------------------------
class Welcome(_Record):
    """The worker's answer to :class:`Hello`: its name for the instance slot."""

    KIND: ClassVar[int] = WELCOME
    __slots__ = ("slot",)

    def __init__(self, slot: str):
        self.slot: Final = slot

    def encode(self) -> Frame:
        return (WELCOME, self.slot)

    @staticmethod
    def decode(frame: Frame) -> Welcome:
        _, slot = frame
        return Welcome(str(slot))


class Ok(_Record):
    """The final reply of a batch that succeeded: the worker's arena segment (None if every tensor
    is inline) and the outputs, one group per request.

    ``retire``: the stub must not write its arena again (the callable kept views of it, so the stub
    moves to a fresh segment and the kept arrays stay valid). ``duration_s``: how long the callable
    ran, when the model's metrics are on (docs/metrics.md); None otherwise. :class:`Error` and
    :class:`End`, the other final replies, carry the same two fields.
    """

    KIND: ClassVar[int] = OK
    __slots__ = ("segment", "results", "retire", "duration_s")

    def __init__(
        self, segment: Optional[str], results: List[Tensors], retire: bool = False, duration_s: Optional[float] = None
    ):
        self.segment: Final = segment
        self.results: Final = results
        self.retire: Final = retire
        self.duration_s: Final = duration_s

    def settled(self, retire: bool, duration_s: Optional[float]) -> Ok:
        return Ok(self.segment, self.results, retire, duration_s)

    def encode(self) -> Frame:
        return (OK, self.segment, _encode_groups(self.results), self.retire, self.duration_s)

    @staticmethod
    def decode(frame: Frame) -> Ok:
        _, segment, results, retire, duration_s = frame
        if not (segment is None or type(segment) is str):
            raise TypeError("malformed OK message")
        return Ok(segment, _decode_groups(results), bool(retire), _duration(duration_s))


class Error(_Record):
    """The final reply of a batch that failed: one error text for every request of the batch."""

    KIND: ClassVar[int] = ERROR
    __slots__ = ("text", "retire", "duration_s")

    def __init__(self, text: str, retire: bool = False, duration_s: Optional[float] = None):
        self.text: Final = text
        self.retire: Final = retire
        self.duration_s: Final = duration_s

    def settled(self, retire: bool, duration_s: Optional[float]) -> Error:
        return Error(self.text, retire, duration_s)

    def encode(self) -> Frame:
        return (ERROR, self.text, self.retire, self.duration_s)

    @staticmethod
    def decode(frame: Frame) -> Error:
        _, text, retire, duration_s = frame
        return Error(str(text), bool(retire), _duration(duration_s))


class Chunk(_Record):
    """One streamed response per request of the batch; more follow (see :func:`must_acknowledge`)."""

    KIND: ClassVar[int] = CHUNK
    __slots__ = ("segment", "results")

    def __init__(self, segment: Optional[str], results: List[Tensors]):
        self.segment: Final = segment
        self.results: Final = results

    def encode(self) -> Frame:
        return (CHUNK, self.segment, _encode_groups(self.results))

    @staticmethod
    def decode(frame: Frame) -> Chunk:
        _, segment, results = frame
        if not (segment is None or type(segment) is str):
            raise TypeError("malformed CHUNK message")
        return Chunk(segment, _decode_groups(results))


class End(_Record):
    """The final reply of a stream that finished."""

    KIND: ClassVar[int] = END
    __slots__ = ("retire", "duration_s")

    def __init__(self, retire: bool = False, duration_s: Optional[float] = None):
        self.retire: Final = retire
        self.duration_s: Final = duration_s

    def settled(self, retire: bool, duration_s: Optional[float]) -> End:
        return End(retire, duration_s)

    def encode(self) -> Frame:
        return (END, self.retire, self.duration_s)

    @staticmethod
    def decode(frame: Frame) -> End:
        _, retire, duration_s = frame
        return End(bool(retire), _duration(duration_s))


UNAVAILABLE_MESSAGE: Final = Error(UNAVAILABLE_TEXT)

FinalReply = Union[Ok, Error, End]  # the last reply of a batch
StubMessage = Union[Hello, Infer, Next, Cancel, Bye, Cancelled]
WorkerMessage = Union[Welcome, Ok, Error, Chunk, End, Ask]
Message = Union[StubMessage, WorkerMessage]


Decoder = Callable[[Frame], Message]


def _signal(message: Message) -> Decoder:
    def decode(frame: Frame) -> Message:
        if len(frame) != 1:
            raise TypeError("malformed message")
        return message

    return decode


_DECODERS: Dict[object, Decoder] = {
    HELLO: Hello.decode,
    INFER: Infer.decode,
    NEXT: _signal(NEXT_MESSAGE),
    BYE: _signal(BYE_MESSAGE),
    CANCEL: _signal(CANCEL_MESSAGE),
    CANCELLED: Cancelled.decode,
    OK: Ok.decode,
    ERROR: Error.decode,
    CHUNK: Chunk.decode,
    END: End.decode,
    WELCOME: Welcome.decode,
    ASK: _signal(ASK_MESSAGE),
}


def decode(frame: object) -> Message:
    """The record of a received frame; raises ``TypeError`` or ``ValueError`` if it is not a message."""
    if type(frame) is not tuple or not frame:
        raise TypeError("not a pytriton message")
    decoder = _DECODERS.get(frame[0])
    if decoder is None:
        raise ValueError(f"unknown message kind {frame[0]!r}")
    return decoder(frame)


def must_acknowledge(chunk: Chunk, unacknowledged: int) -> bool:
    """The streaming window, applied by both ends after each :class:`Chunk`.

    ``unacknowledged`` counts the chunks since the last acknowledgement, this one included. The
    worker then waits for NEXT or CANCEL and the stub sends one: always after a chunk that used the
    arena (its memory is reused for the next chunk), and after :data:`STREAM_WINDOW` inline chunks.
    """
    return chunk.segment is not None or unacknowledged >= STREAM_WINDOW
