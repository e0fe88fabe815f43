"""The ASGI application: OpenAI's routes on Starlette, over a :class:`~pytriton.openai._backend.Backend`.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/embeddings``,
``GET /v1/models``, ``GET /v1/models/{name}`` and ``GET /health`` (200 when every served model is
ready, else 503; no key needed, so that probes work). Every ``/v1`` route needs
``Authorization: Bearer <key>`` when the frontend has a key (401 otherwise; compared in constant
time).

At most ``max_in_flight`` requests run at once; one more is answered 429 at once rather than
queued, so that a client's retry policy, not a growing queue, absorbs a burst. A stream holds its
place until it ends.

Input limits: a body over ``max_body_bytes`` is answered 413 (declared sizes before any byte is
read), one not whole within ``body_timeout_s`` 408, and the connection is closed after either
answer; a body's JSON may nest ``max_json_depth`` levels and hold no lone UTF-16 surrogate (400
otherwise, ``_requests.parse_json``). A body over ``INLINE_PARSE_BYTES`` is parsed and validated in
a thread, so that ``/health`` and other requests are served meanwhile. A client that disconnects
before the answer to its non-streaming request to a decoupled model is ready has that model's
generation cancelled, as a stream's would be.

A streaming answer waits for the model's first response before it sends the status line, so an
error there (a failing model, a full queue) still gets its status code; a later error is sent as a
last event carrying OpenAI's error body, which OpenAI's clients raise. The stream is watched for
the client's disconnect on its own (not only when the next event is written), and a disconnect
cancels the model's request at once.

Unit test: tests/unit/test_openai_app.py (on a fake backend, through Starlette's TestClient).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Mapping, Optional, Tuple, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from pytriton.openai._backend import Backend, ModelStream, Outputs
from pytriton.openai._errors import OpenAIError, overloaded, too_large, unknown_model
from pytriton.openai._models import ChatModel, EmbeddingModel, ModelInfo
from pytriton.openai._requests import (
    MAX_JSON_DEPTH,
    ModelCall,
    TextRequest,
    embedding_call,
    parse_chat,
    parse_completion,
    parse_embeddings,
    parse_json,
    text_call,
)
from pytriton.openai._responses import (
    Answer,
    ChunkWriter,
    dumps,
    embedding_response,
    event,
    model_entry,
    model_list,
    read_piece,
    text_response,
)

LOGGER = logging.getLogger("pytriton.openai")

DEFAULT_MAX_BODY_BYTES = 16 << 20
# Bodies up to this size are parsed on the event loop (well under a millisecond); larger ones in a
# thread, with a parser that lets the loop's thread have the GIL between objects (_requests.py).
INLINE_PARSE_BYTES = 256 << 10

_T = TypeVar("_T")


@dataclasses.dataclass
class AppState:
    """What the app serves: the backend, the checked model mappings and the access rules."""

    backend: Backend
    chat: Mapping[str, Tuple[ChatModel, ModelInfo, ModelInfo]]  # spec, its model, its stream model
    embeddings: Mapping[str, Tuple[EmbeddingModel, ModelInfo]]
    api_key: Optional[str] = None
    max_in_flight: int = 64
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_depth: int = MAX_JSON_DEPTH
    body_timeout_s: float = 60.0
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    in_flight: int = 0

    def acquire(self) -> Callable[[], None]:
        """Take a place among the requests in flight (429 if none is left); returns its release, idempotent."""
        if self.in_flight >= self.max_in_flight:
            raise overloaded(f"Too many requests in flight (at most {self.max_in_flight}); retry shortly.")
        self.in_flight += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_flight -= 1

        return release


def _json(body: Mapping[str, object], status_code: int = 200) -> Response:
    """A JSON response, encoded as Starlette's ``JSONResponse`` does but with one shared encoder."""
    return Response(dumps(body), status_code, media_type="application/json")


def _error_response(error: OpenAIError) -> Response:
    return _json(error.body(), status_code=error.status)


_INTERNAL = OpenAIError(500, "The server failed to handle the request; its log has the details.", "server_error")


