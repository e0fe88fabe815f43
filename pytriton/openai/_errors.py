"""OpenAI-shaped errors: one exception type carrying the HTTP status and the body's fields.

Every failure the frontend reports, whether it is a bad request, a missing API key, an unknown
model or a failed model, becomes an :class:`OpenAIError`, and the app turns it into OpenAI's error
body ``{"error": {"message", "type", "param", "code"}}`` with its status. Nothing else reaches a
client: an unexpected exception is logged in this process and answered with a generic 500.

Unit test: tests/unit/test_openai_app.py (each status through the app), tests/unit/test_openai_requests.py.
"""

from __future__ import annotations

import reprlib
from typing import Any, Dict, Optional

# Triton's message when a model's queue is full (dynamic batcher ``max_queue_size``); the error of a
# gRPC stream response carries only its text, so this is how overload is recognised there.
QUEUE_FULL_TEXT = "Exceeds maximum queue size"


# How a client's value is shown in an error message: at most about 80 characters whatever its size
# (a 100 KB model name is not sent back whole), built without a full repr of a large value first.
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlist = _SHORT.maxdict = _SHORT.maxtuple = _SHORT.maxset = 4
_SHORT.maxlevel = 2


def shown(value: object) -> str:
    """``repr(value)`` cut to about 80 characters, for echoing a client's value in an error message."""
    return _SHORT.repr(value)


class OpenAIError(Exception):
    """An error answered as ``status`` with OpenAI's error body.

    ``kind`` is the body's ``type`` (``invalid_request_error``, ``authentication_error``,
    ``not_found_error``, ``rate_limit_error``, ``overloaded_error``, ``server_error``); ``param`` the
    request field at fault, if any; ``code`` a short machine-readable reason, if any.
    """

    def __init__(
        self, status: int, message: str, kind: str, param: Optional[str] = None, code: Optional[str] = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code

    def body(self) -> Dict[str, Any]:
        """OpenAI's error body."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def invalid_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> OpenAIError:
    """400: the request is malformed or asks for something the model cannot do."""
    return OpenAIError(400, message, "invalid_request_error", param, code)


def unknown_model(name: str) -> OpenAIError:
    """404, as OpenAI answers for a model name it does not serve."""
    return OpenAIError(
        404, f"The model {shown(name)} does not exist; GET /v1/models lists the served models.",
        "invalid_request_error", "model", "model_not_found",
    )  # fmt: skip


def too_large(limit: int) -> OpenAIError:
    """413: the body is larger than the frontend's ``max_body_bytes``."""
    return OpenAIError(
        413, f"The request body is larger than this server's limit of {limit} bytes (max_body_bytes).",
        "invalid_request_error", None, "request_too_large",
    )  # fmt: skip


def overloaded(message: str) -> OpenAIError:
    """429: too many requests in flight (the frontend's limit or the model's queue)."""
    return OpenAIError(429, message, "rate_limit_error", None, "rate_limit_exceeded")


def unavailable(message: str) -> OpenAIError:
    """503: the model or the server cannot take requests right now."""
    return OpenAIError(503, message, "overloaded_error", None, "service_unavailable")


def model_failed(message: str) -> OpenAIError:
    """500: the model raised or returned something unusable. ``message`` never holds a traceback."""
    return OpenAIError(500, message, "server_error", None, "model_error")
