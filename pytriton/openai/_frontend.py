"""``OpenAIFrontend``: an OpenAI-compatible HTTP server in front of a running ``Triton``'s bound models.

Lifetime: :meth:`OpenAIFrontend.start` binds the listening socket (so a taken port fails there, at
once), starts one thread (``pytriton-openai``) that runs an asyncio event loop with uvicorn on it,
checks every declared model against its bound configuration, and returns once requests are served.
:meth:`OpenAIFrontend.stop` (also the end of a ``with`` block) stops uvicorn, waits up to a few
seconds for requests in flight (streams still open then are cancelled, closing their generators),
closes the backend's connections and the socket, and joins the thread. The frontend does not own
the ``Triton``: stop the frontend first, then Triton.

Which way to the models: an embedded ``Triton`` (``Triton(embedded=True)``) is called in-process,
through its ``pytriton.inprocess.Server``; a launched one over gRPC at its ``grpc_url`` (streaming
for decoupled models), with its access token when it has one, except that plain requests go to its
``http_url`` (unless ``allow_http=False``) through the keep-alive pool of ``_http.py``, which is
cheaper per request; a ``"grpc://host:port"`` string names a Triton elsewhere (``RemoteTriton``'s
server, another process), reached over gRPC only. The event loop is uvloop's when it is installed.

Security: the frontend listens on 127.0.0.1 unless told otherwise. An ``api_key`` (or the
``PYTRITON_OPENAI_API_KEY`` variable) makes every ``/v1`` route require ``Authorization: Bearer
<key>``; listening on any address other than loopback without a key is refused, so a frontend is
never open to the network by accident. The frontend calls only Triton's inference and readiness
APIs: the management endpoints that ``TritonSecurityConfig`` restricts stay restricted. Limits on
bodies and connections (``max_body_bytes``, ``max_json_depth``, ``max_connections``,
``header_timeout_s``, ``keep_alive_timeout_s``, ``body_timeout_s``) bound what one client can hold
(docs/openai.md).

Unit test: tests/unit/test_openai_frontend.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import os
import signal
import socket
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Dict, Optional, Sequence, Tuple, Union

from pytriton._platform.uvicorn_http import ConnectionLimits, coalescing_protocol
from pytriton.exceptions import PyTritonBadParameterError, PyTritonInvalidOperationError
from pytriton.openai._app import DEFAULT_MAX_BODY_BYTES, AppState, create_app
from pytriton.openai._backend import Backend, GrpcBackend, InProcessBackend
from pytriton.openai._models import (
    ChatModel,
    EmbeddingModel,
    ModelInfo,
    check_chat_model,
    check_embedding_model,
    model_info,
)
from pytriton.openai._requests import MAX_JSON_DEPTH

if TYPE_CHECKING:
    import uvicorn

LOGGER = logging.getLogger("pytriton.openai")

API_KEY_ENV = "PYTRITON_OPENAI_API_KEY"
START_TIMEOUT_S = 60.0


def _run_loop(main: Coroutine[object, None, None]) -> None:
    """Run ``main`` on a new event loop: uvloop's when installed (the ``openai`` extra has it), else asyncio's.

    Why uvloop: with one request in flight the frontend's latency is mostly event loop overhead,
    the wake-ups from Triton's and gRPC's threads included; uvloop's are cheaper (docs/openai.md).
    """
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


# How long stop() lets requests in flight finish before uvicorn cancels them.
GRACEFUL_STOP_S = 3.0


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: Optional[str]) -> None:
    """``PyTritonBadParameterError`` for a non-loopback address without an API key."""
    if api_key is None and not is_loopback(host):
        raise PyTritonBadParameterError(
            f"The OpenAI frontend would listen on {host!r} with no API key, open to anyone who can reach it. "
            f"Pass api_key=... (or set {API_KEY_ENV}), or listen on 127.0.0.1."
        )
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip() or api_key != api_key.strip()):
        raise PyTritonBadParameterError("api_key must be a non-empty string without surrounding whitespace.")


async def _read_info(backend: Backend, name: str, model: str, version: Optional[int]) -> ModelInfo:
    try:
        return model_info(await backend.config(model, version))
    except Exception as exc:
        raise PyTritonBadParameterError(
            f"OpenAI model {name!r}: cannot read the configuration of the bound model {model!r} "
            f"({getattr(exc, 'message', exc)}). Bind it before starting the frontend."
        ) from None


class OpenAIFrontend:
    """OpenAI-compatible HTTP routes for models bound to ``triton`` (see the module docstring and docs/openai.md).

    Args:
        triton: a running ``pytriton.triton.Triton`` (embedded or not), or ``"grpc://host:port"`` of a
            Triton server whose models were bound elsewhere.
        models: the OpenAI names to serve, each a :class:`ChatModel` or an :class:`EmbeddingModel`.
        host: address to listen on; 127.0.0.1 by default. Any other address requires an API key.
        port: TCP port; 0 picks a free one (read :attr:`port` after :meth:`start`).
        api_key: the key clients send as ``Authorization: Bearer <key>``; default: the
            ``PYTRITON_OPENAI_API_KEY`` variable, else none (loopback only).
        max_in_flight: requests served at once; one more is answered 429.
        access_token: the token of a ``grpc://`` Triton with restricted endpoints (a ``Triton``
            object gives its own).
        max_body_bytes: the largest request body (16 MiB); a larger one is answered 413.
        max_json_depth: the deepest nesting of a body's JSON (64 levels); deeper is a 400.
        max_connections: open connections at most (1024); see :class:`ConnectionLimits`.
        header_timeout_s: how long a connection may take to send a request's headers (10 s).
        keep_alive_timeout_s: how long an idle connection is kept after an answer (5 s).
        body_timeout_s: how long a request's body may take to arrive after its headers (60 s; then 408).
    """

    def __init__(
        self,
        triton: Any,
        models: Sequence[Union[ChatModel, EmbeddingModel]],
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        api_key: Optional[str] = None,
        max_in_flight: int = 64,
        access_token: Optional[str] = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_json_depth: int = MAX_JSON_DEPTH,
        max_connections: int = 1024,
        header_timeout_s: float = 10.0,
        keep_alive_timeout_s: float = 5.0,
        body_timeout_s: float = 60.0,
    ) -> None:
        if api_key is None:
            api_key = os.environ.get(API_KEY_ENV) or None
        check_exposure(host, api_key)
        for spec in models:
            if not isinstance(spec, (ChatModel, EmbeddingModel)):
                raise PyTritonBadParameterError(f"models takes ChatModel and EmbeddingModel objects, got {spec!r}.")
        names = [spec.name for spec in models]
        if not models or len(set(names)) != len(names):
            raise PyTritonBadParameterError(f"models must name each OpenAI model once, got {names}.")
        for name, value in (("max_in_flight", max_in_flight), ("max_body_bytes", max_body_bytes),
                            ("max_json_depth", max_json_depth), ("max_connections", max_connections)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PyTritonBadParameterError(f"{name} must be a positive integer, got {value!r}.")
        for name, seconds in (("header_timeout_s", header_timeout_s), ("keep_alive_timeout_s", keep_alive_timeout_s),
                              ("body_timeout_s", body_timeout_s)):  # fmt: skip
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
                raise PyTritonBadParameterError(f"{name} must be a positive number of seconds, got {seconds!r}.")
        self._max_body_bytes = max_body_bytes
        self._max_json_depth = max_json_depth
        self._connection_limits = ConnectionLimits(max_connections, float(header_timeout_s))
        self._keep_alive_timeout_s = float(keep_alive_timeout_s)
        self._body_timeout_s = float(body_timeout_s)
        self._triton = triton
        self._models = list(models)
        self._host = host
        self._port = port
        self._api_key = api_key
        self._max_in_flight = max_in_flight
        self._access_token = access_token
        self._thread: Optional[threading.Thread] = None
        self._server: Optional[uvicorn.Server] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._socket: Optional[socket.socket] = None
        self._bound_port = 0

    def __enter__(self) -> OpenAIFrontend:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port it listens on (the chosen one when started with ``port=0``)."""
        return self._bound_port or self._port

    @property
    def url(self) -> str:
        """``http://host:port/v1``: the ``base_url`` for OpenAI's clients."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}/v1"

    def _backend_factory(self) -> Callable[[], Backend]:
        """A function creating the backend on the frontend's loop (gRPC channels belong to one loop)."""
        triton = self._triton
        if isinstance(triton, str):
            if not triton.startswith("grpc://"):
                raise PyTritonBadParameterError(f"A Triton given by URL must be 'grpc://host:port', got {triton!r}.")
            address, token = triton[len("grpc://") :], self._access_token
            return lambda: GrpcBackend(address, token)
        if not hasattr(triton, "is_alive") or not triton.is_alive():
            raise PyTritonInvalidOperationError("Start the Triton (run()) before its OpenAI frontend.")
        if getattr(triton, "embedded", False):
            server = triton.inprocess_server
            return lambda: InProcessBackend(server)
        address, token = triton.grpc_url[len("grpc://") :], self._access_token or triton.get_access_token()
        http_address: Optional[Tuple[str, int]] = None
        if getattr(getattr(triton, "_config", None), "allow_http", None) is not False:  # plain inference over HTTP
            http = urllib.parse.urlparse(triton.http_url)
            http_address = (http.hostname or "127.0.0.1", int(http.port or 80))
        return lambda: GrpcBackend(address, token, http=http_address)

    def start(self) -> None:
        """Start serving (see the module docstring); errors: a taken port, a model that does not fit its mapping."""
        if self._thread is not None:
            raise PyTritonInvalidOperationError("The OpenAI frontend is already started.")
        make_backend = self._backend_factory()
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
        # accepted sockets inherit it. With proto 0, Nagle held each response's body behind its headers
        # until the client's delayed ACK: 44 ms per request instead of about 1 ms.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._host, self._port))
        except OSError as exc:
            sock.close()
            raise PyTritonBadParameterError(
                f"The OpenAI frontend cannot listen on {self._host}:{self._port}: {exc}. Choose another port."
            ) from None
        self._socket, self._bound_port = sock, sock.getsockname()[1]
        started = threading.Event()
        failure: Dict[str, BaseException] = {}
        self._thread = threading.Thread(
            target=self._run, args=(make_backend, started, failure), name="pytriton-openai", daemon=True
        )
        self._thread.start()
        if not started.wait(START_TIMEOUT_S) or failure:
            self.stop()
            error = failure.get("error")
            if isinstance(error, PyTritonBadParameterError):
                raise error
            raise PyTritonInvalidOperationError(f"The OpenAI frontend did not start: {error!r}")
        LOGGER.info("OpenAI frontend serving %s on %s", [spec.name for spec in self._models], self.url)

    def _run(
        self, make_backend: Callable[[], Backend], started: threading.Event, failure: Dict[str, BaseException]
    ) -> None:
        try:
            _run_loop(self._main(make_backend, started, failure))
        except BaseException as exc:  # noqa: BLE001 - reported to start() or logged; the thread must end cleanly
            if not started.is_set():
                failure["error"] = exc
                started.set()
            else:
                LOGGER.error("OpenAI frontend stopped: %r", exc)

    async def _resolve(
        self, backend: Backend
    ) -> Tuple[Dict[str, Tuple[ChatModel, ModelInfo, ModelInfo]], Dict[str, Tuple[EmbeddingModel, ModelInfo]]]:
        chat: Dict[str, Tuple[ChatModel, ModelInfo, ModelInfo]] = {}
        embeddings: Dict[str, Tuple[EmbeddingModel, ModelInfo]] = {}
        for spec in self._models:
            info = await _read_info(backend, spec.name, spec.model, spec.model_version)
            if isinstance(spec, ChatModel):
                check_chat_model(spec, info)
                stream_info = info
                if spec.stream_model is not None:
                    stream_info = await _read_info(backend, spec.name, spec.stream_model, spec.model_version)
                    check_chat_model(dataclasses.replace(spec, model=spec.stream_model), stream_info)
                chat[spec.name] = (spec, info, stream_info)
            else:
                check_embedding_model(spec, info)
                embeddings[spec.name] = (spec, info)
        return chat, embeddings

    async def _main(
        self, make_backend: Callable[[], Backend], started: threading.Event, failure: Dict[str, BaseException]
    ) -> None:
        import uvicorn

        backend = make_backend()
        try:
            chat, embeddings = await self._resolve(backend)
            state = AppState(
                backend, chat, embeddings, self._api_key, self._max_in_flight, self._max_body_bytes,
                self._max_json_depth, self._body_timeout_s,
            )  # fmt: skip
            # No proxy-headers middleware: nothing here trusts X-Forwarded-* (and it costs a layer per
            # request); no Server header: the frontend does not advertise its stack; no WebSockets: no
            # route takes them. The protocol sends each answer's head and body together (_platform/uvicorn_http.py).
            config = uvicorn.Config(
                create_app(state), log_level="warning", access_log=False, lifespan="off",
                timeout_graceful_shutdown=int(GRACEFUL_STOP_S), proxy_headers=False, server_header=False,
                ws="none", http=coalescing_protocol(self._connection_limits),
                timeout_keep_alive=self._keep_alive_timeout_s,  # type: ignore[arg-type]  # a float works
            )  # fmt: skip
            server = uvicorn.Server(config)
            self._server, self._loop = server, asyncio.get_running_loop()
            assert self._socket is not None  # bound by start() before this thread began
            serving = asyncio.ensure_future(server.serve(sockets=[self._socket]))
            while not server.started and not serving.done():
                await asyncio.sleep(0.01)
            if not server.started:
                await serving  # raises its error
                raise RuntimeError("uvicorn ended before it served")
            started.set()
            await serving
        finally:
            await backend.close()

    def stop(self) -> None:
        """Stop serving and release the socket and thread. Idempotent."""
        server, loop, thread = self._server, self._loop, self._thread
        if server is not None and loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(setattr, server, "should_exit", True)
            except RuntimeError:  # the loop ended meanwhile
                pass
        if thread is not None:
            thread.join(GRACEFUL_STOP_S + 5.0)
            if thread.is_alive():
                LOGGER.warning("The OpenAI frontend's thread did not end within %.0f s.", GRACEFUL_STOP_S + 5.0)
        if self._socket is not None:
            self._socket.close()
        self._server = self._loop = self._thread = self._socket = None

    def serve(self) -> None:
        """Start if needed and block until SIGINT or SIGTERM (main thread only), then stop.

        With a ``Triton`` object this is ``triton.serve()`` (which then stops Triton) followed by :meth:`stop`.
        """
        if self._thread is None:
            self.start()
        try:
            if not isinstance(self._triton, str):
                self._triton.serve()
                return
            done = threading.Event()
            previous = {sig: signal.signal(sig, lambda *_: done.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                while not done.wait(1.0):
                    pass
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        finally:
            self.stop()
