"""The legacy client's single exception type and the translation of every lower-level failure into it.

Old code catches ``InferenceServerException`` around every call, so nothing raised by tritonclient,
gRPC, geventhttpclient or the socket layer may escape a legacy context: :func:`translated` turns
each of them into an ``InferenceServerException`` that keeps the original as ``__cause__``.

Unit test: tests/unit/test_legacy_client.py (the exception's API, ``translated``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional

from pytriton.client._core import is_permission_denied

LOGGER = logging.getLogger(__name__)


class InferenceServerException(Exception):
    """A failed request or a bad argument, as the legacy ``tensorrtserver.api`` reported it.

    ``err`` is the message (the legacy constructor took a pointer to a native error; there is no
    native library here, so a string or another exception stands in for it).
    ``server_id()`` is the URL of the server the failing request went to, or None when the failure
    was found on the client before anything was sent. ``request_id()`` is the context's integer id
    of the failing inference request, or 0 when no request is associated.
    """

    def __init__(self, err: object = None, *, server_id: Optional[str] = None, request_id: int = 0) -> None:
        message = None if err is None else str(err)
        super().__init__(message if message is not None else "")
        self._message = message
        self._server_id = server_id
        self._request_id = int(request_id or 0)

    def message(self) -> Optional[str]:
        """The message of this exception, or None if it has none."""
        return self._message

    def server_id(self) -> Optional[str]:
        """The server the failing request went to (its URL), or None for a client-side failure."""
        return self._server_id

    def request_id(self) -> int:
        """The id of the inference request that failed, or 0 when no request is associated."""
        return self._request_id

    def __str__(self) -> str:
        return self._message or ""


def describe(error: BaseException) -> str:
    """A one-line description of a lower-level error, without tracebacks or object reprs."""
    message_of = getattr(error, "message", None)
    text = message_of() if callable(message_of) else None
    if not text:
        details = getattr(error, "details", None)
        text = details() if callable(details) else None
    if not text:
        text = str(error) or type(error).__name__
    if isinstance(error, (ConnectionError, OSError)) and not isinstance(error, InferenceServerException):
        text = f"cannot reach the server: {text}"
    elif is_permission_denied(error):  # gRPC says UNAVAILABLE for it: say what it really is
        text = f"permission denied (the endpoint is restricted; pass the server's access token): {text}"
    return str(text)


@contextlib.contextmanager
def translated(server_id: Optional[str], request_id: int = 0, what: str = "") -> Iterator[None]:
    """Run the body and re-raise any failure as :class:`InferenceServerException`.

    ``what`` names the operation in the message ("load of model 'x'"); an
    ``InferenceServerException`` raised inside passes through unchanged.
    """
    try:
        yield
    except InferenceServerException:
        raise
    except Exception as error:  # every transport error becomes the legacy exception, by contract
        prefix = f"{what}: " if what else ""
        raise InferenceServerException(prefix + describe(error), server_id=server_id, request_id=request_id) from error