def _endpoint(handler: Callable[[AppState, Request], Awaitable[Response]], state: AppState, auth: bool) -> Any:
    """``handler`` as a Starlette endpoint: the key check, and every error as OpenAI's error body."""

    async def endpoint(request: Request) -> Response:
        try:
            if auth:
                _check_key(state, request)
            return await handler(state, request)
        except OpenAIError as error:
            response = _error_response(error)
            if error.status in (408, 413):  # the rest of the body is not read: end the connection after the answer
                response.headers["connection"] = "close"
            return response
        except (ClientDisconnect, _ClientLeft):  # the client left: nobody reads an answer
            return Response(status_code=400)
        except Exception:
            LOGGER.exception("OpenAI frontend: %s %s failed", request.method, request.url.path)
            return _error_response(_INTERNAL)

    return endpoint


def _check_key(state: AppState, request: Request) -> None:
    if state.api_key is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), state.api_key.encode()):
        raise OpenAIError(
            401, "Missing or wrong API key: send 'Authorization: Bearer <key>'.", "invalid_request_error", None,
            "invalid_api_key",
        )  # fmt: skip


def _lookup(models: Mapping[str, Tuple[_T, ModelInfo]], name: str) -> Tuple[_T, ModelInfo]:
    if name not in models:
        raise unknown_model(name)
    return models[name]


async def _all(coroutines: List[Awaitable[_T]], discard: Optional[Callable[[_T], None]] = None) -> List[_T]:
    """Await all; if one fails, cancel the others and raise its error.

    A coroutine cancelled so cleans up after itself (a stream it was opening is cancelled); ``discard``
    is called with the result of each one that had already finished, whose result is thrown away.
    """
    if len(coroutines) == 1:  # the usual case: no task to create
        return [await coroutines[0]]
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            if not task.done():
                task.cancel()
            elif discard is not None and not task.cancelled() and task.exception() is None:
                discard(task.result())
        raise


async def _answer(state: AppState, spec: ChatModel, model: str, info: ModelInfo, call: ModelCall) -> Answer:
    answer = Answer()
    if not info.decoupled:
        answer.add(read_piece(spec, await state.backend.infer(model, spec.model_version, call, info.batching)))
        return answer
    stream = state.backend.stream(model, spec.model_version, call, info.batching)
    try:
        async for outputs in stream:
            answer.add(read_piece(spec, outputs))
    finally:
        stream.cancel()  # a no-op once the stream has ended; closes the model's generator otherwise
    return answer


