"""Readiness that tells the truth while a model's callable hangs: unload it from Triton, load it back when it returns.

Why: a model whose callable hangs, on every instance, with no execution timeout serves nothing: the
stub waits for its worker, Triton queues every further request behind it, and nothing ever fails.
Yet Triton 2.51 answers ``/v2/models/<m>/ready`` (and ``/v2/health/ready``) 200, because readiness
is the model's load state and a backend has no way to change it. The one lever is the load state
itself. Measured with tritonserver 2.51 (tests/e2e/test_unresponsive.py): an unload through the
repository API returns at once; from that moment the model's readiness answers 400 ("Model version
not ready"), strict server readiness 400, and a new request fails at once (404, "... has no
available versions"); the batch in the callable and the requests Triton had already queued for it
are still served when the callable returns; then the instances are finalized and the stubs leave.

So :class:`UnresponsiveWatch` polls every bound model without an execution timeout. When every
instance of a model has been in one and the same call for :data:`UNRESPONSIVE_AFTER_S`, it asks
the supervisor to unload the model from Triton (its binding, workers and files stay); when one of
those calls has returned, to load it again as a new generation (``_healing``'s replacement path:
new stubs next to any that are still leaving). Models with an execution timeout are bounded by it
and left alone; so is a model whose stubs are stopped (``proxy/_stub_watch.py`` handles those:
Triton fails their requests within about a second, and the stub is replaced).

The decision is :class:`HungCalls` (pure, a fake clock in tests); the actions run on the supervisor
thread of :mod:`pytriton._healing` (one event at a time, never during a restart). Hook: the
supervisor starts the watch when it starts (``_healing._supervise``; the watch ends within a poll of
``stop()``) and hands it the events named in :data:`EVENTS`.

Settings: ``PYTRITON_UNRESPONSIVE_AFTER_S`` (read when ``run()`` starts; default 60 s; 0: off).
Unit tests: tests/unit/test_unresponsive.py.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from pytriton.exceptions import PyTritonValidationError

LOGGER = logging.getLogger("pytriton.triton")

ENV = "PYTRITON_UNRESPONSIVE_AFTER_S"
UNRESPONSIVE_AFTER_S = 60.0
POLL_S = 0.25
EVENTS = ("unresponsive", "responsive")
_RELOAD_WAIT_S = 10.0  # how long a reload waits for the batches Triton had queued before the unload

Instance = Tuple[bool, float]
"""What the watch reads of one instance: (busy in a call now, time its last call ended)."""


def limit_from_env(environ: Optional[Dict[str, str]] = None) -> float:
    """``PYTRITON_UNRESPONSIVE_AFTER_S`` in seconds (0: off); a clear error for anything else."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return UNRESPONSIVE_AFTER_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise PyTritonValidationError(
            f"{ENV}={raw!r}: give the seconds after which a model whose every instance is stuck in one call "
            "is reported not ready (0: never)."
        )
    return value


class HungCalls:
    """Which models have had every instance in one unbroken call for ``limit_s`` (or longer).

    An instance is in an unbroken call while it is busy and the end time of its last call has not
    changed since it was first seen busy (a call that ended and a new one that began between two
    polls change that time, so they never add up).
    """

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self._since: Dict[str, List[Optional[Tuple[float, float]]]] = {}  # per instance: (first seen, last end)

    def update(self, name: str, instances: List[Instance], now: float) -> Optional[float]:
        """Record one poll of model ``name``; the seconds its instances have all been stuck, or None."""
        previous = self._since.get(name, [])
        current: List[Optional[Tuple[float, float]]] = []
        for index, (busy, last_end) in enumerate(instances):
            seen = previous[index] if index < len(previous) else None
            if not busy:
                current.append(None)
            elif seen is None or seen[1] != last_end:
                current.append((now, last_end))  # a new call
            else:
                current.append(seen)
        self._since[name] = current
        if not current or any(entry is None for entry in current):
            return None
        stuck = now - max(entry[0] for entry in current if entry is not None)
        return stuck if stuck >= self.limit_s else None

    def still_stuck(self, name: str, instances: List[Instance]) -> bool:
        """True while at least one call recorded as stuck for ``name`` has not returned."""
        recorded = self._since.get(name, [])
        return any(
            entry is not None and index < len(instances) and instances[index] == (True, entry[1])
            for index, entry in enumerate(recorded)
        )

    def forget(self, name: str) -> None:
        self._since.pop(name, None)


