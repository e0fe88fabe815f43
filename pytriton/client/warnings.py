"""Warnings issued by pytriton's clients (filter them with the standard :mod:`warnings` machinery)."""

# For maintainers (kept out of the API reference):
# Unit test: tests/unit/test_client_core.py (the warning's type and when it is raised).

from __future__ import annotations

__all__ = ["NotSupportedTimeoutWarning", "PyTritonWarning"]


class PyTritonWarning(UserWarning):
    """Root of every warning pytriton issues."""


class NotSupportedTimeoutWarning(PyTritonWarning):
    """A timeout was requested where the underlying transport cannot apply it (e.g. gRPC control calls)."""
