"""Streaming clients for decoupled models: gRPC bidirectional streaming, or HTTP server-sent events.

Over ``grpc://`` a stream is a gRPC bidirectional stream; over ``http://`` it is Triton's
``generate_stream`` endpoint (see ``_sse``), which carries one sample per request (a batch axis of
1 for batching models) and JSON-encoded values.

Each call returns a generator (or async generator) that yields one dict of outputs per response
the model sends, and ends when the server marks the stream complete. An error response raises
``PyTritonClientInferenceServerError`` with the server's message.

Timeouts (as in NVIDIA PyTriton 0.7): ``init_timeout_s`` bounds waiting for the model and reading
its config. On :class:`DecoupledModelClient` ``inference_timeout_s`` does not bound a stream: a
model may take as long as it needs between responses, and the stream ends when the model ends it,
fails, or the caller leaves the loop or calls :meth:`DecoupledModelClient.close` (from any thread).
On :class:`AsyncioDecoupledModelClient` ``inference_timeout_s`` bounds each wait for the next
response.

Unit test: tests/unit/test_client_core.py (both streaming clients on a fake gRPC stream: responses,
errors, timeouts).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Generator,
    Generic,
    Iterator,
    NamedTuple,
    Optional,
    Tuple,
    TypeVar,
)

import numpy as np
import numpy.typing as npt

from pytriton.client._clients import AsyncioModelClient, ModelClient
from pytriton.client._core import check_parameters, map_error
from pytriton.client._drivers import run_sync
from pytriton.client._sse import HttpStream, decode_event, encode_request
from pytriton.client.auth import create_auth_headers, grpc_metadata
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientError,
    PyTritonClientInferenceServerError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.model_config.triton_model_config import TritonModelConfig

_Event = Tuple[Any, Any]  # (result, error) as tritonclient's stream callback receives them
_Outputs = Dict[str, npt.NDArray[np.generic]]


def _is_final(result: Any) -> bool:
    parameter = result.get_response().parameters.get("triton_final_response")
    return bool(parameter is not None and parameter.bool_param)


def _has_outputs(result: Any) -> bool:
    return len(result.get_response().outputs) > 0


# How long a half-closed stream may take to end before it is cancelled after all (a peer gone silent).
GRACEFUL_CLOSE_TIMEOUT_S = 5.0


def end_stream(client: Any, graceful: bool) -> None:
    """End ``client``'s gRPC stream: half-close it once the server has ended it, else cancel it.

    Why not always cancel: Triton 2.51's gRPC frontend mishandles a cancellation that arrives while
    the stream's final response is still being written. It then waits for a callback that never
    comes and keeps the stream's state, and with it the model, for good. The model never finishes
    unloading: its stubs keep running, and a server stop waits for them until it is killed.
    The server log shows "Waiting for the callback to retrieve cancellation" for that stream.
    It hit a few percent of the streams closed right after their final response (reproduced with
    ``--log-verbose=1``; tests/e2e/test_remote.py ran into it).
    A half-close (``stop_stream(cancel_requests=False)``) lets the server end the stream itself.
    Since the server has already sent its last response, that takes a round trip. If the server has
    not ended it within :data:`GRACEFUL_CLOSE_TIMEOUT_S` (a connection gone silent), the stream is
    cancelled. A stream the caller left early is cancelled at once, as before, so the model stops
    generating.
    """
    timer = None
    if graceful:
        # tritonclient's stream object and its gRPC call: cancelling that call (a no-op once it has
        # ended) ends the half-close wait, and cannot touch a later stream of the same client.
        call = getattr(getattr(client, "_stream", None), "_response_iterator", None)
        if call is not None:
            timer = threading.Timer(GRACEFUL_CLOSE_TIMEOUT_S, call.cancel)
            timer.daemon = True
            timer.start()
    try:
        client.stop_stream(cancel_requests=not graceful)
    except Exception:  # noqa: BLE001 - the connection may already be closed; the stream is over either way
        pass
    finally:
        if timer is not None:
            timer.cancel()


class _GrpcStream:
    """One gRPC stream of a :class:`DecoupledModelClient`: its events and whether the server has ended it."""

    def __init__(self) -> None:
        self.events: queue.Queue[_Event] = queue.Queue()
        self.ended = threading.Event()  # set by the final response or an error from the server
        self.finished = False  # end_stream was called for it (under the client's _state_lock)

    def on_response(self, result: object, error: object) -> None:
        """tritonclient's stream callback (its stream thread)."""
        self.events.put((result, error))
        if error is not None or _is_final(result):
            self.ended.set()


