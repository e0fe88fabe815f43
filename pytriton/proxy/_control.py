"""The control channel between the user's process and a process instance's worker process.

One record per message kind, as on the stub's wire (``stubside/_messages.py``), and
:class:`ControlLink`, the ``Channel`` (``stubside/_wire.py``) that carries them: each message is a
4-byte length and its pickle. Pickle, not marshal, because the first message carries the settings
the worker process starts from and a log record's fields; both ends are the same program, started
by the user's process (``_process.py``), over a socket pair nobody else holds.

The exchange: the user's process sends a :class:`Start` first; the worker process answers
:class:`Ready` (or :class:`Failed`) and then, at any time, :class:`Log`, :class:`StubLost` and
:class:`Unrecoverable`. Commands (:class:`Retire`, :class:`Drain`) carry a number that the worker
process's :class:`Reply` repeats; :class:`Stop` ends the worker process.

Records are ``NamedTuple``\\ s: a few messages per process lifetime, so their cost does not matter
and pickle handles them as they are.

Unit tests: tests/unit/test_control.py; the whole exchange in tests/unit/test_process_instances.py.
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Tuple, TypedDict, Union

from pytriton.model_config.triton_model_config import TritonModelConfig

if TYPE_CHECKING:
    from pytriton.proxy.stubside._wire import Channel

_LENGTH = struct.Struct("<I")
LogFields = Dict[str, Union[str, int, float, bool, None]]  # a LogRecord's plain fields (logging.makeLogRecord)


class WorkerOptions(TypedDict):
    """The keyword arguments of ``InstanceWorker`` that a worker process gets as they are."""

    path: str
    config: TritonModelConfig
    strict: bool
    shm_prefix: str
    name: str
    poll_s: float
    metrics: bool


class Start(NamedTuple):
    """What the worker process starts from: the pickled callable, its worker's options, the parent's
    imports (``multiprocessing``'s preparation data), log levels (see ``_process.ProcessInstance``)
    and where the parent exports pytriton's spans (``_tracing.configure_export``: URL and resource
    attributes), if it does."""

    payload: bytes
    worker: WorkerOptions
    preparation: Dict[str, object]
    levels: Dict[str, int]
    trace_export: Optional[Tuple[str, Dict[str, str]]] = None


class Ready(NamedTuple):
    """The worker process serves its slot."""


class Failed(NamedTuple):
    """Loading the callable failed; the worker process exits. ``text``: what ``bind``/``run`` raise."""

    text: str


class Log(NamedTuple):
    """A log record of the worker process, to be handled by the parent's logging."""

    fields: LogFields


class StubLost(NamedTuple):
    """A stub died without saying goodbye (``InstanceWorker``'s ``on_stub_lost``)."""

    generation: int
    server_pid: int


class Unrecoverable(NamedTuple):
    """The callable raised ``PyTritonUnrecoverableError``: the parent stops serving."""

    text: str


ReplyValue = Union[bool, List[int]]


class Reply(NamedTuple):
    """The answer to the command numbered ``number`` (:class:`Retire`: the retired stubs' pids; :class:`Drain`: True)."""

    number: int
    value: ReplyValue


class Retire(NamedTuple):
    """``InstanceWorker.retire(generation)`` in the worker process."""

    number: int
    generation: int


class Drain(NamedTuple):
    """``Triton.stop()`` drains: admit at most ``remaining`` more requests, refuse the rest."""

    number: int
    remaining: int


class FailStuck(NamedTuple):
    """``InstanceWorker.fail_stuck_call(text, older_than_s)`` in the worker process (pytriton/_serving/unresponsive.py); no reply."""

    text: str
    older_than_s: float = 0.0


class Stop(NamedTuple):
    """Stop the worker (waiting up to ``timeout_s`` for its connections) and exit."""

    timeout_s: float


ToWorker = Union[Start, Retire, Drain, FailStuck, Stop]
FromWorker = Union[Ready, Failed, Log, StubLost, Unrecoverable, Reply]
ControlMessage = Union[ToWorker, FromWorker]


class ControlLink:
    """``Channel[ControlMessage]`` over one end of the control socket pair.

    ``send`` is thread-safe (every thread of the worker process logs through it); ``recv`` is for
    one thread. ``recv`` raises ``EOFError`` once the peer has closed its end. Closing the socket is
    the owner's business (``sock``).
    """

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, message: ControlMessage) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self.sock.sendall(_LENGTH.pack(len(data)) + data)

    def recv(self) -> ControlMessage:
        (size,) = _LENGTH.unpack(self._recv_exactly(_LENGTH.size))
        message: ControlMessage = pickle.loads(self._recv_exactly(size))
        return message

    def _recv_exactly(self, size: int) -> bytes:
        chunks: List[bytes] = []
        while size:
            chunk = self.sock.recv(min(size, 1 << 20))
            if not chunk:
                raise EOFError("the peer closed the control socket")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)


if TYPE_CHECKING:

    def _is_a_channel(link: ControlLink) -> Channel[ControlMessage]:
        return link  # mypy checks here that ControlLink implements the Channel protocol
