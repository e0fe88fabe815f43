"""One stub's connection to an instance worker: its session state, the batch's cancellation probe, abandoning a call.

:class:`Session` is what :class:`pytriton.proxy._worker.InstanceWorker` keeps per connected stub (the
arenas, the event loop of ``async`` callables, what the batch in flight is doing); :class:`CancelProbe`
answers ``Request.is_cancelled()`` over that connection; :class:`CallAbandoned` is raised inside a
thread instance's callable that ran past its execution timeout. Resource lifetimes are in each class's
docstring. Unit tests: tests/unit/test_cancellation.py, tests/unit/test_worker.py.
"""

from __future__ import annotations

import contextvars
import socket
import threading
import time
from typing import TYPE_CHECKING, List, Optional, Union

from pytriton._platform import native
from pytriton.proxy import _tracing
from pytriton.proxy.stubside import _arena, _messages, _wire, _zmq_channel
from pytriton.proxy.stubside._messages import Message
from pytriton.proxy.types import Request

if TYPE_CHECKING:
    import asyncio


class CancelProbe:
    """Answers ``Request.is_cancelled()`` for one batch by asking its stub (ASK -> CANCELLED).

    Shared by the requests of the batch; usable from any thread while the callable runs. It asks at
    most once per ``INTERVAL_S`` (a tight polling loop costs one round trip per interval) and
    remembers a cancellation for good. :meth:`close` is called before the batch's final reply is
    sent, so no question can follow it on the connection; afterwards the last answer stays.
    """

    INTERVAL_S = 0.001

    def __init__(self, channel: _wire.Channel[Message], n_requests: int):
        self._channel = channel
        self._flags = [False] * n_requests
        self.lock = threading.Lock()  # one exchange on the connection at a time (see _stream)
        self._open = True
        self._asked = 0.0

    def __call__(self, index: int) -> bool:
        if self._flags[index]:
            return True
        with self.lock:
            now = time.monotonic()
            if self._open and now - self._asked >= self.INTERVAL_S:
                self._asked = now
                try:
                    self._channel.send(_messages.ASK_MESSAGE)
                    reply = self._channel.recv()
                except (EOFError, OSError):  # the stub is gone: nobody waits for the batch
                    self._open = False
                    self._flags = [True] * len(self._flags)
                    return True
                if type(reply) is _messages.Cancelled:
                    self._flags = [old or new for old, new in zip(self._flags, reply.flags)]
        return self._flags[index]

    def known(self, index: int) -> bool:
        """What is known without asking: cancelled at an earlier answer (or by ``cancel_all``)."""
        return self._flags[index]

    def close(self) -> None:
        with self.lock:
            self._open = False

    def cancel_all(self) -> None:
        """Nobody waits for the batch any more (its stub gave up): every request reads as cancelled."""
        self._open = False  # no question may go over the abandoned connection
        self._flags = [True] * len(self._flags)


class CallAbandoned(BaseException):
    """Raised inside a thread instance's callable that ran past the model's execution timeout.

    A ``BaseException``, so that ``except Exception`` in the callable does not swallow it. Its batch
    has already failed at the client; whatever the call does afterwards is discarded.
    """


_raise_in_thread = native.raise_in_thread  # Python raises it at the thread's next eval-breaker check


class StubLeft(Exception):
    """The stub closed the connection, or stopped waiting, in the middle of a stream."""


class Session:
    """One connection from a stub process, served on its own thread.

    Owns the worker-side arena (outputs), the reader that maps the stub's arena (inputs) and, for
    ``async`` callables, an event loop; :meth:`close` releases all of them when the connection ends.
    """

    def __init__(self, number: int, sock: Union[socket.socket, _zmq_channel.Connection, None], arena_prefix: str):
        self.number = number
        self.sock = sock  # a Unix socket, or a TCP transport's connection (proxy/stubside/_zmq_channel.py)
        # Set by the serving thread (or a direct caller): a stream talks to its stub through it.
        self.channel: Optional[_wire.Channel[Message]] = None
        # The TCP transport shares no memory with its stub: every tensor travels in the message.
        inline = isinstance(sock, _zmq_channel.Connection)
        self.arena: _arena.Arena = (
            _zmq_channel.InlineArena() if inline else _arena.SharedArena(f"{arena_prefix}-c{number}")
        )
        self.reader = _arena.ArenaReader()
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.thread: Optional[threading.Thread] = None
        self.stub_pid = 0
        self.server_pid = 0  # the stub's parent: tells a stub death from the death of a whole server
        self.generation = 0
        self.busy = False
        self.connected = False  # between HELLO and BYE
        self.said_bye = False
        # Its stub stopped waiting for the batch (execution timeout) and reconnected: whatever the
        # callable returns here is discarded.
        self.abandoned = False
        # Its stub belongs to a model generation that was replaced (see InstanceWorker.retire).
        self.retired = False
        # perf_counter() around the current batch's call (call_started 0: the callable was not called).
        self.call_started = 0.0
        self.call_ended = 0.0
        self.spans: Optional[List[Optional[_tracing.Span]]] = (
            None  # of the batch in flight, when Triton traces it (_tracing)
        )
        self.probe: Optional[CancelProbe] = None  # of the batch in flight (Request.is_cancelled)
        self.in_callable = False  # the serving thread is inside the callable (see _end_hung_calls)
        # Orders interrupt() against leave_callable(), so CallAbandoned is only ever raised while the
        # serving thread has yet to pass leave_callable()'s start (a check point), never later.
        self.interrupt_lock = threading.Lock()
        self.batch_token: Optional[contextvars.Token[Optional[List[Request]]]] = None  # CURRENT_BATCH's
        # Orders the serving thread's final reply against fail_stuck_call() from the supervisor: exactly one
        # of them answers the batch.
        self.reply_lock = threading.Lock()

    def event_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            import asyncio  # only for async callables: ~20 ms of imports a process need not pay before its first request

            self.loop = asyncio.new_event_loop()
        return self.loop

    def drop_loop(self) -> None:
        """Forget the event loop (after a BaseException escaped it, its state is not to be trusted)."""
        _arena.close_quietly(self.loop, Exception)
        self.loop = None

    def interrupt(self) -> bool:
        """From another thread: raise :class:`CallAbandoned` in the serving thread if it is in the callable."""
        with self.interrupt_lock:
            if not self.in_callable or self.thread is None or self.thread.ident is None:
                return False
            return _raise_in_thread(self.thread.ident, CallAbandoned)

    def leave_callable(self) -> None:
        """On the serving thread, once the callable returned or raised (call it inside the ``try``
        that catches the callable's exceptions: a CallAbandoned asked for just before arrives here)."""
        with self.interrupt_lock:
            self.in_callable = False

    def close(self) -> None:
        self.arena.close()
        self.reader.close()
        self.drop_loop()