def check_decoupled(config: TritonModelConfig) -> None:
    """``PyTritonClientInferenceServerError`` (the type the reference raises) for a non-decoupled model."""
    if not config.decoupled:
        raise PyTritonClientInferenceServerError(
            f"Model {config.model_name!r} is not decoupled (it sends one response per request); "
            "use ModelClient / AsyncioModelClient for it."
        )


class _StreamArgs(NamedTuple):
    """What one ``infer_sample``/``infer_batch`` call of a streaming client asked for."""

    inputs: Tuple[object, ...]
    named_inputs: Dict[str, object]
    parameters: Optional[Dict[str, object]]
    headers: Optional[Dict[str, object]]
    batch: bool


_Stream = TypeVar("_Stream")
_Result = TypeVar("_Result")


class _StreamingCalls(Generic[_Stream]):
    """``infer_sample``/``infer_batch`` of both streaming clients: each returns the stream ``_stream`` opens.

    They replace the methods of the plain clients on purpose (hence the ``type: ignore[misc]`` of the
    subclasses): a streaming client's calls return a stream, not one result.
    """

    def _stream(self, call: _StreamArgs) -> _Stream:
        raise NotImplementedError

    def infer_sample(
        self, *inputs: object, parameters: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, Any]] = None,
        **named_inputs: object,
    ) -> _Stream:  # fmt: skip
        """Stream the responses to one sample (batch axis added and removed for batching models)."""
        return self._stream(_StreamArgs(inputs, named_inputs, parameters, headers, batch=False))

    def infer_batch(
        self, *inputs: object, parameters: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, Any]] = None,
        **named_inputs: object,
    ) -> _Stream:  # fmt: skip
        """Stream the responses to one batch (batching models only)."""
        return self._stream(_StreamArgs(inputs, named_inputs, parameters, headers, batch=True))


