"""``InferContext``: the legacy inference API on top of tritonclient and the v2 protocol.

Every request, synchronous or not, becomes a :class:`_Pending` record that a transport completes
once: over HTTP on one of the connection's worker threads, over gRPC in tritonclient's callback
thread, over a gRPC stream in the stream's reader thread (matched to its record by the v2 request
id). ``run`` waits for its record; ``async_run`` leaves it in the context's table until
``get_async_run_results`` takes it out.

Statistics (``get_stat``) are measured on the client: send time is building and encoding the
request, receive time is decoding and shaping the results, total time is from the call to the
shaped results.

Unit test: tests/unit/test_legacy_client.py (``InferContext`` over a fake transport); against a
server: tests/e2e/test_legacy_client.py.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterable, List, Mapping, Optional, Tuple

from pytriton.client._base import ClosesOnExit
from pytriton.client._decoupled import end_stream
from pytriton.client.legacy._errors import InferenceServerException, describe
from pytriton.client.legacy._requests import (
    InferRequestHeader,
    ModelSpec,
    RequestPlan,
    ResultFormat,
    plan_request,
    shape_results,
    tritonclient_objects,
)
from pytriton.client.legacy._transport import Connection

LOGGER = logging.getLogger(__name__)

# Marks a gRPC stream's reader thread with its context, so run() there fails instead of deadlocking.
_STREAM_THREAD = threading.local()

__all__ = ["InferContext", "InferRequestHeader", "ResultFormat"]


class _Pending:
    __slots__ = ("callback", "done", "error", "is_async", "model_version", "plan", "receive_ns", "request_id",
                 "results", "send_ns", "started_ns")  # fmt: skip

    def __init__(self, request_id: int, plan: RequestPlan, is_async: bool, callback: Optional[Callable[..., object]]):
        self.request_id = request_id
        self.plan = plan
        self.is_async = is_async
        self.callback = callback
        self.started_ns = time.perf_counter_ns()
        self.send_ns = 0
        self.receive_ns = 0
        self.done = False
        self.results: Optional[Dict[str, List[object]]] = None
        self.error: Optional[InferenceServerException] = None
        self.model_version: Optional[int] = None


class InferContext(ClosesOnExit):
    """Run inference on one model of one server (see the module docstring for threading).

    The model's configuration is read when the context is created, so an unknown model or version,
    or an unreachable server, fails here. ``model_version=None`` uses the latest version.
    ``http_headers`` (``["Name:Value", ...]``) go with every request: as HTTP headers, and as gRPC
    metadata over gRPC. ``close()`` (or leaving a ``with`` block) releases the connection; requests
    still in flight then fail.
    """

    ResultFormat = ResultFormat

    def __init__(
        self,
        url: str,
        protocol: object,
        model_name: str,
        model_version: Optional[int] = None,
        verbose: bool = False,
        correlation_id: int = 0,
        streaming: bool = False,
        http_headers: Iterable[str] = [],  # noqa: B006 - the legacy signature; never mutated
    ) -> None:
        self._conn = Connection(url, protocol, verbose, http_headers)
        self._model_name = str(model_name)
        self._version = "" if model_version is None else str(int(model_version))
        self._correlation_id = int(correlation_id or 0)
        self._streaming = bool(streaming)
        self._cond = threading.Condition()
        self._next_id = 0
        self._async: Dict[int, _Pending] = {}
        self._ready: Deque[int] = collections.deque()
        self._stream_pending: Dict[int, _Pending] = {}
        self._last: Tuple[Optional[int], Optional[str], Optional[int]] = (None, None, None)
        self._stats = {
            "completed_request_count": 0,
            "cumulative_total_request_time_ns": 0,
            "cumulative_send_time_ns": 0,
            "cumulative_receive_time_ns": 0,
        }
        self._closed = False
        try:
            if self._streaming and not self._conn.is_grpc:
                raise InferenceServerException("streaming is only allowed with the gRPC protocol (ProtocolType.GRPC)")
            what = f"cannot use model '{self._model_name}'" + (f" version {self._version}" if self._version else "")
            extra = {"as_json": True} if self._conn.is_grpc else {}
            config = self._conn.call("get_model_config", self._model_name, self._version, what=what, **extra)
            if self._conn.is_grpc:
                config = config.get("config", {})
            self._model = ModelSpec.from_config(config)
            if self._streaming:
                self._conn.call("start_stream", callback=self._on_stream_response, what="cannot open the stream")
        except BaseException:
            self._conn.close()
            raise

    # -- the legacy API ------------------------------------------------------------------------------
    def run(
        self,
        inputs: Mapping[str, object],
        outputs: Mapping[str, object],
        batch_size: int = 1,
        flags: int = 0,
        corr_id: int = 0,
    ) -> Dict[str, List[Any]]:
        """Infer and wait: ``{output: [value per batch entry]}`` (arrays for RAW, lists of
        ``(index, value, label)`` for ``(CLASS, k)``). Raises InferenceServerException."""
        pending = self._start(inputs, outputs, batch_size, flags, corr_id, is_async=False, callback=None)
        with self._cond:
            while not pending.done:
                self._cond.wait()
        self._finish(pending)
        assert pending.results is not None
        return pending.results

    def async_run(
        self,
        callback: Optional[Callable[[InferContext, int], object]],
        inputs: Mapping[str, object],
        outputs: Mapping[str, object],
        batch_size: int = 1,
        flags: int = 0,
        corr_id: int = 0,
    ) -> int:
        """Send a request and return at once; ``callback(context, request_id)`` runs when it
        completes (on a client thread: keep it short). Returns the request id as well, so a
        ``None`` callback with ``get_ready_async_request`` also works."""
        pending = self._start(inputs, outputs, batch_size, flags, corr_id, is_async=True, callback=callback)
        return pending.request_id

    def get_async_run_results(self, request_id: int, wait: bool = True) -> Optional[Dict[str, List[Any]]]:
        """The results of an ``async_run`` request, which is then forgotten. With ``wait=False``
        returns None if it is still in flight. Raises for an unknown id or a failed request."""
        with self._cond:
            self._check_open()
            pending = self._async.get(request_id)
            if pending is None:
                raise InferenceServerException(
                    f"request id {request_id} is not an outstanding async_run request of this context",
                    request_id=int(request_id) if isinstance(request_id, int) else 0,
                )
            while not pending.done:
                if not wait:
                    return None
                self._cond.wait()
            del self._async[request_id]
            if request_id in self._ready:
                self._ready.remove(request_id)
        self._finish(pending)
        return pending.results

    def get_ready_async_request(self, wait: bool = True) -> Optional[int]:
        """The id of a completed ``async_run`` request not yet returned by this method (oldest
        completion first). With ``wait=False`` returns None if none is complete. Raises if no
        async request is outstanding."""
        with self._cond:
            self._check_open()
            while not self._ready:
                if not self._async:
                    raise InferenceServerException("no async_run request is outstanding")
                if not wait:
                    return None
                self._cond.wait()
            return self._ready.popleft()

    def get_last_request_id(self) -> Optional[int]:
        """Id of the most recent request whose results were returned, None if it failed or none ran."""
        self._check_open()
        return self._last[0]

    def get_last_request_model_name(self) -> Optional[str]:
        self._check_open()
        return self._last[1]

    def get_last_request_model_version(self) -> Optional[int]:
        self._check_open()
        return self._last[2]

    def get_stat(self) -> Dict[str, int]:
        """Client-side counters: ``completed_request_count`` and the cumulative total, send and
        receive times in nanoseconds (see the module docstring)."""
        with self._cond:
            self._check_open()
            return dict(self._stats)

    def correlation_id(self) -> int:
        """The correlation id requests use now (0: none)."""
        self._check_open()
        return self._correlation_id

    def close(self) -> None:
        """Release the connection; requests in flight fail. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            idle = not self._stream_pending
        if self._streaming:
            # Cancelled only with requests in flight: cancelling a stream whose last response is
            # still being written can keep the model from ever unloading (client/_decoupled.py).
            end_stream(self._conn.grpc_client, graceful=idle)
        self._conn.close()
        with self._cond:
            for pending in list(self._stream_pending.values()) + list(self._async.values()):
                if not pending.done:
                    pending.error = InferenceServerException(
                        "the context was closed before the request completed", request_id=pending.request_id
                    )
                    pending.done = True
            self._stream_pending.clear()
            self._cond.notify_all()

    # -- internals -----------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise InferenceServerException("the InferContext is closed: create a new one")

    def _start(
        self,
        inputs: object,
        outputs: object,
        batch_size: int,
        flags: int,
        corr_id: int,
        is_async: bool,
        callback: Optional[Callable[..., object]],
    ) -> _Pending:
        with self._cond:
            self._check_open()
            self._next_id += 1
            request_id = self._next_id
            if corr_id:
                # A non-zero id replaces the context's id for this and every later request.
                self._correlation_id = int(corr_id)
            correlation = self._correlation_id
        started = time.perf_counter_ns()
        try:
            plan = plan_request(self._model, inputs, outputs, batch_size, flags, correlation)
            infer_inputs, requested = tritonclient_objects(plan, self._conn.is_grpc)
        except InferenceServerException as error:
            self._last = (None, None, None)
            raise InferenceServerException(error.message(), request_id=request_id) from error
        except Exception as error:
            self._last = (None, None, None)
            raise InferenceServerException(f"bad request: {describe(error)}", request_id=request_id) from error
        pending = _Pending(request_id, plan, is_async, callback)
        pending.started_ns = started
        pending.send_ns = time.perf_counter_ns() - started
        kwargs: Mapping[str, object] = {
            "model_name": self._model_name,
            "inputs": infer_inputs,
            "model_version": self._version,
            "outputs": requested,
            "request_id": str(request_id),
            "sequence_id": plan.sequence_id,
            "sequence_start": plan.sequence_start,
            "sequence_end": plan.sequence_end,
        }
        with self._cond:
            if is_async:
                self._async[request_id] = pending
            if self._streaming:
                self._stream_pending[request_id] = pending

        def done(result: object, error: Optional[BaseException]) -> None:
            self._complete(pending, result, error)

        try:
            if self._streaming:
                if getattr(_STREAM_THREAD, "context", None) is self and not is_async:
                    raise InferenceServerException(
                        "run() on a streaming context cannot wait inside this context's own async_run "
                        "callback (the stream delivers responses on that thread): use async_run there"
                    )
                self._conn.grpc_client.async_stream_infer(**kwargs)
            else:
                headers = {"headers": dict(self._conn.headers)} if self._conn.headers else {}
                if self._conn.is_grpc and not is_async:
                    # Blocking call on the caller's thread: waiting for a gRPC callback here could
                    # deadlock when run() is called from inside an async_run callback.
                    done(self._conn.grpc_client.infer(**kwargs, **headers), None)
                elif self._conn.is_grpc:
                    self._conn.submit(
                        lambda client: client.async_infer(callback=done, **kwargs, **headers), _on_error(done)
                    )
                else:
                    self._conn.submit(lambda client: client.infer(**kwargs, **headers), done)
        except BaseException as error:
            with self._cond:
                self._stream_pending.pop(request_id, None)
            self._complete(pending, None, error)
        return pending

    def _complete(self, pending: _Pending, result: Any, error: Optional[BaseException]) -> None:
        """Record the outcome once; runs on whatever thread the transport completes on."""
        failure: Optional[InferenceServerException] = None
        results = None
        version: Optional[int] = None
        received = time.perf_counter_ns()
        if error is None and result is None:
            error = RuntimeError("the server sent no response")
        if error is not None:
            failure = InferenceServerException(describe(error), server_id=self._conn.url, request_id=pending.request_id)
            failure.__cause__ = error
        else:
            try:
                results = shape_results(pending.plan, result, self._conn.is_grpc)
                response = result.get_response()
                raw_version = response.get("model_version") if isinstance(response, dict) else response.model_version
                version = int(raw_version) if isinstance(raw_version, (int, str)) and raw_version != "" else None
            except Exception as problem:
                failure = InferenceServerException(
                    f"cannot read the response: {describe(problem)}",
                    server_id=self._conn.url,
                    request_id=pending.request_id,
                )
                failure.__cause__ = problem
        finished = time.perf_counter_ns()
        with self._cond:
            if pending.done:  # already failed by close()
                return
            pending.results, pending.error, pending.model_version = results, failure, version
            pending.receive_ns = finished - received
            pending.done = True
            if failure is None:
                self._stats["completed_request_count"] += 1
                self._stats["cumulative_total_request_time_ns"] += finished - pending.started_ns
                self._stats["cumulative_send_time_ns"] += pending.send_ns
                self._stats["cumulative_receive_time_ns"] += pending.receive_ns
            if pending.is_async and pending.callback is None and pending.request_id in self._async:
                self._ready.append(pending.request_id)
            self._cond.notify_all()
        if pending.is_async and pending.callback is not None:
            try:
                pending.callback(self, pending.request_id)
            except Exception:  # a failing user callback must not break the transport's thread
                LOGGER.exception("async_run callback for request %d raised", pending.request_id)
            # Ready only once its callback has run, so get_ready_async_request never overtakes it.
            with self._cond:
                if pending.request_id in self._async:
                    self._ready.append(pending.request_id)
                    self._cond.notify_all()

    def _finish(self, pending: _Pending) -> None:
        """Hand over a completed request: remember it as the last one, or raise its error."""
        if pending.error is not None:
            self._last = (None, None, None)
            raise pending.error
        self._last = (pending.request_id, self._model_name, pending.model_version)

    def _on_stream_response(self, result: Any, error: Optional[BaseException]) -> None:
        _STREAM_THREAD.context = self
        with self._cond:
            pending = None
            if result is not None:
                try:
                    pending = self._stream_pending.pop(int(result.get_response().id), None)
                except (TypeError, ValueError):
                    pending = None
            elif self._stream_pending:
                # A stream error carries no request id: it belongs to the oldest request in flight.
                pending = self._stream_pending.pop(min(self._stream_pending))
        if pending is None:
            LOGGER.warning("stream response for no known request (error: %s)", error)
            return
        self._complete(pending, result, error)


def _on_error(
    done: Callable[[object, Optional[BaseException]], None],
) -> Callable[[object, Optional[BaseException]], None]:
    """For gRPC, the submitted work only starts the call: report only a failure to start it."""

    def on_submitted(_: object, error: Optional[BaseException]) -> None:
        if error is not None:
            done(None, error)

    return on_submitted
