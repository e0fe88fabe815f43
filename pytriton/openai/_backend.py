"""How the frontend reaches the bound models: in-process (embedded Triton), or gRPC and HTTP.

Both backends offer the same three calls, on the frontend's event loop:

- ``config(model, version)``: the model's JSON configuration;
- ``infer(model, version, call)``: one request, one response (outputs without the batch axis);
- ``stream(model, version, call)``: a :class:`ModelStream` over a decoupled model's responses.

A :class:`ModelStream` is iterated with ``async for`` and ended with its synchronous
:meth:`ModelStream.cancel`, which is safe to call from a ``finally`` block that runs while its task
is being cancelled (a client that disconnected): no ``await`` is needed for the model to learn that
its caller left. Over gRPC the stream's call is cancelled, so Triton cancels the request and the
worker closes the model's generator (docs/architecture.md); in-process the request is cancelled
through Triton's C API with the same effect.

Why not ``AsyncioDecoupledModelClient``: it runs every step of a stream on an executor thread (the
blocking gRPC stream underneath), which costs a thread hand-off per token; tritonclient's asyncio
gRPC client streams on the event loop itself. Its stream cannot ask Triton for the empty final
response, so the request iterator ends after the one request (a half-close) and Triton ends the
stream once the model has sent its final response.

Errors become :class:`OpenAIError` by Triton's status code (gRPC status, in-process error class):
invalid argument 400, not found 404, unavailable 503 (429 when the model's queue is full),
anything else 500 with Triton's message, which pytriton limits to ``ExceptionType: message``.

Unit test: tests/unit/test_openai_app.py (error mapping), tests/e2e/test_openai.py (both backends).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, List, Optional, Protocol, Set, Tuple

import numpy as np

from pytriton.client._decoupled import GRACEFUL_CLOSE_TIMEOUT_S
from pytriton.openai._errors import QUEUE_FULL_TEXT, OpenAIError, invalid_request, model_failed, overloaded, unavailable
from pytriton.openai._http import TritonHttp, TritonHttpError
from pytriton.openai._requests import ModelCall

if TYPE_CHECKING:
    from pytriton.inprocess import Server
    from pytriton.inprocess._request import AsyncResponseIterator, InferenceResponse
    from pytriton.inprocess._server import Model

Outputs = Dict[str, np.ndarray]  # type: ignore[type-arg]


class ModelStream(Protocol):
    """The responses of one streaming request."""

    def __aiter__(self) -> AsyncIterator[Outputs]: ...

    def cancel(self) -> None:
        """Stop the request now (idempotent; harmless after the stream ended)."""


class Backend(Protocol):
    """The frontend's way to the models (see the module docstring)."""

    async def config(self, model: str, version: Optional[int]) -> Dict[str, Any]: ...

    async def ready(self, model: str, version: Optional[int]) -> bool: ...

    async def infer(self, model: str, version: Optional[int], call: ModelCall, batching: bool) -> Outputs: ...

    def stream(self, model: str, version: Optional[int], call: ModelCall, batching: bool) -> ModelStream: ...

    async def close(self) -> None: ...


def error_from_status(status: str, message: str) -> OpenAIError:
    """The :class:`OpenAIError` for a Triton error with status name ``status`` (gRPC's names)."""
    if QUEUE_FULL_TEXT in message:
        return overloaded(f"The model is overloaded: {message}")
    if status in ("INVALID_ARGUMENT", "OUT_OF_RANGE", "FAILED_PRECONDITION"):
        return invalid_request(f"The model refused the request: {message}")
    if status == "NOT_FOUND":
        return unavailable(f"The model is not loaded: {message}")
    if status in ("UNAVAILABLE", "RESOURCE_EXHAUSTED"):
        return unavailable(f"The model is unavailable: {message}")
    return model_failed(f"The model failed: {message}")


def _batched(call: ModelCall, batching: bool) -> Dict[str, np.ndarray]:  # type: ignore[type-arg]
    return {name: value[np.newaxis, ...] if batching else value for name, value in call.inputs.items()}


def _unbatched(outputs: Outputs, batching: bool) -> Outputs:
    return {name: value[0] if batching and value.ndim > 0 and len(value) else value for name, value in outputs.items()}


