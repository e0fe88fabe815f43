"""Exceptions raised by the serving side of pytriton.

Every exception derives from :class:`PyTritonError`, so ``except PyTritonError`` catches all of
them. Client-side errors live in :mod:`pytriton.client.exceptions`; both hierarchies share one
private base (:mod:`pytriton._errors`), which gives every error its ``message``. When each class is
raised: docs/configuration.md ("Errors").
"""

# For maintainers (kept out of the API reference):
# Pinned by tests/unit/test_exceptions.py.

from __future__ import annotations

from pytriton._errors import PyTritonBaseError

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


class PyTritonError(PyTritonBaseError):
    """Base class of every serving-side pytriton error; ``.message`` is its description."""


class PyTritonValidationError(PyTritonError):
    """A configuration failed validation, or something checked against a model's configuration.

    Server settings (``TritonConfig`` and its environment variables, ``TritonSecurityConfig``), a
    model's name or version, versions of one name that differ; while serving, requests or a
    callable's outputs that do not fit the model's declared inputs and outputs as ``@batch`` and
    ``convert_output`` check them.
    """


class PyTritonInvalidOperationError(PyTritonError):
    """The operation is not allowed in the object's current state (a stopped ``Triton``, ...)."""


class PyTritonModelAlreadyBoundError(PyTritonInvalidOperationError, PyTritonValidationError):
    """``bind`` was given a model name and version that are already bound.

    A :class:`PyTritonInvalidOperationError`, as NVIDIA PyTriton raises for a duplicate model, and
    a :class:`PyTritonValidationError`, as earlier pytriton releases raised.
    """


class PyTritonBadParameterError(PyTritonError):
    """An argument of an API call has an unsupported value.

    For example an unknown dtype or a bad shape in a ``Tensor``, a bad ``ModelConfig`` or warmup
    in ``bind``, a bad keyword of ``Triton()`` or ``serve()``, a bad decorator argument (the
    defaults of ``@fill_optionals`` are checked against the model on its first call).
    """


class PyTritonModelConfigError(PyTritonError):
    """Triton refused to load a model (its configuration, a failed warmup), or a config cannot be parsed."""


class PyTritonUnrecoverableError(PyTritonError):
    """Raised by an inference callable to signal that serving must stop.

    The request that raised it gets an error response and the ``Triton`` instance then stops
    the server, so ``serve()`` returns.
    """


class PyTritonRuntimeError(PyTritonError):
    """A failure while serving requests: unusable callable outputs, a decorator that cannot proceed."""


class PyTritonServerError(PyTritonError):
    """The tritonserver process could not be started or died unexpectedly.

    The message carries the server's own error lines.
    """


class PyTritonServerNotInstalledError(PyTritonError):
    """No tritonserver installation was found; the message names the command that installs one."""
