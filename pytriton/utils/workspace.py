"""``Workspace`` under the module path NVIDIA PyTriton uses; the class is :mod:`pytriton.server.workspace`'s."""

from __future__ import annotations

from pytriton.server.workspace import Workspace

__all__ = ["Workspace"]
