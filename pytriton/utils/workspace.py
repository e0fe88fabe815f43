"""``Workspace`` under the module path NVIDIA PyTriton uses; the class is :mod:`pytriton.server.workspace`'s.

Unit tests: tests/unit/test_api_drift.py (this path), tests/unit/test_workspace.py (``Workspace``
itself).
"""

from __future__ import annotations

from pytriton.server.workspace import Workspace

__all__ = ["Workspace"]
