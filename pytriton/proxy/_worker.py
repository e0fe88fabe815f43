"""User-side end of the proxy: one worker thread per model instance.

Threading model: each instance slot of a bound model gets a dedicated thread listening on its own
Unix socket, so a batch goes from the stub to the callable with no thread hop in between. Instances of
one model therefore run concurrently as threads of the user's process and share its GIL; work that
releases the GIL (numpy, PyTorch, I/O) runs in parallel, pure-Python work does not. ``async``
callables run on a private event loop owned by the worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

import numpy as np

from pytriton.exceptions import PyTritonRuntimeError, PyTritonUnrecoverableError
from pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig
from pytriton.proxy import _wire
from pytriton.proxy.types import Request

LOGGER = logging.getLogger("pytriton.proxy")


_ALLOWED_KINDS = frozenset("biufSUO")


def error_text(exc: BaseException) -> str:
    """What a client sees for a failed request: the exception type and message, no traceback."""
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


class OutputChecker:
    """Validates what a callable returned before it is written to shared memory."""

    def __init__(self, config: TritonModelConfig, strict: bool):
        self._model = config.model_name
        self._outputs: Dict[str, TensorSpec] = {spec.name: spec for spec in config.outputs}
        self._batching = config.batching
        self._strict = strict

    def check(self, result: Any, n_requests: int) -> List[List[Tuple[str, np.ndarray]]]:
        """Return the outputs as ``[(name, array), ...]`` per request or raise ``PyTritonRuntimeError``."""
        model = self._model
        if not isinstance(result, (list, tuple)):
            raise PyTritonRuntimeError(
                f"Model {model!r}: the inference callable returned {type(result).__name__}; it must return a list "
                f"with one dict of output arrays per request ({n_requests} here)."
            )
        if len(result) != n_requests:
            raise PyTritonRuntimeError(
                f"Model {model!r}: the inference callable returned {len(result)} results for {n_requests} requests; "
                "return exactly one dict of outputs per request, in request order."
            )
        groups = []
        outputs_spec = self._outputs
        strict = self._strict
        for index, outputs in enumerate(result):
            if type(outputs) is not dict and not isinstance(outputs, dict):
                raise PyTritonRuntimeError(
                    f"Model {model!r}: result {index} is {type(outputs).__name__}, expected a dict of output arrays."
                )
            group = []
            for name, value in outputs.items():
                # Fast path: a declared output holding a plain ndarray of a carried dtype.
                if (
                    not strict
                    and type(value) is np.ndarray
                    and name in outputs_spec
                    and value.dtype.kind in _ALLOWED_KINDS
                ):
                    group.append((name, value))
                else:
                    group.append((name, self._check_array(index, name, value)))
            groups.append(group)
        return groups

    def _check_array(self, index: int, name: Any, value: Any) -> np.ndarray:
        model = self._model
        spec = self._outputs.get(name)
        if spec is None:
            raise PyTritonRuntimeError(
                f"Model {model!r}: result {index} has output {name!r}, which is not among the declared outputs "
                f"{sorted(self._outputs)}."
            )
        if isinstance(value, np.generic):
            value = np.asarray(value)
        if not isinstance(value, np.ndarray):
            raise PyTritonRuntimeError(
                f"Model {model!r}: output {name!r} of result {index} is {type(value).__name__}, expected numpy.ndarray."
            )
        if value.dtype.kind not in _ALLOWED_KINDS:
            raise PyTritonRuntimeError(
                f"Model {model!r}: output {name!r} of result {index} has dtype {value.dtype}, which Triton cannot carry."
            )
        if self._strict:
            self._check_strict(index, spec, value)
        return value

    def _check_strict(self, index: int, spec: TensorSpec, value: np.ndarray) -> None:
        problem = spec.mismatch(value, batch_axis=self._batching)
        if problem:
            raise PyTritonRuntimeError(f"Model {self._model!r}: output {spec.name!r} of result {index} {problem}.")


class InstanceWorker:
    """Serves one instance slot of a bound model on a dedicated thread.

    Lifetime: :meth:`start` binds the socket and starts the thread; :meth:`stop` ends the thread and
    releases the socket and the shared-memory arena.
    """

    def __init__(
        self,
        *,
        path: str,
        infer_func: Callable[..., Any],
        config: TritonModelConfig,
        strict: bool,
        shm_prefix: str,
        on_unrecoverable: Callable[[BaseException], None],
        name: str,
        poll_s: float = 0.0,
    ):
        self._path = path
        self._infer_func = infer_func
        self._config = config
        self._decoupled = config.decoupled
        self._checker = OutputChecker(config, strict)
        self._arena = _wire.Arena(shm_prefix)
        self._reader = _wire.ArenaReader()
        self._on_unrecoverable = on_unrecoverable
        self._name = name
        self._poll_s = poll_s  # how long to poll for the next message before sleeping (0: never)
        self._thread: Optional[threading.Thread] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._listener: Optional[socket.socket] = None
        self._connection: Optional[socket.socket] = None
        self._stopping = False
        self.connected = False
        self.busy = False
        self.last_active = 0.0  # time.monotonic() when the last batch finished

    def start(self) -> None:
        """Listen on the slot's socket and start serving."""
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self._path)
        self._listener.listen(4)
        self._thread = threading.Thread(target=self._run, name=f"pytriton-{self._name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (after the batch in progress, if any) and free resources. Idempotent."""
        if self._thread is None:
            return
        self._stopping = True
        # shutdown() wakes the thread from a blocking accept() or recv() at once.
        for sock in (self._listener, self._connection):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            LOGGER.warning("Worker %s is still running its inference callable; leaving it behind.", self._name)
            return
        self._thread = None

    def _run(self) -> None:
        """Serve one stub connection at a time; a new stub of this slot connects after the old one exits."""
        assert self._listener is not None
        try:
            while not self._stopping:
                try:
                    connection, _ = self._listener.accept()
                except OSError:
                    return
                self._connection = connection
                try:
                    self._serve(connection)
                finally:
                    self._connection = None
                    self.connected = False
                    connection.close()
        except Exception:
            LOGGER.exception("Worker %s crashed", self._name)
        finally:
            self._listener.close()
            self._arena.close()
            self._reader.close()
            if self._loop is not None:
                self._loop.close()

    def _serve(self, connection: socket.socket) -> None:
        channel = _wire.Channel(connection, poll_s=self._poll_s)
        while not self._stopping:
            try:
                message = channel.recv()
            except (EOFError, OSError):
                return
            self.busy = True
            try:
                reply = self._handle(message, channel)
            finally:
                self.busy = False
                self.last_active = time.monotonic()
            if reply is None:  # the stub went away in the middle of a stream
                return
            try:
                channel.send(reply)
            except OSError:
                return

    def _handle(self, message: Any, channel: _wire.Channel) -> Any:
        kind = message[0]
        if kind == _wire.INFER:
            return self._infer(message, channel)
        if kind == _wire.HELLO:
            # A new stub process took this slot: it cannot map segments its predecessor unlinked.
            self._arena.close()
            self._reader.close()
            self.connected = True
            LOGGER.debug("Worker %s: stub pid %s connected", self._name, message[1])
            return (_wire.WELCOME, self._name)
        if kind == _wire.BYE:
            self.connected = False
            return (_wire.OK, None, [])
        return (_wire.ERROR, f"pytriton: unexpected message kind {kind} (NEXT without a stream?)")

    def _decode(self, message: Any, views: List[np.ndarray]) -> List[Request]:
        """Requests from an INFER message.

        Small inputs are copied out of the message. Large ones are views into the stub's arena
        (no copy); their base arrays are collected in ``views`` so that :meth:`_infer` can tell
        whether the callable kept any of them (or any view of them).
        """
        segment, entries = message[1], message[2]
        buffer = self._reader.attach(segment) if segment else None
        requests = []
        for metas, parameters, requested in entries:
            data = {}
            for meta in metas:
                zero_copy = type(meta[3]) is not bytes and meta[1] != _wire.BYTES
                array = _wire.read_tensor(buffer, meta, copy=not zero_copy)
                if zero_copy:
                    # numpy points every view derived from ``array`` (and ``array`` itself) at this
                    # base, so its reference count shows whether the callable kept any of them.
                    views.append(array.base if array.base is not None else array)
                data[meta[0]] = array
            requests.append(Request(data, parameters, requested))
        return requests

    def _encode(self, result: Any, n_requests: int, kind: int) -> Any:
        groups = self._checker.check(result, n_requests)
        segment, metas = _wire.write_tensors(self._arena, groups, self._reader)
        return (kind, segment, metas)

    def _failure(self, exc: BaseException) -> Any:
        LOGGER.error("Model %s: inference callable failed", self._config.model_name, exc_info=exc)
        if isinstance(exc, PyTritonUnrecoverableError):
            self._on_unrecoverable(exc)
        return (_wire.ERROR, error_text(exc))

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    def _infer(self, message: Any, channel: _wire.Channel) -> Any:
        """Run one batch; the final reply carries a trailing flag telling the stub to retire its arena.

        Large inputs are handed to the callable as views into the stub's arena. If the callable
        still holds any of them once it is done (stored them, or a view of them), the stub must
        not overwrite that memory: it moves to a fresh segment and the kept arrays stay valid.
        """
        views: List[np.ndarray] = []
        reply = self._call_callable(message, channel, views)
        if reply is None:
            return None
        retire = any(sys.getrefcount(views[index]) > 2 for index in range(len(views)))
        return (*reply, retire)

    def _call_callable(self, message: Any, channel: _wire.Channel, views: List[np.ndarray]) -> Any:
        try:
            requests = self._decode(message, views)
            result = self._infer_func(requests)
            # A plain list is by far the common answer: skip the inspect calls for it (each costs a
            # few microseconds right after the thread wakes up, see docs/performance.md).
            if type(result) is not list and inspect.iscoroutine(result):
                result = self._event_loop().run_until_complete(result)
        except Exception as exc:
            return self._failure(exc)
        streaming = type(result) is not list and (inspect.isgenerator(result) or inspect.isasyncgen(result))
        if streaming and not self._decoupled:
            self._close_stream(result)
            return self._failure(
                PyTritonRuntimeError(
                    f"Model {self._config.model_name!r} returned a generator but is not decoupled; "
                    "bind it with ModelConfig(decoupled=True) to stream responses."
                )
            )
        if not self._decoupled:
            try:
                return self._encode(result, len(requests), _wire.OK)
            except Exception as exc:
                return self._failure(exc)
        if not streaming:
            return self._stream(iter([result]), len(requests), channel)
        try:
            return self._stream(result, len(requests), channel)
        finally:
            # Run the generator's clean-up (finally blocks, context managers) now, on this thread,
            # whether it finished, failed, was cancelled or lost its stub.
            self._close_stream(result)

    def _close_stream(self, stream: Any) -> None:
        """Close a generator or async generator (a no-op once it is exhausted); errors are logged."""
        try:
            if inspect.isasyncgen(stream):
                self._event_loop().run_until_complete(stream.aclose())
            else:
                stream.close()
        except Exception:
            LOGGER.exception("Model %s: closing the generator failed", self._config.model_name)

    def _next_chunk(self, stream: Any) -> Any:
        if inspect.isasyncgen(stream):
            return self._event_loop().run_until_complete(stream.__anext__())
        return next(stream)

    def _stream(self, stream: Any, n_requests: int, channel: _wire.Channel) -> Any:
        """Send each yielded result as a CHUNK; returns the final reply (END or ERROR), None if the stub left.

        Chunks small enough to travel inline are sent back to back, up to ``STREAM_WINDOW`` of
        them before the stub acknowledges with NEXT. A chunk that uses the arena must be
        acknowledged before the arena is written again. The stub answers CANCEL instead of NEXT
        when no client wants the rest of the stream; the stream then ends there.
        """
        done: Tuple[Type[BaseException], ...] = (StopIteration, StopAsyncIteration)
        unacknowledged = 0
        while True:
            try:
                chunk = self._next_chunk(stream)
                reply = self._encode(chunk, n_requests, _wire.CHUNK)
            except done:
                return (_wire.END,)
            except Exception as exc:
                return self._failure(exc)
            try:
                channel.send(reply)
                unacknowledged += 1
                if reply[1] is None and unacknowledged < _wire.STREAM_WINDOW:
                    continue
                unacknowledged = 0
                follow_up = channel.recv()
            except (EOFError, OSError):
                return None
            if follow_up[0] == _wire.CANCEL:
                LOGGER.debug("Model %s: stream cancelled by the client", self._config.model_name)
                return (_wire.END,)
            if follow_up[0] != _wire.NEXT:
                return (_wire.ERROR, f"pytriton: expected NEXT during a stream, got message kind {follow_up[0]}")
