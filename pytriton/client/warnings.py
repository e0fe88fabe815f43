"""Warnings issued by pytriton's clients (filter them with the standard :mod:`warnings` machinery)."""

from __future__ import annotations

__all__ = ["NotSupportedTimeoutWarning", "PyTritonWarning"]


class PyTritonWarning(UserWarning):
    """Root of every warning pytriton issues."""


class NotSupportedTimeoutWarning(PyTritonWarning):
    """A timeout was requested where the underlying transport cannot apply it (e.g. gRPC control calls)."""
