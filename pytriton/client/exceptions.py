"""Exceptions raised by pytriton's clients. All derive from :class:`PyTritonClientError`.

:class:`PyTritonClientError` shares its private base (:mod:`pytriton._errors`, which provides
``message``) with the serving side's ``PyTritonError``, but is not one: ``except PyTritonError``
does not catch client errors. When each class is raised: docs/clients.md ("Errors").
"""

# For maintainers (kept out of the API reference): pinned by tests/unit/test_exceptions.py.

from __future__ import annotations

from pytriton._errors import PyTritonBaseError

__all__ = [
    "PyTritonClientError",
    "PyTritonClientValueError",
    "PyTritonClientInvalidUrlError",
    "PyTritonClientUrlParseError",
    "PyTritonClientInferenceServerError",
    "PyTritonClientPermissionError",
    "PyTritonClientModelDoesntSupportBatchingError",
    "PyTritonClientTimeoutError",
    "PyTritonClientModelUnavailableError",
    "PyTritonClientClosedError",
    "PyTritonClientQueueFullError",
    "PyTritonClientRuntimeError",
]


class PyTritonClientError(PyTritonBaseError):
    """Base class of every client error; ``.message`` is its description."""


class PyTritonClientValueError(PyTritonClientError):
    """An argument has a wrong value (e.g. positional and named inputs mixed)."""


class PyTritonClientInvalidUrlError(PyTritonClientValueError):
    """The server URL cannot be used (a kind of ``PyTritonClientValueError``)."""


PyTritonClientUrlParseError = PyTritonClientInvalidUrlError  # older name, same error


class PyTritonClientInferenceServerError(PyTritonClientError):
    """The server answered with an error; the message is the server's (including the callable's error)."""


class PyTritonClientPermissionError(PyTritonClientInferenceServerError):
    """The server refused the call: the endpoint is restricted and no valid access token was sent.

    Raised for HTTP 403 and for Triton's gRPC refusal of a restricted protocol, which Triton sends
    as ``UNAVAILABLE``: retrying cannot succeed, so the clients never retry it. Pass
    ``access_token=`` (``Triton.get_access_token()`` on the serving side).
    """


class PyTritonClientModelDoesntSupportBatchingError(PyTritonClientError):
    """``infer_batch`` was called on a model that does not batch; use ``infer_sample``."""


class PyTritonClientTimeoutError(PyTritonClientError):
    """An init wait or an inference did not finish within its timeout."""


class PyTritonClientModelUnavailableError(PyTritonClientError):
    """The model (or version) is not available on the server."""


class PyTritonClientClosedError(PyTritonClientError):
    """The client was used after ``close()``."""


class PyTritonClientQueueFullError(PyTritonClientError):
    """``FuturesModelClient``: the request queue is full and the call was non-blocking."""


class PyTritonClientRuntimeError(PyTritonClientError):
    """Unexpected client-side failure."""
