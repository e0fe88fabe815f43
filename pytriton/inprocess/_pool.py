"""Released inference requests of one :class:`~pytriton.inprocess.Server`, kept for reuse by later calls.

Why: a new request costs ``InferenceRequestNew`` (which looks the model up), the two callback setters
and, once released, ``InferenceRequestDelete``: about 20 us of CPU per call here. Triton hands a
request back through its release callback; sent again after ``InferenceRequestRemoveAllInputs``, it
costs one call instead.

Contract (enforced by ``pytriton.inprocess._request`` and the server):

* Only *plain* requests are pooled and reused: inputs and nothing else (no id, flags, correlation
  id, priority, timeout or parameters: the C API cannot clear parameters), so after
  ``RemoveAllInputs`` a reused request carries nothing of its previous call.
* A request enters the pool only when Triton has released it *and* its final response has been
  delivered, so no callback of its previous call can arrive once it is taken; it keeps its
  bookkeeping key (its callbacks' user pointer), which is free again by then.
* A request holds the model object it was created for. The server calls :meth:`invalidate` around
  every model-control call (load, unload, repository poll and (un)registration): the idle requests
  are deleted and requests created before are refused later, so none keeps a model being unloaded
  alive or sends to a replaced version. :meth:`close` (at ``stop()``, before ``ServerStop``) deletes
  the idle requests and refuses every later one.
* Every request is deleted exactly once: by whoever fails to pool it, or when it leaves the pool
  through :meth:`invalidate` or :meth:`close`.

Unit test: tests/unit/test_inprocess_pool.py (on a fake library); with the server:
tests/e2e/test_inprocess_server.py.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Optional, Tuple

LOGGER = logging.getLogger(__name__)

ModelKey = Tuple[bytes, int]
# (request handle, its bookkeeping key, the pool generation it was created in)
Entry = Tuple[int, int, int]


class RequestPool:
    """Idle released requests per (model name, version); at most ``capacity`` per model."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self.generation = 0
        self._lock = threading.Lock()
        self._idle: Dict[ModelKey, List[Entry]] = {}
        self._open = True

    def take(self, model: ModelKey) -> Optional[Entry]:
        """An idle request of ``model`` (now the caller's), or None."""
        with self._lock:
            idle = self._idle.get(model)
            return idle.pop() if idle else None

    def put(self, model: ModelKey, entry: Entry) -> bool:
        """Keep a released request; False (the caller deletes it) if closed, stale or full."""
        with self._lock:
            if not self._open or entry[2] != self.generation:
                return False
            idle = self._idle.setdefault(model, [])
            if len(idle) >= self.capacity:
                return False
            idle.append(entry)
            return True

    def idle_count(self, model: Optional[ModelKey] = None) -> int:
        """Requests waiting in the pool, of ``model`` or of all models (for tests and diagnostics)."""
        with self._lock:
            if model is not None:
                return len(self._idle.get(model, ()))
            return sum(len(idle) for idle in self._idle.values())

    def invalidate(self, lib: object) -> None:
        """Delete the idle requests and refuse those created before (the models may change now)."""
        with self._lock:
            self.generation += 1
            entries = self._drain()
        delete_requests(lib, entries)

    def close(self, lib: object) -> None:
        """Delete the idle requests and refuse every later one (the server stops)."""
        with self._lock:
            self._open = False
            self.generation += 1
            entries = self._drain()
        delete_requests(lib, entries)

    def _drain(self) -> List[Entry]:
        entries = [entry for idle in self._idle.values() for entry in idle]
        self._idle.clear()
        return entries


def delete_requests(lib: object, entries: List[Entry]) -> None:
    """``InferenceRequestDelete`` each entry's request (errors are logged: nothing else to do)."""
    for handle, _, _ in entries:
        delete_request(lib, handle)


def delete_request(lib: Any, handle: int) -> None:
    """``InferenceRequestDelete`` one request Triton no longer owns (an error is logged)."""
    error = lib.TRITONSERVER_InferenceRequestDelete(handle)
    if error:
        LOGGER.warning("deleting a released request failed: %s", lib.error_message(error))
        lib.TRITONSERVER_ErrorDelete(error)
