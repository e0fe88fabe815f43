"""pytriton: serve plain Python callables as NVIDIA Triton Inference Server models.

The package root stays import-light on purpose: the proxy module that runs inside Triton's
Python-backend stub may import ``pytriton.proxy`` with only numpy available. The public
submodules (``pytriton.triton``, ``pytriton.decorators``, ``pytriton.model_config``,
``pytriton.client``, ...) are still reachable as attributes of the package, as in NVIDIA
PyTriton (``import pytriton; pytriton.triton.Triton``): each is imported on first access.

Unit tests: tests/unit/test_public_api.py (the exported names), tests/unit/test_api_drift.py
(submodules imported on first access).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__"]

# Submodules loaded on first attribute access (PEP 562), so `import pytriton` imports nothing heavy.
_LAZY_SUBMODULES = frozenset(
    {"client", "constants", "decorators", "exceptions", "model_config", "proxy", "server", "triton", "utils"}
)


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_SUBMODULES})
