"""User-side end of the proxy: one worker thread per model instance.

Threading model: each instance slot of a bound model gets a dedicated thread listening on its own
Unix socket, so a batch goes from the stub to the callable with no thread hop in between. Instances of
one model therefore run concurrently as threads of the user's process and share its GIL; work that
releases the GIL (numpy, PyTorch, I/O) runs in parallel, pure-Python work does not. ``async``
callables run on a private event loop owned by the worker thread. With
``bind(..., instance_kind="process")`` the same worker runs in a worker process of its own per
instance instead (``_process.py``, ``_process_child.py``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, List, Optional, Tuple, Type, Union

import numpy as np
import numpy.typing as npt

from pytriton._platform import proc
from pytriton.exceptions import PyTritonRuntimeError, PyTritonUnrecoverableError
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy import _stub_watch, _tracing
from pytriton.proxy._outputs import OutputChecker
from pytriton.proxy._session import CallAbandoned, CancelProbe, Session, StubLeft
from pytriton.proxy.stubside import _messages, _tensors, _wire, _zmq_channel
from pytriton.proxy.stubside._messages import (
    Chunk,
    End,
    Error,
    FinalReply,
    Hello,
    Infer,
    Message,
    Ok,
    Tensors,
)
from pytriton.proxy.types import CURRENT_BATCH, CURRENT_MODEL, Request, _wire_request

if TYPE_CHECKING:
    from pytriton.proxy._admission import Admission

LOGGER = logging.getLogger(__name__)


def error_text(exc: BaseException) -> str:
    """What a client sees for a failed request: the exception type and message, no traceback.

    Never raises: an exception whose ``__str__`` fails is named by its type alone.
    """
    name = type(exc).__name__
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - a broken __str__ must not take the worker down
        return f"{name} (its message could not be printed)"
    return f"{name}: {message}" if message else name


_proc_stat = proc.stat_fields  # the fields of /proc/<pid>/stat after the command name


def _process_running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (a killed stub stays a zombie until Triton reaps it)."""
    fields = _proc_stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