async def _read_raw(receive: Receive, limit: int) -> bytes:
    """The body from ASGI ``receive`` (``ClientDisconnect`` if the client leaves first; 413 past ``limit``).

    Why not Starlette's ``Request.stream()``: an async generator per request, for a body that
    nearly always comes in one message.
    """
    chunks: List[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        if not message.get("more_body", False):
            if not chunks:
                return bytes(chunk)
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


async def _read_raw_in_time(request: Request, limit: int, timeout_s: float) -> bytes:
    """:func:`_read_raw`, 408 if the body has not arrived within ``timeout_s``.

    Why a timer that cancels this task rather than ``asyncio.wait_for``: that creates a task per
    request (Python < 3.11 has no ``asyncio.timeout``), and nearly every body is already there.
    """
    task = asyncio.current_task()
    assert task is not None  # called from a request's task
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(timeout_s, expire)
    try:
        return await _read_raw(request.receive, limit)
    except asyncio.CancelledError:
        if not expired:
            raise
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+: this cancellation is handled here
        if uncancel is not None:
            uncancel()
        raise OpenAIError(
            408, f"The request body did not arrive within {timeout_s:g} s (body_timeout_s).", "invalid_request_error",
            None, "request_timeout",
        ) from None  # fmt: skip
    finally:
        timer.cancel()


async def read_body(state: AppState, request: Request, prepare: Callable[[Dict[str, object]], _T]) -> _T:
    """``prepare`` of the request's body as a JSON object (``parse_json``), read up to ``state.max_body_bytes``.

    A declared ``Content-Length`` over the limit is refused (413) before any of the body is read; an
    undeclared (chunked) one as soon as it grows past it. The whole body must arrive within
    ``state.body_timeout_s`` (408). A body over ``INLINE_PARSE_BYTES`` is parsed and ``prepare``d
    (validation, the model inputs) in the loop's default executor, so that other requests
    (``/health``) are served meanwhile; ``prepare`` must not touch the event loop.
    """
    limit = state.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    raw = await _read_raw_in_time(request, limit, state.body_timeout_s)
    if len(raw) <= INLINE_PARSE_BYTES:
        return prepare(parse_json(raw, state.max_json_depth))

    def parse_and_prepare() -> _T:
        return prepare(parse_json(raw, state.max_json_depth, yielding=True))

    return await asyncio.get_running_loop().run_in_executor(None, parse_and_prepare)


@dataclasses.dataclass(frozen=True)
class _TextCall:
    """A validated text request and what it becomes: the served model, its mapping and one call per choice."""

    text: TextRequest
    spec: ChatModel
    info: ModelInfo
    model: str
    calls: List[ModelCall]


def _prepare_text(state: AppState, chat: bool, body: Dict[str, object]) -> _TextCall:
    text = parse_chat(body) if chat else parse_completion(body)
    if text.model not in state.chat:
        raise unknown_model(text.model)
    spec, plain, streaming = state.chat[text.model]
    info = streaming if text.stream else plain
    model = (spec.stream_model or spec.model) if text.stream else spec.model
    # Choice index = prompt index * n + choice of that prompt, as OpenAI numbers them.
    calls = [text_call(spec, info, text, prompt) for prompt in text.prompts for _ in range(text.n)]
    return _TextCall(text, spec, info, model, calls)


async def _text(state: AppState, request: Request, chat: bool) -> Response:
    prepared = await read_body(state, request, functools.partial(_prepare_text, state, chat))
    text, spec, info, model, calls = prepared.text, prepared.spec, prepared.info, prepared.model, prepared.calls
    release = state.acquire()
    try:
        if text.stream:
            response = await _start_stream(state, spec, model, info, text, calls, release)
            release = _nothing  # the stream releases its place when it ends
            return response
        answering = _all([_answer(state, spec, model, info, call) for call in calls])
        # A decoupled model's generation is cancelled if the client leaves before the answer is whole;
        # an ordinary model's single response is awaited (its request keeps its place until Triton answers).
        answers = await (_unless_client_leaves(request.receive, answering) if info.decoupled else answering)
        return _json(text_response(chat, text.model, answers, text.n))
    finally:
        release()


class _ClientLeft(Exception):
    """The client disconnected before its answer was ready; the work for it was cancelled."""


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_client_leaves(receive: Receive, work: Awaitable[_T]) -> _T:
    """``await work``, cancelling it (and raising :class:`_ClientLeft`) if the client disconnects first.

    Call after the body was read: ``receive`` then yields nothing but the disconnect. Cancelling
    ``work`` runs its ``finally`` blocks, which cancel the model's streams (``_answer``).
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        raise _ClientLeft()
    return task.result()


def _nothing() -> None:
    return None


@dataclasses.dataclass
class _Choice:
    """One choice of a streamed answer: its model request, first response, and the rest of its responses."""

    stream: Optional[ModelStream]  # None for an ordinary model: its one response is the head
    head: Optional[Outputs]
    rest: Optional[AsyncIterator[Outputs]]  # None when there is nothing more to read

    def cancel(self) -> None:
        if self.stream is not None:
            self.stream.cancel()


async def _open(backend: Backend, spec: ChatModel, model: str, info: ModelInfo, call: ModelCall) -> _Choice:
    """Send the request of one choice and wait for its first response (so that its errors keep their status)."""
    if not info.decoupled:
        return _Choice(None, await backend.infer(model, spec.model_version, call, info.batching), None)
    stream = backend.stream(model, spec.model_version, call, info.batching)
    responses = stream.__aiter__()
    try:
        return _Choice(stream, await responses.__anext__(), responses)
    except StopAsyncIteration:
        return _Choice(stream, None, None)
    except BaseException:
        stream.cancel()
        raise


async def _merged(sources: List[Tuple[int, AsyncIterator[Outputs]]]) -> AsyncIterator[Tuple[int, Optional[Outputs]]]:
    """``(index, outputs)`` from every source as they arrive, and ``(index, None)`` when a source ends.

    One source is read directly; several are each read by a task into one queue, so that a slow choice
    does not hold back the others. Closing this generator cancels those tasks. The first error of any
    source is raised.
    """
    if len(sources) == 1:
        index, source = sources[0]
        async for outputs in source:
            yield index, outputs
        yield index, None
        return
    queue: asyncio.Queue[Tuple[int, Optional[Outputs], Optional[Exception]]] = asyncio.Queue()

    async def pump(index: int, source: AsyncIterator[Outputs]) -> None:
        try:
            async for outputs in source:
                queue.put_nowait((index, outputs, None))
            queue.put_nowait((index, None, None))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            queue.put_nowait((index, None, exc))

    tasks = [asyncio.ensure_future(pump(index, source)) for index, source in sources]
    try:
        for _ in range(len(sources)):
            while True:
                index, received, error = await queue.get()
                if error is not None:
                    raise error
                yield index, received
                if received is None:
                    break
    finally:
        for task in tasks:
            task.cancel()


async def _start_stream(
    state: AppState,
    spec: ChatModel,
    model: str,
    info: ModelInfo,
    text: TextRequest,
    calls: List[ModelCall],
    release: Callable[[], None],
) -> Response:
    backend = state.backend
    choices = await _all([_open(backend, spec, model, info, call) for call in calls], discard=_Choice.cancel)
    writer = ChunkWriter(text.chat, text.model, text.include_usage, len(choices))
    answers = [Answer() for _ in choices]

    def piece(index: int, outputs: Outputs) -> bytes:
        read = read_piece(spec, outputs)
        return writer.piece(index, read.text, answers[index].add(read))

    def cancel_all() -> None:
        for choice in choices:
            choice.cancel()

    async def events() -> AsyncIterator[bytes]:
        finished = False
        merged = _merged([(index, choice.rest) for index, choice in enumerate(choices) if choice.rest is not None])
        try:
            yield writer.start()
            for index, choice in enumerate(choices):
                if choice.head is not None:
                    yield piece(index, choice.head)
                if choice.rest is None:
                    yield writer.close(index, answers[index])
            async for index, outputs in merged:
                yield writer.close(index, answers[index]) if outputs is None else piece(index, outputs)
            finished = True
            yield writer.end(answers, text.n)
        except OpenAIError as error:
            finished = True
            yield event(error.body())
        except Exception:
            finished = True
            LOGGER.exception("OpenAI frontend: stream of model %r failed", model)
            yield event(_INTERNAL.body())
        finally:
            await merged.aclose()  # type: ignore[attr-defined]
            if not finished:
                cancel_all()
            release()

    return EventStream(events(), cancel_all, release)


class EventStream(Response):
    """A ``text/event-stream`` response that also watches for the client's disconnect.

    ``events`` is iterated and each non-empty item sent. If the client disconnects first, the
    iteration is cancelled, ``on_disconnect`` runs (it cancels the model's request) and ``release``
    frees the request's place. Why not Starlette's ``StreamingResponse``: with ASGI 2.4 servers it
    notices a disconnect only when it next writes, i.e. when the model's next token arrives.
    """

    def __init__(
        self, events: AsyncIterator[bytes], on_disconnect: Callable[[], None], release: Callable[[], None]
    ) -> None:  # fmt: skip
        # Not Response.__init__: it would declare a Content-Length of 0 for the empty body.
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        self._events = events
        self._on_disconnect = on_disconnect
        self._release = release

    async def _send_all(self, send: Send) -> None:
        async for chunk in self._events:
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _disconnect(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        completed = False
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            sender = asyncio.ensure_future(self._send_all(send))
            watcher = asyncio.ensure_future(self._disconnect(receive))
            try:
                await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watcher.cancel()
                if not sender.done():  # the client left first
                    self._on_disconnect()
                    sender.cancel()
                await asyncio.gather(sender, watcher, return_exceptions=True)
            completed = not sender.cancelled() and sender.exception() is None
        finally:
            if not completed:
                self._on_disconnect()
            await self._events.aclose()  # type: ignore[attr-defined]
            self._release()


async def _chat(state: AppState, request: Request) -> Response:
    return await _text(state, request, chat=True)


async def _completions(state: AppState, request: Request) -> Response:
    return await _text(state, request, chat=False)


async def _embeddings(state: AppState, request: Request) -> Response:
    parsed = await read_body(state, request, parse_embeddings)
    spec, info = _lookup(state.embeddings, parsed.model)
    release = state.acquire()
    try:
        backend = state.backend
        results = await _all(
            [backend.infer(spec.model, spec.model_version, embedding_call(spec, text), info.batching)
             for text in parsed.texts]
        )  # fmt: skip
    finally:
        release()
    vectors = []
    tokens: Optional[int] = None
    for outputs in results:
        if spec.embedding_output not in outputs:
            raise OpenAIError(500, f"The model sent no output {spec.embedding_output!r}.", "server_error")
        vectors.append(outputs[spec.embedding_output])
        if spec.tokens_output in outputs:
            tokens = (tokens or 0) + int(outputs[spec.tokens_output].reshape(-1)[0])
    return _json(embedding_response(parsed.model, vectors, parsed.encoding_format, tokens))


def _names(state: AppState) -> List[str]:
    return sorted({*state.chat, *state.embeddings})


async def _models(state: AppState, request: Request) -> Response:
    return _json(model_list(_names(state), state.created))


async def _model(state: AppState, request: Request) -> Response:
    name = str(request.path_params["name"])
    if name not in _names(state):
        raise unknown_model(name)
    return _json(model_entry(name, state.created))


async def _health(state: AppState, request: Request) -> Response:
    served: List[Tuple[str, Optional[int]]] = [(spec.model, spec.model_version) for spec, _, _ in state.chat.values()]
    served += [(spec.stream_model, spec.model_version) for spec, _, _ in state.chat.values() if spec.stream_model]
    served += [(spec.model, spec.model_version) for spec, _ in state.embeddings.values()]
    ready = await asyncio.gather(*(state.backend.ready(model, version) for model, version in served))
    if all(ready):
        return _json({"status": "ok"})
    not_ready = sorted({model for (model, _), is_ready in zip(served, ready) if not is_ready})
    return _json({"status": "unavailable", "models_not_ready": not_ready}, status_code=503)


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    path = request.url.path
    path = path if len(path) <= 80 else f"{path[:80]}... ({len(path)} characters)"  # not a long path echoed whole
    return _error_response(OpenAIError(status, f"{request.method} {path}: {exc}", kind))


def create_app(state: AppState) -> ASGIApp:
    """The ASGI application serving ``state`` (see the module docstring).

    The two text routes, the hot path, are called directly for ``POST``, around Starlette's
    middleware and router (one dictionary lookup instead of two middleware layers and a regex per
    route); their endpoints catch every error themselves, so nothing those layers do is lost. Any
    other method or path, ``GET /v1/chat/completions`` (405) included, goes through Starlette.
    """

    def route(path: str, handler: Callable[[AppState, Request], Awaitable[Response]], method: str) -> Route:
        return Route(path, _endpoint(handler, state, auth=path.startswith("/v1/")), methods=[method])

    routes = [
        route("/v1/chat/completions", _chat, "POST"),
        route("/v1/completions", _completions, "POST"),
        route("/v1/embeddings", _embeddings, "POST"),
        route("/v1/models", _models, "GET"),
        route("/v1/models/{name:path}", _model, "GET"),
        route("/health", _health, "GET"),
    ]
    handlers: Dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {HTTPException: _http_error}
    starlette = Starlette(routes=routes, exception_handlers=handlers)
    direct = {
        "/v1/chat/completions": _endpoint(_chat, state, auth=True),
        "/v1/completions": _endpoint(_completions, state, auth=True),
    }

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = direct.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if endpoint is None:
            await starlette(scope, receive, send)
            return
        response = await endpoint(Request(scope, receive))
        await response(scope, receive, send)

    return app