# -- gRPC -----------------------------------------------------------------------------------------
class GrpcBackend:
    """tritonclient's asyncio gRPC client on ``url`` (``host:port``); created and used on one event loop.

    With ``http`` (``(host, port)`` of the same Triton's HTTP endpoint), non-streaming inference goes
    over :class:`~pytriton.openai._http.TritonHttp` instead: its answers reach the loop without a
    thread hand-off (see that module). Configuration, readiness and streams stay on gRPC.
    """

    def __init__(self, url: str, access_token: Optional[str] = None, http: Optional[Tuple[str, int]] = None) -> None:
        import tritonclient.grpc.aio as grpcclient

        from pytriton.client.auth import create_auth_headers

        self._grpc = grpcclient
        self._client = grpcclient.InferenceServerClient(url)
        self._headers: Optional[Dict[str, str]] = None
        if access_token:
            self._headers = create_auth_headers(access_token, "grpc")
        self._http: Optional[TritonHttp] = None
        if http is not None:
            self._http = TritonHttp(*http, headers=create_auth_headers(access_token, "http") if access_token else None)

    def _error(self, exc: Exception) -> OpenAIError:
        status = str(exc.status() if hasattr(exc, "status") and callable(exc.status) else "") or ""
        message = exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)
        return error_from_status(status.replace("StatusCode.", ""), str(message))

    def _inputs(self, call: ModelCall, batching: bool) -> List[object]:
        inputs: List[object] = []
        for name, value in _batched(call, batching).items():
            datatype = "BYTES" if value.dtype == np.object_ else self._grpc.np_to_triton_dtype(value.dtype)
            tensor = self._grpc.InferInput(name, list(value.shape), datatype)
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        return inputs

    async def config(self, model: str, version: Optional[int]) -> Dict[str, Any]:
        try:
            answer = await self._client.get_model_config(model, str(version or ""), headers=self._headers, as_json=True)
        except self._grpc.InferenceServerException as exc:
            raise self._error(exc) from None
        return dict(answer.get("config", answer))

    async def ready(self, model: str, version: Optional[int]) -> bool:
        try:
            return bool(await self._client.is_model_ready(model, str(version or ""), headers=self._headers))
        except self._grpc.InferenceServerException:
            return False

    async def infer(self, model: str, version: Optional[int], call: ModelCall, batching: bool) -> Outputs:
        if self._http is not None:
            try:
                outputs = await self._http.infer(model, version, _batched(call, batching), call.parameters or None)
            except TritonHttpError as exc:
                raise error_from_status(exc.status, exc.message) from None
            except OSError as exc:
                raise unavailable(f"Triton's HTTP endpoint is unreachable: {exc}") from None
            return _unbatched(outputs, batching)
        try:
            result = await self._client.infer(
                model, self._inputs(call, batching), model_version=str(version or ""),
                parameters=call.parameters or None, headers=self._headers,
            )  # fmt: skip
        except self._grpc.InferenceServerException as exc:
            raise self._error(exc) from None
        return _unbatched(self._outputs(result), batching)

    @staticmethod
    def _outputs(result: Any) -> Outputs:
        return {output.name: result.as_numpy(output.name) for output in result.get_response().outputs}

    def stream(self, model: str, version: Optional[int], call: ModelCall, batching: bool) -> ModelStream:
        request: Dict[str, object] = {
            "model_name": model, "model_version": str(version or ""), "inputs": self._inputs(call, batching),
            "parameters": call.parameters or None,
        }  # fmt: skip

        async def one_request() -> AsyncIterator[Dict[str, object]]:
            yield request  # then the iterator ends: a half-close, so Triton ends the stream after the final response

        return _GrpcStream(self, self._client.stream_infer(one_request(), headers=self._headers), batching)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        await self._client.close()