class DecoupledModelClient(_StreamingCalls[Iterator[_Outputs]], ModelClient):  # type: ignore[misc]
    """Blocking streaming client: ``for outputs in client.infer_sample(...)``.

    A :class:`ModelClient` (``model_config``, ``is_batching_supported``, ``wait_for_model``,
    ``load_model`` ... work as there) whose ``infer_sample``/``infer_batch`` return iterators.
    Lifetime: its connections until :meth:`close` (over HTTP each stream opens its own).

    One stream at a time, as in NVIDIA PyTriton: over gRPC ``infer_*`` sends the request at once
    and the stream stays open until the server ends it (its final response or an error), the caller
    leaves the loop, or :meth:`close`; an ``infer_*`` call while it is open raises
    ``PyTritonClientInferenceServerError``. Over HTTP the request is sent when the loop starts, and
    a second loop while one runs raises the same error. The module docstring says what the
    timeouts bound.
    """

    def _open(self) -> None:
        self._stream_lock = threading.Lock()  # held while an HTTP stream is read
        self._state_lock = threading.Lock()  # guards _grpc_stream
        self._grpc_stream: Optional[_GrpcStream] = None
        self._active_http: Optional[HttpStream] = None
        super()._open()

    def close(self) -> None:
        """Close the connection; a stream in progress (in another thread) raises ``PyTritonClientClosedError``.

        A gRPC stream that nobody reads (its iterator dropped) is ended here: half-closed if the
        server has ended it, else cancelled.
        """
        self.interrupt(PyTritonClientClosedError("The client was closed during the stream."))
        state_lock = getattr(self, "_state_lock", None)
        if state_lock is not None:
            with state_lock:
                if self._grpc_stream is not None:
                    self._end_grpc_stream(self._grpc_stream, graceful=self._grpc_stream.ended.is_set())
        super().close()

    def interrupt(self, error: PyTritonClientError) -> None:
        """Make the stream in progress, if any, raise ``error`` at its next wait. Thread-safe."""
        active = getattr(self, "_grpc_stream", None)
        if active is not None:
            active.events.put((None, error))
        active_http = getattr(self, "_active_http", None)
        if active_http is not None:
            active_http.abort(error)

    def _claim_grpc_stream(self) -> _GrpcStream:
        """A new stream record, or ``PyTritonClientInferenceServerError`` while the previous one is open.

        A previous stream the server has ended but nobody read to its end is closed here first.
        """
        with self._state_lock:
            current = self._grpc_stream
            if current is not None:
                if not current.ended.is_set():
                    raise PyTritonClientInferenceServerError(
                        f"A stream of this client to model {self._core.model_name!r} is still open: read it to "
                        "its end (or leave its loop) before the next infer_sample/infer_batch, or use one "
                        "DecoupledModelClient per concurrent stream."
                    )
                self._end_grpc_stream(current, graceful=True)
            self._grpc_stream = _GrpcStream()
            return self._grpc_stream

    def _end_grpc_stream(self, stream: _GrpcStream, graceful: bool) -> None:
        """End ``stream`` once (half-close or cancel, see :func:`end_stream`); call with ``_state_lock`` held."""
        if not stream.finished:
            stream.finished = True
            end_stream(self._infer_client, graceful=graceful)
        if self._grpc_stream is stream:
            self._grpc_stream = None

    def _stream(self, call: _StreamArgs) -> Generator[_Outputs, None, None]:
        inputs, named_inputs, parameters, headers, batch = call
        self._check_open()
        check_parameters(parameters, "parameters")
        check_parameters(headers, "headers")
        config = run_sync(self._core.ensure_config(), self._control, self._infer_client)
        check_decoupled(config)
        arrays, add_axis = self._core.prepare_inputs(inputs, named_inputs, batch, config)
        text_headers = {key: str(value) for key, value in headers.items()} if headers else None
        if self._url.protocol == "http":
            return self._sse_responses(arrays, parameters, config, add_axis, text_headers)
        request = self._core.build_request(arrays, config, parameters, None, self._lib)
        request.pop("client_timeout", None)
        stream = self._claim_grpc_stream()
        name = self._core.model_name
        client = self._infer_client
        try:
            self._check_open()
            client.start_stream(callback=stream.on_response, headers=grpc_metadata(text_headers))
            client.async_stream_infer(name, request.pop("inputs"), enable_empty_final_response=True, **request)
        except Exception as exc:
            with self._state_lock:
                self._end_grpc_stream(stream, graceful=False)
            raise map_error(exc, f"Streaming inference on model {name!r}") from None
        return self._responses(stream, config, add_axis)

    def _sse_responses(
        self,
        arrays: Dict[str, npt.NDArray[np.generic]],
        parameters: Optional[Dict[str, object]],
        config: TritonModelConfig,
        add_axis: bool,
        headers: Optional[Dict[str, str]],
    ) -> Generator[_Outputs, None, None]:
        if config.batching and any(array.ndim == 0 or array.shape[0] != 1 for array in arrays.values()):
            raise PyTritonClientValueError(
                "Streaming over HTTP (generate_stream) carries one sample per request; send batches over gRPC."
            )
        core = self._core
        path = f"/v2/models/{core.model_name}" + (f"/versions/{core.model_version}" if core.model_version else "")
        token = self._security.access_token
        all_headers = {**(create_auth_headers(token, "http") if token else {}), **(headers or {})}
        stream = HttpStream(
            self._url, path + "/generate_stream", encode_request(arrays, parameters), all_headers,
            core.inference_timeout_s,
        )  # fmt: skip
        if not self._stream_lock.acquire(blocking=False):
            raise PyTritonClientInferenceServerError(
                f"A stream of this client to model {core.model_name!r} is still being read: finish it first, "
                "or use one DecoupledModelClient per concurrent stream."
            )
        try:
            self._check_open()
            self._active_http = stream
            for event in stream.events():
                outputs = decode_event(event, config, keep_batch_axis=not add_axis)
                if outputs:
                    yield outputs
        finally:
            self._active_http = None
            self._stream_lock.release()

    def _responses(
        self, stream: _GrpcStream, config: TritonModelConfig, add_axis: bool
    ) -> Generator[_Outputs, None, None]:
        name = self._core.model_name
        ended_by_server = False  # True: half-close the stream; False: the caller left it, cancel it
        try:
            while True:
                result, error = stream.events.get()
                if error is not None:
                    # An error response (or a broken stream) ends the stream from the server's side;
                    # interrupt()'s errors are this client's own and leave a live stream behind.
                    ended_by_server = not isinstance(error, PyTritonClientError)
                    raise map_error(error, f"Streaming inference on model {name!r}")
                # Before the yield: a caller that stops at the last response still closes gracefully.
                ended_by_server = _is_final(result)
                if _has_outputs(result):
                    yield self._core.decode(result, config, add_axis)
                if ended_by_server:
                    return
        finally:
            with self._state_lock:
                self._end_grpc_stream(stream, graceful=ended_by_server)


