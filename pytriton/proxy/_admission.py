"""The drain's admission budget: how many already-queued requests of a model may still run once ``Triton.stop`` drains.

The drain (:mod:`pytriton.server._drain`) creates one per model and hands it to the model's workers, in this process or
in a worker process (:mod:`pytriton.proxy._process_child`); it lives here, below both, so the workers never import the
server side. Unit test: tests/unit/test_drain.py.
"""

from __future__ import annotations

import threading

__all__ = ["Admission"]


class Admission:
    """How many more requests of one model may still run while draining; shared by its instances.

    ``admit(n)`` is True while any of the budget is left (a batch that straddles the end still
    runs whole: serving a few requests more is harmless, refusing one that was queued is not).
    """

    def __init__(self, budget: int):
        self._left = budget
        self._lock = threading.Lock()

    def remaining(self) -> int:
        """The budget left (at most 0 once spent)."""
        with self._lock:
            return self._left

    def admit(self, requests: int) -> bool:
        with self._lock:
            if self._left <= 0:
                return False
            self._left -= requests
            return True
