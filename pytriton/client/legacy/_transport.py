"""Protocol selection, header parsing and the connection every legacy context talks through.

Resource lifetimes: a :class:`Connection` owns one gRPC client (thread-safe, used from any thread)
or a small pool of HTTP worker threads, each with its own tritonclient HTTP client. tritonclient's
HTTP client runs on gevent, whose sockets belong to the thread that created them, so HTTP calls
never run on the caller's thread: they are handed to a worker, which creates, uses and finally
closes its own client. ``close()`` stops the workers (each closes its client) and closes the gRPC
client; it is idempotent.

Unit test: tests/unit/test_legacy_client.py (protocols, headers and URLs, the HTTP workers).
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from pytriton.client.auth import grpc_metadata
from pytriton.client.legacy._errors import InferenceServerException, translated

LOGGER = logging.getLogger(__name__)

# Most HTTP requests in flight at once per context (one worker thread and connection each); more
# queue up in order. 16 keeps 32 outstanding async requests busy without a thread per request.
HTTP_WORKERS = 16
_JOIN_TIMEOUT_S = 10.0

Done = Callable[[Any, Optional[BaseException]], None]


class ProtocolType(enum.IntEnum):
    """The protocol a context speaks: ``HTTP`` (port 8000 by default) or ``GRPC`` (8001)."""

    HTTP = 0
    GRPC = 1

    @classmethod
    def from_str(cls, value: str) -> ProtocolType:
        """``"http"`` or ``"grpc"`` (any case) as a :class:`ProtocolType`."""
        try:
            return cls[str(value).strip().upper()]
        except KeyError:
            raise InferenceServerException(f"unknown protocol {value!r}: use 'http' or 'grpc'") from None


def parse_headers(http_headers: Optional[Iterable[str]]) -> Dict[str, str]:
    """``["Name:Value", ...]`` as a dict; a malformed entry is an error that names it."""
    if http_headers is None:
        return {}
    if isinstance(http_headers, (str, bytes)):
        raise InferenceServerException("http_headers must be a list of 'Header:Value' strings, not one string")
    headers: Dict[str, str] = {}
    for entry in http_headers:
        name, sep, value = str(entry).partition(":")
        if not sep or not name.strip():
            raise InferenceServerException(f"bad HTTP header {entry!r}: each header must be written 'Header:Value'")
        headers[name.strip()] = value.strip()
    return headers


def normalize_url(url: str) -> str:
    """``host:port`` from what old code passed (an optional ``http://``/``grpc://`` is dropped)."""
    if not isinstance(url, str) or not url.strip():
        raise InferenceServerException(f"bad server URL {url!r}: expected 'host:port', e.g. 'localhost:8000'")
    text = url.strip()
    for scheme in ("http://", "grpc://"):
        if text.lower().startswith(scheme):
            text = text[len(scheme) :]
    return text.rstrip("/")


def as_protocol(protocol: Any) -> ProtocolType:
    """Accept a :class:`ProtocolType`, its integer value or its name."""
    if isinstance(protocol, str):
        return ProtocolType.from_str(protocol)
    try:
        return ProtocolType(protocol)
    except ValueError:
        raise InferenceServerException(
            f"unknown protocol {protocol!r}: use ProtocolType.HTTP or ProtocolType.GRPC"
        ) from None


class _HttpWorkers:
    """Worker threads, each owning one tritonclient HTTP client for its whole life."""

    def __init__(self, factory: Callable[[], Any], max_workers: int) -> None:
        self._factory = factory
        self._max = max_workers
        self._queue: queue.SimpleQueue[Optional[Tuple[Callable[[object], object], Done]]] = queue.SimpleQueue()
        self._threads: List[threading.Thread] = []
        self._idle = 0
        self._waiting = 0
        self._lock = threading.Lock()
        self._closed = False
        self._local = threading.local()  # .client on worker threads

    def submit(self, work: Callable[[object], object], done: Done) -> None:
        client = getattr(self._local, "client", None)
        if client is not None and not self._closed:
            # Called from a worker (e.g. run() inside an async_run callback): waiting for another
            # worker could deadlock once every worker waits, so use this worker's own client now.
            try:
                result = work(client)
            except BaseException as error:
                done(None, error)
            else:
                done(result, None)
            return
        with self._lock:
            if self._closed:
                raise InferenceServerException("the context is closed")
            self._waiting += 1
            if self._waiting > self._idle and len(self._threads) < self._max:
                thread = threading.Thread(target=self._run, name="legacy-http-client", daemon=True)
                self._threads.append(thread)
                thread.start()
            self._queue.put((work, done))

    def _run(self) -> None:
        client = None
        try:
            while True:
                with self._lock:
                    self._idle += 1
                item = self._queue.get()
                with self._lock:
                    self._idle -= 1
                    if item is not None:
                        self._waiting -= 1
                if item is None:
                    return
                work, done = item
                try:
                    if client is None:
                        client = self._local.client = self._factory()
                    result = work(client)
                except BaseException as error:  # handed to the caller, which re-raises it translated
                    done(None, error)
                else:
                    done(result, None)
        finally:
            self._local.client = None
            if client is not None:
                try:
                    client.close()
                except Exception:  # closing a dead connection must not hide the caller's error
                    LOGGER.debug("closing an HTTP client failed", exc_info=True)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(_JOIN_TIMEOUT_S)
        # Work queued behind the stop markers never ran: fail it rather than leave a caller waiting.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[1](None, InferenceServerException("the context was closed before the request was sent"))


class Connection:
    """One legacy context's link to one server over one protocol, with its extra headers.

    ``headers`` are sent with every request: as HTTP headers over HTTP and as gRPC metadata over
    gRPC (names lower-cased, as gRPC requires), so an access token reaches either endpoint: the
    documented ``triton-access-token`` header travels over gRPC as
    ``triton-grpc-protocol-triton-access-token``, the only key Triton reads there.
    """

    def __init__(self, url: str, protocol: object, verbose: bool = False, http_headers: Optional[Iterable[str]] = None):
        self.protocol = as_protocol(protocol)
        self.url = normalize_url(url)
        self.verbose = bool(verbose)
        parsed = parse_headers(http_headers)
        # gRPC: lower-case names, and the access token under Triton's gRPC key (see grpc_metadata).
        grpc_headers = grpc_metadata(parsed) if self.protocol is ProtocolType.GRPC else None
        self.headers: Dict[str, str] = parsed if grpc_headers is None else grpc_headers
        self._closed = False
        self._grpc: Any = None
        self._http: Optional[_HttpWorkers] = None
        with translated(self.url, what="cannot create a client"):
            if self.protocol is ProtocolType.GRPC:
                import tritonclient.grpc as grpcclient

                self._grpc = grpcclient.InferenceServerClient(self.url, verbose=self.verbose)
            else:
                import tritonclient.http as httpclient

                # Fail now on a malformed URL rather than on a worker thread later.
                if ":" in self.url and not self.url.rsplit(":", 1)[1].isdigit():
                    raise InferenceServerException(f"bad server URL {url!r}: the port must be a number")
                self._http = _HttpWorkers(
                    lambda: httpclient.InferenceServerClient(self.url, verbose=self.verbose, concurrency=1),
                    HTTP_WORKERS,
                )

    @property
    def is_grpc(self) -> bool:
        return self.protocol is ProtocolType.GRPC

    @property
    def grpc_client(self) -> Any:
        self.check_open()
        return self._grpc

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        if self._closed:
            raise InferenceServerException("the context is closed: create a new one")

    def submit(self, work: Callable[[Any], Any], done: Done) -> None:
        """Run ``work(client)`` without waiting; ``done(result, error)`` is called once, from a worker
        thread (HTTP) or the caller's thread (gRPC, where ``work`` must itself be asynchronous)."""
        self.check_open()
        if self._http is not None:
            self._http.submit(work, done)
        else:
            try:
                work(self._grpc)
            except BaseException as error:
                done(None, error)

    def call(self, method: str, *args: object, request_id: int = 0, what: str = "", **kwargs: object) -> Any:
        """Call ``client.<method>(*args, headers=..., **kwargs)`` and wait; failures are translated."""
        self.check_open()
        if self.headers:
            kwargs["headers"] = dict(self.headers)
        with translated(self.url, request_id, what):
            if self._grpc is not None:
                return getattr(self._grpc, method)(*args, **kwargs)
            return self.run_http(lambda client: getattr(client, method)(*args, **kwargs))

    def run_http(self, work: Callable[[object], object]) -> Any:
        """Run ``work(http_client)`` on a worker and wait for it; re-raises its error as it was."""
        finished = threading.Event()
        outcome: List[Any] = [None, None]

        def done(result: object, error: Optional[BaseException]) -> None:
            outcome[0], outcome[1] = result, error
            finished.set()

        assert self._http is not None
        self._http.submit(work, done)
        finished.wait()
        if outcome[1] is not None:
            raise outcome[1]
        return outcome[0]

    def close(self) -> None:
        """Release the clients and worker threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._http is not None:
            self._http.close()
        if self._grpc is not None:
            try:
                self._grpc.close()
            except Exception:  # a client whose channel already failed still counts as closed
                LOGGER.debug("closing the gRPC client failed", exc_info=True)
