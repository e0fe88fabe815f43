"""The running ``Triton`` objects of this process, for ``pytriton.pipeline`` to find bound models.

Kept apart from ``pytriton.pipeline`` so that ``Triton`` can register itself without importing the
clients (tritonclient) at ``import pytriton.triton``. Unit test: tests/unit/test_pipeline.py.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List

_running: List[Any] = []
_lock = threading.Lock()
# Called with a Triton that stops (pytriton.pipeline drops its handles to that Triton's models).
on_unregister: List[Callable[[object], None]] = []


def register(triton: object) -> None:
    """Called by ``Triton.run()``: its models become reachable through ``pytriton.pipeline.model``."""
    with _lock:
        if triton not in _running:
            _running.append(triton)


def unregister(triton: object) -> None:
    """Called by ``Triton.stop()``."""
    with _lock:
        if triton in _running:
            _running.remove(triton)
        hooks = list(on_unregister)
    for hook in hooks:
        hook(triton)


def owners(model_name: str) -> List[Any]:
    """The running Tritons that bind ``model_name``, oldest first."""
    with _lock:
        return [triton for triton in _running if model_name in triton._model_names()]
