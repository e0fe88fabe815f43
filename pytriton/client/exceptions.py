"""Exceptions raised by pytriton's clients. All derive from :class:`PyTritonClientError`."""

from __future__ import annotations

__all__ = [
    "PyTritonClientError",
    "PyTritonClientValueError",
    "PyTritonClientInvalidUrlError",
    "PyTritonClientUrlParseError",
    "PyTritonClientInferenceServerError",
    "PyTritonClientModelDoesntSupportBatchingError",
    "PyTritonClientTimeoutError",
    "PyTritonClientModelUnavailableError",
    "PyTritonClientClosedError",
    "PyTritonClientQueueFullError",
    "PyTritonClientRuntimeError",
]


class PyTritonClientError(Exception):
    """Base class of every client error."""

    def __init__(self, message: str):
        super().__init__(message)
        self._message = message

    @property
    def message(self) -> str:
        """The human-readable description of the error."""
        return self._message


class PyTritonClientValueError(PyTritonClientError):
    """An argument has a wrong value (e.g. positional and named inputs mixed)."""


class PyTritonClientInvalidUrlError(PyTritonClientValueError):
    """The server URL cannot be used (a kind of ``PyTritonClientValueError``)."""


PyTritonClientUrlParseError = PyTritonClientInvalidUrlError  # older name, same error


class PyTritonClientInferenceServerError(PyTritonClientError):
    """The server answered with an error; the message is the server's (including the callable's error)."""


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