class InstanceWorker:
    """Serves one instance slot of a bound model.

    Threads: an accept thread (``pytriton-<model>-<slot>``) waits for stub connections on the
    slot's socket and serves each on a thread of its own (``...-c<n>``). Normally one stub is
    connected at a time; a second connection appears when a stub gave up waiting for a hung
    callable (execution timeout) and reconnected, or while a replacement generation of the model
    loads next to the old one. The callable is then called from the newer connection's thread
    while the hung call keeps its own (a Python thread cannot be interrupted).

    Lifetime: :meth:`start` binds the socket and starts the accept thread; :meth:`stop` ends the
    threads (leaving behind, as daemon threads, only callables that do not return) and releases
    the socket and the shared-memory arenas.
    """

    def __init__(
        self,
        *,
        path: str,
        infer_func: Callable[..., object],
        config: TritonModelConfig,
        strict: bool,
        shm_prefix: str,
        on_unrecoverable: Callable[[BaseException], None],
        name: str,
        poll_s: float = 0.0,
        on_stub_lost: Optional[Callable[[int, int], None]] = None,
        metrics: bool = False,
        on_hung_call: Optional[Callable[[], None]] = None,
    ):
        self._path = path
        self._infer_func = infer_func
        self._config = config
        self._decoupled = config.decoupled
        self._checker = OutputChecker(config, strict)
        self._shm_prefix = shm_prefix
        self._on_unrecoverable = on_unrecoverable
        # Called with (generation, server pid) of a stub that died without saying goodbye.
        self._on_stub_lost = on_stub_lost
        self._name = name
        self._poll_s = poll_s  # how long to poll for the next message before sleeping (0: never)
        self._metrics = metrics  # final replies carry the callable's duration (docs/metrics.md)
        # Called when a stub gave up on a running call (execution timeout) instead of interrupting its
        # thread: a worker process ends itself there, and is replaced (_process_child.py).
        self._on_hung_call = on_hung_call
        self._thread: Optional[threading.Thread] = None
        self._listener: Union[socket.socket, _zmq_channel.Listener, None] = None  # a TCP transport's, or a Unix socket
        self._sessions: List[Session] = []
        self._sessions_lock = threading.Lock()
        self._session_count = 0
        self._direct: Optional[Session] = None
        self._stopping = False
        self.last_active = 0.0  # time.monotonic() when the last batch finished
        # Set by Triton.stop() when draining (server/_drain.py): batches it does not admit are refused.
        self.admission: Optional[Admission] = None

    @property
    def connected(self) -> bool:
        """True while a stub is attached (a stub that stopped waiting for a hung call does not count)."""
        return any(session.connected and not session.abandoned for session in self._sessions)

    @property
    def busy(self) -> bool:
        """True while a batch is being processed for a stub that still waits for it."""
        return any(session.busy and not session.abandoned for session in self._sessions)

    @property
    def stub_stopped(self) -> bool:
        """True while the stub attached on this host is stopped by a signal (``proxy/_stub_watch.py``)."""
        return any(
            session.connected
            and not (session.abandoned or session.retired)
            and session.stub_pid
            and not getattr(session.sock, "inline_only", False)  # the TCP transport: a pid of another host
            and _stub_watch.stopped(session.stub_pid)
            for session in list(self._sessions)
        )

    def start(self, listener: Optional[socket.socket] = None) -> None:
        """Listen on the slot's socket (or its route of the TCP transport) and start serving.

        ``listener``: a socket already listening on the slot's path, to serve instead of binding
        one (a worker process gets it from the process that bound the model, see ``_process.py``).
        """
        if listener is not None:
            self._listener = listener
        elif self._path.startswith(_zmq_channel.SCHEME):
            self._listener = _zmq_channel.listen(self._path)
        else:
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(self._path)
            self._listener.listen(4)
        self._thread = threading.Thread(target=self._accept, name=f"pytriton-{self._name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the threads and free resources. Idempotent.

        Waits up to ``timeout_s`` for idle connections to close. A connection whose callable is
        still running (hung: the server is already gone when this is called) is not waited for
        beyond a short moment: its daemon thread is left behind, and logged.
        """
        if self._direct is not None:
            self._direct.close()
            self._direct = None
        if self._thread is None:
            return
        self._stopping = True
        deadline = time.monotonic() + timeout_s
        # shutdown() wakes a blocking accept() or recv() at once.
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._sessions_lock:
            sessions = list(self._sessions)
        for session in sessions:
            if session.sock is not None:
                with contextlib.suppress(OSError):
                    session.sock.shutdown(socket.SHUT_RDWR)
        hung = 0
        for session in sessions:
            if session.thread is None:
                continue
            session.thread.join(0.1 if session.busy else max(0.0, deadline - time.monotonic()))
            if session.thread.is_alive():
                hung += 1
        if hung:
            LOGGER.warning(
                "Worker %s: %d inference call(s) still running at stop; a Python thread cannot be interrupted, so "
                "their daemon thread(s) are left behind (their results are discarded).",
                self._name,
                hung,
            )
        self._thread = None

    def retire(self, generation: int) -> List[int]:
        """Mark the connections of stubs older than ``generation``; return those stubs' pids.

        Used after the model was reloaded: the old generation's stubs are no longer sent work,
        and their end is expected (no ``on_stub_lost``).
        """
        pids = []
        with self._sessions_lock:
            for session in self._sessions:
                if session.generation < generation and session.stub_pid:
                    session.retired = True
                    pids.append(session.stub_pid)
        return pids

    def retired_busy(self) -> bool:
        """True while a retired connection still processes a batch."""
        return any(session.busy and session.retired and not session.abandoned for session in self._sessions)

    # -- threads -------------------------------------------------------------------------
    def _accept(self) -> None:
        """Wait for stub connections; serve each on a thread of its own."""
        listener = self._listener
        assert listener is not None
        try:
            while not self._stopping:
                try:
                    sock, _ = listener.accept()
                except OSError:
                    return
                with self._sessions_lock:
                    if self._stopping:
                        sock.close()
                        return
                    self._session_count += 1
                    session = self._new_session(self._session_count, sock)
                    self._sessions.append(session)
                session.thread = threading.Thread(
                    target=self._run_session,
                    args=(session,),
                    name=f"pytriton-{self._name}-c{session.number}",
                    daemon=True,
                )
                session.thread.start()
        except BaseException:  # noqa: BLE001 - log whatever ends this thread
            LOGGER.exception("Worker %s: accepting connections failed", self._name)
        finally:
            listener.close()

    def _new_session(self, number: int, sock: Union[socket.socket, _zmq_channel.Connection]) -> Session:
        """The state of one accepted connection (a seam: a worker process publishes it, see ``_process_child.py``)."""
        return Session(number, sock, self._shm_prefix)

    def _run_session(self, session: Session) -> None:
        try:
            self._serve(session)
        except BaseException:  # noqa: BLE001 - log whatever ends this thread
            LOGGER.exception("Worker %s crashed", self._name)
        finally:
            _stub_watch.WATCH.forget(session)
            with self._sessions_lock:
                self._sessions.remove(session)
            assert session.sock is not None
            session.sock.close()
            session.close()
        if session.stub_pid and not session.said_bye and self._stub_died(session):
            # Also the normal end of a stub when a server is killed: the owner decides what it means.
            LOGGER.debug(
                "Model %s: the stub process (pid %s) of instance %s died without saying goodbye.",
                self._config.model_name,
                session.stub_pid,
                self._name,
            )
            if self._on_stub_lost is not None:
                self._on_stub_lost(session.generation, session.server_pid)

    def _stub_died(self, session: Session) -> bool:
        """After a connection ended without BYE: True if its stub process died.

        A killed process closes its sockets before it turns into a zombie, so the end of the
        connection can be seen while the process still looks alive: wait a moment for it. A live
        stub that dropped the connection (execution timeout) reconnects instead, which marks this
        session abandoned.
        """
        deadline = time.monotonic() + 2.0
        while not (session.abandoned or session.retired or self._stopping):
            if not _process_running(session.stub_pid):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return False

    def _serve(self, session: Session) -> None:
        assert session.sock is not None
        CURRENT_MODEL.set(self._config.model_name)  # this thread's context: for pipeline handles (cycles)
        sock = session.sock
        channel: _wire.Channel[Message] = (
            sock.channel() if isinstance(sock, _zmq_channel.Connection) else _wire.SocketChannel(sock, self._poll_s)
        )
        session.channel = channel
        while not self._stopping:
            try:
                message = channel.recv()
            except (EOFError, OSError):
                return
            admission = self.admission
            if admission is not None and type(message) is Infer and not admission.admit(len(message.entries)):
                # Draining: the callable is not called and, as the batch did no work, last_active
                # stays, so Triton.stop() sees the instance idle (docs/architecture.md, Graceful drain).
                try:
                    channel.send(_messages.UNAVAILABLE_MESSAGE)
                except OSError:
                    return
                continue
            session.busy = True
            try:
                reply = self._handle(session, message)
            except StubLeft:
                reply = None
            finally:
                session.busy = False
                if type(message) is not Hello:  # a connection is not work: stop() right after run() need not wait
                    self.last_active = time.monotonic()
            with session.reply_lock:
                if session.abandoned:
                    LOGGER.warning(
                        "Model %s: instance %s finished a batch after its stub had stopped waiting (execution timeout, "
                        "or the call was failed as stuck); the result is discarded.",
                        self._config.model_name,
                        self._name,
                    )
                    return
                if reply is None:  # the stub went away in the middle of a stream
                    return
                try:
                    channel.send(reply)
                except OSError:
                    return

    def _handle(self, session: Session, message: Message) -> Message:
        if type(message) is Infer:
            return self._infer_on(session, message)
        if type(message) is Hello:
            self._hello(session, message)
            return _messages.Welcome(self._name)
        if type(message) is _messages.Bye:
            session.connected = False
            session.said_bye = True
            return Ok(None, [])
        return Error(f"pytriton: unexpected message kind {message.KIND} (NEXT without a stream?)")

    def _hello(self, session: Session, message: Hello) -> None:
        session.stub_pid, session.generation = message.stub_pid, message.generation
        if not isinstance(session.sock, _zmq_channel.Connection):  # a stub on this host (not the TCP transport)
            _stub_watch.WATCH.watch(session, session.stub_pid, f"model {self._config.model_name} ({self._name})")
        fields = _proc_stat(session.stub_pid)
        session.server_pid = int(fields[1]) if len(fields) > 1 else 0
        session.connected = True
        hung: List[Session] = []
        with self._sessions_lock:
            for other in self._sessions:
                # The same stub process connecting again gave up on its previous connection.
                if other is not session and other.stub_pid == session.stub_pid and not other.abandoned:
                    other.abandoned = True
                    if other.busy:
                        hung.append(other)
        if hung:
            self._end_hung_calls(hung)
        LOGGER.debug(
            "Worker %s: stub pid %s (generation %s) connected", self._name, session.stub_pid, session.generation
        )

    def _end_hung_calls(
        self,
        sessions: List[Session],
        why: str = "the stub stopped waiting for the inference callable (execution timeout)",
        replace: bool = True,
    ) -> None:
        """Calls whose stub gave up on them (execution timeout): tell them, then end them if possible.

        Their requests read as cancelled (``Request.is_cancelled()``), so a cooperative callable
        stops. A worker process (``on_hung_call``) is then replaced as a whole. In a thread instance
        :class:`CallAbandoned` is raised inside each hung call: Python delivers it within a few
        bytecodes, so pure-Python code ends at once, while a call blocked in native code (a sleep, a
        lock, I/O, a long numpy or GPU operation) ends when that returns; its thread lives until then.
        On CPython 3.13 it can skip the ``except``/``finally`` around a loop in the same function
        (docs/cancellation.md); the call ends all the same.
        """
        for session in sessions:
            if session.probe is not None:
                session.probe.cancel_all()
        if self._on_hung_call is not None and replace:
            LOGGER.warning(
                "Model %s: instance %s: %s; its worker process is replaced.", self._config.model_name, self._name, why
            )
            self._on_hung_call()
            return
        interrupted = [session for session in sessions if session.interrupt()]
        LOGGER.warning(
            "Model %s: instance %s: %s; its requests read as cancelled and CallAbandoned was raised in %d running "
            "call(s); a call blocked in native code keeps its thread until that returns.",
            self._config.model_name,
            self._name,
            why,
            len(interrupted),
        )

    def fail_stuck_call(self, text: str, older_than_s: float = 0.0) -> bool:
        """Answer the batch in the callable now with ``Error(text)``, and free the instance; False if none was.

        Only a call that has run for ``older_than_s`` is failed: one that began after the watch saw the
        stuck call end is left alone.

        For pytriton/_serving/unresponsive.py, when every instance of the model has been in one call too long.
        The stub gets the error as the batch's reply (``text`` is a retryable one, HTTP 503), then the
        connection is shut down, so that the stub's next send fails before anything was delivered
        and it connects again (a new session, served by a new thread). The stuck call is then handled
        as after an execution timeout in a thread instance (:meth:`_end_hung_calls`), in a worker process
        too: its requests read as cancelled and CallAbandoned is raised in it (a call blocked in native
        code keeps its thread until that returns). Whatever it returns later is discarded (``_serve``
        sees ``abandoned``).
        """
        with self._sessions_lock:
            candidates = [s for s in self._sessions if s.busy and not s.abandoned and s.sock is not None]
        now = time.perf_counter()
        candidates = [s for s in candidates if s.call_started and now - s.call_started >= older_than_s]
        failed: List[Session] = []
        for session in candidates:
            probe = session.probe
            # No ASK of the callable may be on the connection while the error goes out.
            held = probe.lock.acquire(timeout=1.0) if probe is not None else False
            try:
                if probe is not None:
                    probe.cancel_all()
                with session.reply_lock:
                    if not session.busy or session.abandoned or session.channel is None or not session.call_started:
                        continue  # it answered meanwhile
                    session.abandoned = True
                    sock = session.sock
                    assert sock is not None
                    if isinstance(sock, socket.socket):
                        # Reading ends first: the stub's next send fails from now on (EPIPE), before it even
                        # has the error, so no batch can be sent into a connection that then closes.
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RD)
                    with contextlib.suppress(OSError):
                        session.channel.send(Error(text))
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    failed.append(session)
            finally:
                if held and probe is not None:
                    probe.lock.release()
        if failed:
            # Not replaced, even in a worker process: the stub may already be connecting again, and a
            # process that ended now could take that new connection down with it (a failed request).
            self._end_hung_calls(failed, "its call was failed as stuck (PYTRITON_UNRESPONSIVE_AFTER_S)", replace=False)
        return bool(failed)

    # -- one batch -----------------------------------------------------------------------
    def _direct_session(self) -> Session:
        """A session with no connection, for benchmarks and tests that drive one message at a time."""
        if self._direct is None:
            self._direct = Session(0, None, self._shm_prefix)
        return self._direct

    def _decode(self, message: Infer, views: List[npt.NDArray[np.generic]]) -> List[Request]:
        return self._decode_on(self._direct_session(), message, views)

    def _infer(self, message: Infer, channel: _wire.Channel[Message]) -> Message:
        session = self._direct_session()
        session.channel = channel
        return self._infer_on(session, message)

    def _encode(
        self, result: object, n_requests: int, requests: Optional[List[Request]] = None
    ) -> Tuple[Optional[str], List[Tensors]]:
        return self._encode_on(self._direct_session(), result, n_requests, requests)

    def _decode_on(self, session: Session, message: Infer, views: List[npt.NDArray[np.generic]]) -> List[Request]:
        """Requests from an INFER message.

        Small inputs are copied out of the message. Large ones are views into the stub's arena
        (no copy); their base arrays are collected in ``views`` so that :meth:`_infer_on` can
        tell whether the callable kept any of them (or any view of them).
        """
        segment = message.segment
        buffer = session.reader.attach(segment) if segment else None
        requests = []
        read_tensor, inline, string = _tensors.read_tensor, _messages.INLINE, _messages.BYTES
        for entry in message.entries:
            data = {}
            for meta in entry.tensors:
                zero_copy = meta.place != inline and meta.dtype != string
                array = read_tensor(buffer, meta, copy=not zero_copy)
                if zero_copy:
                    # numpy points every view derived from ``array`` (and ``array`` itself) at this
                    # base, so its reference count shows whether the callable kept any of them.
                    views.append(array.base if array.base is not None else array)
                data[meta.name] = array
            parameters, requested, sequence, timeout_s = (
                entry.parameters,
                entry.requested,
                entry.sequence,
                entry.timeout_s,
            )
            requests.append(_wire_request(data, parameters, requested, timeout_s or None, None, 0, sequence))
        if session.channel is not None:  # Request.is_cancelled() asks the stub over this connection
            probe = session.probe = CancelProbe(session.channel, len(requests))
            for index, request in enumerate(requests):
                request._probe = probe
                request._index = index
        if message.trace is not None:  # Triton traces this batch (OpenTelemetry mode): Request.span
            session.spans = _tracing.start_spans(
                message.trace, requests, self._config.model_name, self._config.model_version
            )
        return requests

    def _encode_on(
        self, session: Session, result: object, n_requests: int, requests: Optional[List[Request]] = None
    ) -> Tuple[Optional[str], List[Tensors]]:
        """Check the outputs (requested ones must be present when ``requests`` is given) and write them.

        Returns the segment and the results of an OK or CHUNK reply.
        """
        requested = None if requests is None else [request.requested_output_names for request in requests]
        groups = self._checker.check(result, n_requests, requested)
        return _tensors.write_tensors(session.arena, groups, session.reader)

    def _failure(self, exc: BaseException) -> Error:
        """Log a failed batch with its traceback and build the error reply (never raises)."""
        if isinstance(exc, CallAbandoned):  # already logged when raised (_end_hung_calls); nobody waits
            return Error(error_text(exc))
        try:
            LOGGER.error("Model %s: inference callable failed", self._config.model_name, exc_info=exc)
        except Exception:  # noqa: BLE001 - e.g. a handler that cannot format the exception
            LOGGER.error("Model %s: inference callable failed with %s", self._config.model_name, type(exc).__name__)
        if isinstance(exc, PyTritonUnrecoverableError):
            self._on_unrecoverable(exc)
        return Error(error_text(exc))

    def _infer_on(self, session: Session, message: Infer) -> FinalReply:
        """Run one batch; its final reply carries the retire flag (``Ok.retire``).

        Large inputs are handed to the callable as views into the stub's arena. If the callable
        still holds any of them once it is done (stored them, or a view of them), the stub must
        not overwrite that memory: it moves to a fresh segment and the kept arrays stay valid.
        """
        views: List[npt.NDArray[np.generic]] = []
        session.call_started = 0.0
        try:
            if message.trace is not None:  # Triton traces this batch (OpenTelemetry mode)
                reply = self._call_traced(session, message, views)
            else:
                reply = self._call_callable(session, message, views)
        finally:
            if session.batch_token is not None:
                CURRENT_BATCH.reset(session.batch_token)
                session.batch_token = None
            if session.probe is not None:  # before the final reply: no ASK may follow it
                session.probe.close()
                session.probe = None
        retire = bool(views) and any(sys.getrefcount(views[index]) > 2 for index in range(len(views)))
        if self._metrics and session.call_started:
            return reply.settled(retire, session.call_ended - session.call_started)
        return reply.settled(retire, None) if retire else reply

    def _call_traced(self, session: Session, message: Infer, views: List[npt.NDArray[np.generic]]) -> FinalReply:
        """:meth:`_call_callable` for a traced batch: its spans (opened by ``_decode_on`` as
        ``Request.span``) end once the final reply is built, or when the stub left mid-stream."""
        reply: Optional[FinalReply] = None
        try:
            reply = self._call_callable(session, message, views)
            return reply
        finally:
            if session.spans is not None:
                spans, session.spans = session.spans, None
                _tracing.end_spans(spans, reply)

    def _call_callable(self, session: Session, message: Infer, views: List[npt.NDArray[np.generic]]) -> FinalReply:
        # Every BaseException (SystemExit, KeyboardInterrupt, GeneratorExit, ...) raised by the
        # callable fails this batch only: this thread belongs to pytriton, not to the callable, and
        # a real Ctrl-C is delivered to the main thread, never here.
        try:
            requests = self._decode_on(session, message, views)
            session.batch_token = CURRENT_BATCH.set(requests)  # for pipeline handles (pytriton.pipeline)
            session.call_started = time.perf_counter()
            session.in_callable = True
            try:
                result = self._infer_func(requests)
                # A plain list is by far the common answer: skip the inspect calls for it (each costs a
                # few microseconds right after the thread wakes up, see docs/performance.md).
                if type(result) is not list and inspect.iscoroutine(result):
                    result = self._run_async(session, result)
            finally:
                session.leave_callable()
        except BaseException as exc:  # noqa: BLE001
            session.in_callable = False
            session.call_ended = time.perf_counter()
            return self._failure(exc)
        session.call_ended = time.perf_counter()  # a generator: once it finished, below
        streaming = type(result) is not list and (inspect.isgenerator(result) or inspect.isasyncgen(result))
        if streaming and not self._decoupled:
            self._close_stream(session, result)
            return self._failure(
                PyTritonRuntimeError(
                    f"Model {self._config.model_name!r} returned a generator but is not decoupled; "
                    "bind it with ModelConfig(decoupled=True) to stream responses."
                )
            )
        if not self._decoupled:
            try:
                return Ok(*self._encode_on(session, result, len(requests), requests))
            except BaseException as exc:  # noqa: BLE001
                return self._failure(exc)
        if not streaming:
            return self._stream(session, iter([result]), len(requests))
        try:
            return self._stream(session, result, len(requests))
        finally:
            session.call_ended = time.perf_counter()
            # Run the generator's clean-up (finally blocks, context managers) now, on this thread,
            # whether it finished, failed, was cancelled or lost its stub.
            self._close_stream(session, result)

    @staticmethod
    def _run_async(session: Session, awaitable: Awaitable[object]) -> object:
        try:
            return session.event_loop().run_until_complete(awaitable)
        except Exception:
            raise
        except BaseException:
            session.drop_loop()  # asyncio re-raises SystemExit/KeyboardInterrupt out of a loop it then abandons
            raise

    def _close_stream(self, session: Session, stream: Any) -> None:
        """Close a generator or async generator (a no-op once it is exhausted); errors are logged."""
        try:
            if inspect.isasyncgen(stream):
                self._run_async(session, stream.aclose())
            else:
                stream.close()
        except BaseException:  # noqa: BLE001
            LOGGER.exception("Model %s: closing the generator failed", self._config.model_name)

    def _next_chunk(self, session: Session, stream: Any) -> object:
        if inspect.isasyncgen(stream):
            return self._run_async(session, stream.__anext__())
        return next(stream)

    def _stream(self, session: Session, stream: object, n_requests: int) -> FinalReply:
        """Send each yielded result as a CHUNK; returns the final reply (END or ERROR).

        Raises ``StubLeft`` if the stub went away (or stopped waiting) in the middle.

        Chunks small enough to travel inline are sent back to back, up to ``STREAM_WINDOW`` of
        them before the stub acknowledges with NEXT. A chunk that uses the arena must be
        acknowledged before the arena is written again. The stub answers CANCEL instead of NEXT
        when no client wants the rest of the stream; the stream then ends there.
        """
        done: Tuple[Type[BaseException], ...] = (StopIteration, StopAsyncIteration)
        channel = session.channel
        assert channel is not None, "a stream needs the session's channel"
        unacknowledged = 0
        while True:
            try:
                session.in_callable = True
                try:
                    chunk = self._next_chunk(session, stream)
                finally:
                    session.leave_callable()
                reply = Chunk(*self._encode_on(session, chunk, n_requests))
            except done:
                return End()
            except BaseException as exc:  # noqa: BLE001 - fails this stream only, see _call_callable
                return self._failure(exc)
            if session.abandoned:
                raise StubLeft()
            # Under the probe's lock: an is_cancelled() from another thread must not put its question
            # between a chunk and the acknowledgement this thread waits for.
            probe = session.probe
            try:
                with probe.lock if probe is not None else contextlib.nullcontext():
                    channel.send(reply)
                    unacknowledged += 1
                    if not _messages.must_acknowledge(reply, unacknowledged):
                        continue
                    unacknowledged = 0
                    follow_up = channel.recv()
            except (EOFError, OSError):
                raise StubLeft() from None
            if type(follow_up) is _messages.Cancel:
                LOGGER.debug("Model %s: stream cancelled by the client", self._config.model_name)
                return End()
            if type(follow_up) is not _messages.Next:
                return Error(f"pytriton: expected NEXT during a stream, got message kind {follow_up.KIND}")
