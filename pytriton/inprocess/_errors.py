"""Exception classes of the in-process API and their mapping from ``TRITONSERVER_Error`` codes.

Unit test: tests/unit/test_inprocess.py.
"""

from __future__ import annotations

from typing import Dict, Type

from pytriton.inprocess._enums import ErrorCode


class TritonError(Exception):
    """Base class of every error the in-process API raises for a Triton failure."""

    code: ErrorCode = ErrorCode.UNKNOWN


class UnknownError(TritonError):
    """Triton reported an error without a category."""

    code = ErrorCode.UNKNOWN


class InternalError(TritonError):
    """Triton failed internally (this includes a model that raised inside ``execute``)."""

    code = ErrorCode.INTERNAL


class NotFoundError(TritonError):
    """A model, version, repository or tensor does not exist."""

    code = ErrorCode.NOT_FOUND


class InvalidArgumentError(TritonError):
    """An argument is malformed: wrong input name, dtype or shape, bad option, bad config."""

    code = ErrorCode.INVALID_ARG


class UnavailableError(TritonError):
    """The server or model cannot take the call now (not ready, stopped, timed out)."""

    code = ErrorCode.UNAVAILABLE


class UnsupportedError(TritonError):
    """The operation is not supported here (for example GPU memory on a machine without GPUs)."""

    code = ErrorCode.UNSUPPORTED


class AlreadyExistsError(TritonError):
    """The object (for example a registered repository or name mapping) already exists."""

    code = ErrorCode.ALREADY_EXISTS


class CancelledError(TritonError):
    """The request was cancelled before it completed."""

    code = ErrorCode.CANCELLED


_BY_CODE: Dict[int, Type[TritonError]] = {
    cls.code: cls
    for cls in (
        UnknownError,
        InternalError,
        NotFoundError,
        InvalidArgumentError,
        UnavailableError,
        UnsupportedError,
        AlreadyExistsError,
        CancelledError,
    )
}


def error_class(code: int) -> Type[TritonError]:
    """Exception class for a ``TRITONSERVER_Error_Code``; unknown codes map to :class:`UnknownError`."""
    return _BY_CODE.get(int(code), UnknownError)


def error_from_code(code: int, message: str) -> TritonError:
    """Exception instance for a Triton error code and message."""
    return error_class(code)(message)
