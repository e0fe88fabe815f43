"""uvicorn's HTTP protocol with one send per event-loop step, and bounds on the connections it holds.

In the platform layer because it subclasses uvicorn's internal protocol classes
(``uvicorn.protocols.http``), which a uvicorn release may change: the OpenAI frontend
(``pytriton/openai/_frontend.py``) is its only user. Stock uvicorn's public settings cannot give the
bounds below: ``limit_concurrency`` answers 503 to every new client while idle or half-sent
connections are held, and nothing bounds the time to a request's headers. ``python -m
bench.openai_transport`` measures both on one host (200 such connections against a bound of 100,
12 s later): stock uvicorn still holds 200 of 200 and answers a chat completion 503; this protocol
holds none and answers 200, with no per-request latency difference above the host's noise
(docs/architecture.md, "The platform layer").
Written against uvicorn 0.54 (``httptools_impl`` and ``h11_impl``); the OpenAI limits' tests
(tests/e2e/test_openai.py) fail if a release changes what it relies on.

Bounds (:class:`ConnectionLimits`; why: uvicorn 0.54 itself holds a connection that never sends a
whole request's headers for ever, and takes any number of them): at most ``max_connections`` open,
where one more evicts the connection waiting longest for its request's headers, or is answered 503
when every connection is in a request; a request's headers within ``header_timeout_s`` of the
connection's opening or of its previous answer's end; at most ``max_header_bytes`` of them (431).
Idle keep-alive connections are uvicorn's ``timeout_keep_alive``.

One send per step: an answer's head and body leave together.

Why: uvicorn writes a response's status line and headers when the app sends
``http.response.start`` and its body on ``http.response.body``, each a ``transport.write`` of its
own. On a socket with ``TCP_NODELAY`` (the frontend's, see ``_frontend.py``) that is two sends and
two TCP segments for every answer: the first wakes the client, which parses the headers and blocks
again for the body. :class:`CoalescingTransport` holds a write until the next one (the two go out
in one send) or the end of the event-loop step that wrote it (``loop.call_soon``), so a JSON answer
is one segment. A stream's events leave at once or paired; nothing waits longer than the next write
or the end of its step.

Lifetime: the wrapper lives as long as its connection; ``close()`` sends what is pending first.
``abort()`` drops it (the connection is being torn down anyway).

Unit test: tests/unit/test_openai_frontend.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from typing import Any, Iterable, Optional, cast


class CoalescingTransport:
    """A transport that sends two writes of one event-loop step as one ``write`` of the wrapped one.

    A write is held while nothing else is: the next write sends both at once, and the end of the
    step sends it alone. Pairs, not everything the step wrote: a stream whose responses are already
    waiting is written without the task ever yielding, and holding every event until then would
    delay its first token by all the others. Everything but ``write``, ``writelines``, ``close`` and
    ``abort`` is the wrapped transport's own.
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._pending: Optional[bytes] = None

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self._pending is None:
            self._pending = bytes(data)
            self._loop.call_soon(self._flush)
            return
        joined, self._pending = self._pending + bytes(data), None
        self._send(joined)

    def writelines(self, lines: Iterable[bytes]) -> None:
        for line in lines:
            self.write(line)

    def _send(self, data: bytes) -> None:
        if not self._transport.is_closing():
            self._transport.write(data)

    def _flush(self) -> None:
        if self._pending is not None:
            data, self._pending = self._pending, None
            self._send(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    """How many connections the frontend keeps, and how long and how much it waits for a request's headers.

    ``max_connections``: open connections at most. One more closes the connection that has waited
    longest for its next request's headers (idle or sending them), so that held connections cannot
    lock out new clients; when every connection is in the middle of a request, the new one is
    answered 503 and closed. ``header_timeout_s``: from its opening, and from the end of each answer,
    a connection must deliver a whole request's headers within this time, else it is closed.
    ``max_header_bytes``: a request's headers larger than this get 431 and the connection is closed.
    """

    max_connections: int = 1024
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 << 10


def _answer(status: bytes, message: str, kind: str, code: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


_FULL = _answer(b"503 Service Unavailable", "Too many open connections; retry shortly.", "overloaded_error",
                "too_many_connections")  # fmt: skip
_HEADERS_TOO_LARGE = _answer(b"431 Request Header Fields Too Large", "The request's headers are too large.",
                             "invalid_request_error", "headers_too_large")  # fmt: skip


_TICKETS = itertools.count()


def coalescing_protocol(limits: ConnectionLimits = ConnectionLimits()) -> Any:
    """uvicorn's HTTP/1.1 protocol class (httptools' when installed, else h11's) writing through
    :class:`CoalescingTransport` and holding connections to ``limits``.

    Lifetime of the guard: a connection "waits for headers" from its opening and from the end of each
    answer until uvicorn starts the next request (a new request cycle, which uvicorn creates once the
    headers are whole, in both implementations); only then do the header timer and byte count run.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:  # httptools missing: uvicorn's own fallback
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base  # type: ignore[assignment]

    class CoalescingProtocol(Base):  # type: ignore[misc,valid-type]
        # While it waits for a request's headers: when it began, as a number from one counter for all
        # connections (uvloop's loop.time() is cached per loop step, so it would tie).
        waiting_since: Optional[int] = None
        _header_timer: Optional[asyncio.TimerHandle] = None
        _header_bytes = 0

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.transport = cast(Any, CoalescingTransport(transport))
            self._wait_for_headers()
            if len(self.connections) > limits.max_connections and not self._evict_longest_waiting():
                self._refuse(_FULL)

        def _evict_longest_waiting(self) -> bool:
            connections: Iterable[object] = self.connections  # uvicorn's protocols, these among them
            waiting = [c for c in connections if c is not self and getattr(c, "waiting_since", None) is not None]
            if not waiting:
                return False
            oldest = min(waiting, key=lambda connection: getattr(connection, "waiting_since", 0.0))
            oldest.stop_waiting()  # type: ignore[attr-defined]  # a CoalescingProtocol: it has a waiting_since
            oldest.transport.close()  # type: ignore[attr-defined]
            return True

        def _refuse(self, answer: bytes) -> None:
            self.stop_waiting()
            if not self.transport.is_closing():
                self.transport.write(answer)
                self.transport.close()

        def _wait_for_headers(self) -> None:
            self.stop_waiting()
            self.waiting_since = next(_TICKETS)
            self._header_bytes = 0
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._header_timeout)

        def stop_waiting(self) -> None:
            self.waiting_since = None
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.waiting_since is not None and not self.transport.is_closing():
                self.waiting_since = None
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.waiting_since is None:
                super().data_received(data)
                return
            # Counted before this piece is parsed: a piece may hold a whole request's headers and the
            # start of its body; what matters is that headers do not grow past the limit piece by piece.
            if self._header_bytes > limits.max_header_bytes:
                self._refuse(_HEADERS_TOO_LARGE)
                return
            self._header_bytes += len(data)
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle:  # a request's headers were whole: uvicorn started its cycle
                self.stop_waiting()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing():
                return
            if self.cycle is None or self.cycle.response_complete:  # no pipelined request started
                self._wait_for_headers()

        def connection_lost(self, exc: Optional[Exception]) -> None:
            self.stop_waiting()
            super().connection_lost(exc)

    return CoalescingProtocol