class UnresponsiveWatch:
    """A thread that posts ``("unresponsive"|"responsive", model name)`` to the supervisor's queue.

    ``models()`` returns ``{name: [instance states]}`` for every bound model without an execution
    timeout; ``post`` puts an event on the supervisor's queue. Lifetime: :meth:`start` starts a daemon
    thread (nothing if the limit is 0), which ends at :meth:`stop` or once ``running()`` is False (within
    one poll); both are idempotent.
    """

    def __init__(
        self,
        models: Callable[[], Dict[str, List[Instance]]],
        post: Callable[[Tuple[str, Any]], None],
        limit_s: float,
        poll_s: float = POLL_S,
        running: Callable[[], bool] = lambda: True,
    ):
        self._models = models
        self._post = post
        self._running = running
        self.calls = HungCalls(limit_s)
        self.poll_s = poll_s
        self.unloaded: Set[str] = set()  # reported unresponsive, not yet reported back
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        if self._thread is None and self.calls.limit_s > 0:
            self._thread = threading.Thread(target=self._run, name="pytriton-unresponsive-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    def check(self, now: float) -> None:
        """One poll of every model (the thread's body; called directly by the unit tests)."""
        models = self._models()
        for name in list(self.unloaded):
            if name not in models or not self.calls.still_stuck(name, models[name]):
                self.unloaded.discard(name)
                self.calls.forget(name)
                if name in models:
                    self._post(("responsive", name))
        for name, instances in models.items():
            if name in self.unloaded:
                continue
            stuck = self.calls.update(name, instances, now)
            if stuck is not None:
                self.unloaded.add(name)
                self._post(("unresponsive", (name, stuck)))

    def _run(self) -> None:
        while not self._stopped.wait(self.poll_s) and self._running():
            try:
                self.check(time.monotonic())
            except Exception:  # noqa: BLE001 - the watch must outlive a surprise (a model unbound meanwhile)
                LOGGER.exception("pytriton's unresponsive-model watch failed one round")


def watch_for(triton: Any) -> UnresponsiveWatch:
    """The watch for a running ``Triton`` (``_healing.SelfHealing``): its models, its supervisor's queue."""

    def models() -> Dict[str, List[Instance]]:
        found: Dict[str, List[Instance]] = {}
        for name in triton._model_names():
            versions = triton._versions(name)
            if versions and not any(model.execution_timeout_s for model in versions):
                found[name] = [state for model in versions for state in model.instance_states()]
        return found

    def running() -> bool:
        return bool(triton._state.value == "running")  # _healing._State.RUNNING

    try:
        limit_s = limit_from_env()
    except PyTritonValidationError as exc:  # this runs on the supervisor thread, which must not end
        LOGGER.error("%s Using the default, %.0f s.", exc, UNRESPONSIVE_AFTER_S)
        limit_s = UNRESPONSIVE_AFTER_S
    watch = UnresponsiveWatch(models, triton._events.put, limit_s, running=running)
    watch.start()
    return watch


def handle(triton: Any, kind: str, payload: Any) -> None:
    """Act on one event of :data:`EVENTS` on the supervisor thread of ``triton``."""
    if kind == "unresponsive":
        name, stuck = payload
        if not triton._versions(name) or triton._restarting:
            return
        LOGGER.warning(
            "Model %s: every instance has been in one call of the callable for %.1f s and it has no execution "
            "timeout; unloading it from Triton so that its readiness says not ready and new requests fail at once. "
            "It is loaded again when the call returns (set ModelConfig execution_timeout_s to bound its calls, or "
            "%s=0 to keep it loaded).",
            name,
            stuck,
            ENV,
        )
        triton._repository_request("unload", name)
        return
    name = payload
    models = triton._versions(name)
    if not models:
        return
    deadline = time.monotonic() + _RELOAD_WAIT_S  # the requests Triton queued before the unload are served first
    while any(model.busy for model in models) and time.monotonic() < deadline and triton._server_serving():
        time.sleep(0.05)
    started = time.monotonic()
    failure = triton._load_next_generation(name)
    if failure is not None:
        LOGGER.error("Model %s: loading it again after its callable returned failed: %s", name, failure)
        return
    LOGGER.warning(
        "Model %s: its callable returned; loaded it again (generation %d) in %.2f s.",
        name,
        models[0].generation,
        time.monotonic() - started,
    )