class AsyncioDecoupledModelClient(_StreamingCalls[AsyncIterator[_Outputs]], AsyncioModelClient):  # type: ignore[misc]
    """asyncio streaming client: ``async for outputs in client.infer_sample(...)``.

    Built on :class:`DecoupledModelClient` (sharing its core; gRPC or HTTP like it): each step of
    the stream runs in the event loop's default executor. (tritonclient's asyncio gRPC stream cannot ask Triton for the
    empty final response that marks the end of a decoupled stream, so the blocking stream is reused.)
    Each wait for the next response is bounded by ``inference_timeout_s``
    (``PyTritonClientTimeoutError``; the request is then cancelled).
    """

    def _open(self) -> None:
        core = self._core
        self._sync = DecoupledModelClient(
            str(self._url), core.model_name, core.model_version or None, **self._security.as_kwargs()
        )
        self._sync._core = core  # one core: config and readiness are shared

    async def _run(self, function: Callable[..., _Result], *args: object) -> _Result:
        return await asyncio.get_running_loop().run_in_executor(None, function, *args)

    async def close(self) -> None:
        """Close the connection. Idempotent."""
        if not self._closed:
            self._closed = True
            await self._run(self._sync.close)

    async def wait_for_model(self, timeout_s: float) -> None:
        """Wait until the server and model are ready; ``PyTritonClientTimeoutError`` after ``timeout_s``."""
        self._check_open()
        await self._run(self._sync.wait_for_model, timeout_s)

    async def _read_config(self) -> TritonModelConfig:
        self._check_open()
        return await self._run(lambda: self._sync.model_config)

    async def _next(self, iterator: Iterator[_Outputs], done: object) -> Any:
        step: Awaitable[object] = asyncio.get_running_loop().run_in_executor(None, next, iterator, done)
        timeout_s = self._core.inference_timeout_s
        try:
            return await asyncio.wait_for(asyncio.shield(step), timeout_s)
        except asyncio.TimeoutError:
            message = f"No response from model {self._core.model_name!r} within {timeout_s:.1f} s."
            self._sync.interrupt(PyTritonClientTimeoutError(message))
            try:
                await step  # the blocked step now ends (with the error above, or a late response)
            except PyTritonClientError:
                pass
            raise PyTritonClientTimeoutError(message) from None

    async def _stream(self, call: _StreamArgs) -> AsyncIterator[_Outputs]:
        self._check_open()
        iterator = await self._run(self._sync._stream, call)
        done = object()
        try:
            while True:
                item = await self._next(iterator, done)
                if item is done:
                    return
                yield item
        finally:
            await self._run(iterator.close)
