"""uvicorn's HTTP protocol with one send per event-loop step: an answer's head and body leave together.

Why: uvicorn writes a response's status line and headers when the app sends
``http.response.start`` and its body on ``http.response.body``, each a ``transport.write`` of its
own. On a socket with ``TCP_NODELAY`` (the frontend's, see ``_frontend.py``) that is two sends and
two TCP segments for every answer: the first wakes the client, which parses the headers and blocks
again for the body. :class:`CoalescingTransport` collects the writes made during one step of the
event loop and sends them as one, at the end of that step (``loop.call_soon``), so a JSON answer is
one segment, and a stream's head goes out with its first event. Later events still leave as soon as
they are written: nothing waits longer than the step that wrote it.

Lifetime: the wrapper lives as long as its connection; ``close()`` sends what is pending first.
``abort()`` drops it (the connection is being torn down anyway).

Unit test: tests/unit/test_openai_frontend.py.
"""

from __future__ import annotations

import asyncio
from typing import Any, List, cast


class CoalescingTransport:
    """A transport whose ``write`` calls within one event-loop step become one ``write`` of the wrapped one.

    Everything but ``write``, ``writelines``, ``close`` and ``abort`` is the wrapped transport's own.
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._pending: List[bytes] = []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def _flush(self) -> None:
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending = []
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
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
