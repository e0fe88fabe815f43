"""The base every pytriton exception shares, serving side and client side alike.

:class:`pytriton.exceptions.PyTritonError` (serving) and
:class:`pytriton.client.exceptions.PyTritonClientError` (clients) both derive from
:class:`PyTritonBaseError`, which holds the one piece of behaviour they have in common: the
message given to the constructor, read back as ``.message`` and as ``str(error)``. The two public
hierarchies stay separate (``except PyTritonError`` does not catch client errors), as in NVIDIA
PyTriton. Pinned by tests/unit/test_exceptions.py.
"""

from __future__ import annotations

__all__ = ["PyTritonBaseError"]


class PyTritonBaseError(Exception):
    """An exception with a human-readable ``message`` (also its ``str()`` and its only argument)."""

    def __init__(self, message: str):
        super().__init__(message)  # args == (message,): str(), repr() and pickling need nothing more
        self._message = message

    @property
    def message(self) -> str:
        """The human-readable description of the error."""
        return self._message
