"""uvicorn's HTTP protocol with one send per event-loop step: an answer's head and body leave together.

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


def coalescing_protocol() -> Any:
    """uvicorn's HTTP/1.1 protocol class (httptools' when installed, else h11's) writing through :class:`CoalescingTransport`."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:  # httptools missing: uvicorn's own fallback
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base  # type: ignore[assignment]

    class CoalescingProtocol(Base):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.transport = cast(Any, CoalescingTransport(transport))

    return CoalescingProtocol