class _GrpcStream:
    """One gRPC stream carrying one request (its request side already half-closed).

    After an error response, which is the request's last, the stream is read to its end in the
    background instead of being cancelled: Triton 2.51's gRPC frontend can wedge a stream (and keep
    its model from unloading) when a cancellation arrives just after a final response
    (pytriton/client/_decoupled.py, ``end_stream``). Only a stream the caller leaves early is cancelled.
    """

    # Background drains in progress: the event loop keeps only weak references to tasks.
    _draining: Set[asyncio.Future[None]] = set()

    def __init__(self, backend: GrpcBackend, responses: Any, batching: bool) -> None:
        self._backend = backend
        self._responses = responses
        self._batching = batching
        self._ended = False  # the server has ended the request: nothing to cancel

    async def __aiter__(self) -> AsyncIterator[Outputs]:
        try:
            async for result, error in self._responses:
                if error is not None:
                    self._ended = True
                    self._drain()
                    raise self._backend._error(error)
                yield _unbatched(GrpcBackend._outputs(result), self._batching)
            self._ended = True
        except self._backend._grpc.InferenceServerException as exc:
            raise self._backend._error(exc) from None

    def _drain(self) -> None:
        async def drain() -> None:
            try:
                await asyncio.wait_for(self._read_to_end(), GRACEFUL_CLOSE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - a peer gone silent or a broken stream: cancel it after all
                self._responses.cancel()

        task = asyncio.ensure_future(drain())
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    async def _read_to_end(self) -> None:
        async for _ in self._responses:
            pass

    def cancel(self) -> None:
        if not self._ended:
            self._responses.cancel()


# -- in-process -----------------------------------------------------------------------------------
_INPROCESS_STATUS = {
    "InvalidArgumentError": "INVALID_ARGUMENT",
    "NotFoundError": "NOT_FOUND",
    "UnavailableError": "UNAVAILABLE",
    "CancelledError": "CANCELLED",
}


class InProcessBackend:
    """The in-process API of an embedded ``Triton`` (``pytriton.inprocess.Server``): no network at all."""

    def __init__(self, server: Server) -> None:
        from pytriton import inprocess

        self._inprocess = inprocess
        self._server = server

    def _error(self, exc: Exception) -> OpenAIError:
        return error_from_status(_INPROCESS_STATUS.get(type(exc).__name__, "INTERNAL"), str(exc))

    def _tensors(self, call: ModelCall, batching: bool) -> Dict[str, object]:
        tensors: Dict[str, object] = {}
        for name, value in _batched(call, batching).items():
            tensors[name] = self._inprocess.Tensor.from_bytes_array(value) if value.dtype == np.object_ else value
        return tensors

    def _outputs(self, response: InferenceResponse) -> Outputs:
        outputs: Outputs = {}
        for name, tensor in response.outputs.items():
            if tensor.data_type == self._inprocess.DataType.BYTES:
                outputs[name] = tensor.to_bytes_array()
            else:
                outputs[name] = np.array(np.from_dlpack(tensor))  # a copy: the response's memory is Triton's
        return outputs

    def _model(self, model: str, version: Optional[int]) -> Model:
        return self._server.model(model, version if version is not None else -1)

    async def config(self, model: str, version: Optional[int]) -> Dict[str, Any]:
        try:
            return dict(self._model(model, version).config())
        except self._inprocess.TritonError as exc:
            raise self._error(exc) from None

    async def ready(self, model: str, version: Optional[int]) -> bool:
        try:
            return bool(self._model(model, version).ready())
        except self._inprocess.TritonError:
            return False

    async def infer(self, model: str, version: Optional[int], call: ModelCall, batching: bool) -> Outputs:
        stream = self.stream(model, version, call, batching)
        outputs: Outputs = {}
        async for response in stream:
            outputs = response or outputs
        return outputs

    def stream(self, model: str, version: Optional[int], call: ModelCall, batching: bool) -> ModelStream:
        return _InProcessStream(self, model, version, call, batching)

    async def close(self) -> None:
        return None


class _InProcessStream:
    def __init__(self, backend: InProcessBackend, model: str, version: Optional[int], call: ModelCall, batching: bool):
        self._backend = backend
        self._args = (model, version, call, batching)
        self._responses: Optional[AsyncResponseIterator] = None
        self._cancelled = False

    async def __aiter__(self) -> AsyncIterator[Outputs]:
        backend = self._backend
        model, version, call, batching = self._args
        try:
            self._responses = backend._model(model, version).async_infer(
                inputs=backend._tensors(call, batching), parameters=dict(call.parameters)
            )
            if self._cancelled:
                self._responses.cancel()
            async for response in self._responses:
                outputs = backend._outputs(response)
                if outputs:
                    yield _unbatched(outputs, batching)
        except backend._inprocess.TritonError as exc:
            raise backend._error(exc) from None

    def cancel(self) -> None:
        self._cancelled = True
        if self._responses is not None:
            try:
                self._responses.cancel()
            except Exception:  # noqa: BLE001 - the request may be released already; it is over either way
                pass
