"""Exceptions raised by the serving side of pytriton.

Every exception derives from :class:`PyTritonError`, so ``except PyTritonError`` catches all of
them. Client-side errors live in :mod:`pytriton.client.exceptions`.
"""

from __future__ import annotations

__all__ = [
    "PyTritonError",
    "PyTritonValidationError",
    "PyTritonInvalidOperationError",
    "PyTritonModelAlreadyBoundError",
    "PyTritonBadParameterError",
    "PyTritonModelConfigError",
    "PyTritonUnrecoverableError",
    "PyTritonRuntimeError",
    "PyTritonServerError",
    "PyTritonServerNotInstalledError",
]


class PyTritonError(Exception):
    """Base class of every pytriton error."""

    def __init__(self, message: str):
        super().__init__(message)
        self._message = message

    @property
    def message(self) -> str:
        """The human-readable description of the error."""
        return self._message


class PyTritonValidationError(PyTritonError):
    """A configuration or an argument failed validation."""


class PyTritonInvalidOperationError(PyTritonError):
    """The operation is not allowed in the object's current state."""


class PyTritonModelAlreadyBoundError(PyTritonInvalidOperationError, PyTritonValidationError):
    """``bind`` was given a model name and version that are already bound.

    A :class:`PyTritonInvalidOperationError`, as NVIDIA PyTriton raises for a duplicate model, and
    a :class:`PyTritonValidationError`, as earlier pytriton releases raised.
    """


class PyTritonBadParameterError(PyTritonError):
    """A parameter has an unsupported value (for example an unknown dtype)."""


class PyTritonModelConfigError(PyTritonError):
    """A model configuration is inconsistent or cannot be generated or parsed."""


class PyTritonUnrecoverableError(PyTritonError):
    """Raised by an inference callable to signal that serving must stop.

    The request that raised it gets an error response and the ``Triton`` instance then stops
    the server, so ``serve()`` returns.
    """


class PyTritonRuntimeError(PyTritonError):
    """A failure while serving requests (bad callable output, proxy failure, ...)."""


class PyTritonServerError(PyTritonError):
    """The tritonserver process could not be started or died unexpectedly.

    The message carries the server's own error lines.
    """


class PyTritonServerNotInstalledError(PyTritonError):
    """No tritonserver installation was found; the message names the command that installs one."""
