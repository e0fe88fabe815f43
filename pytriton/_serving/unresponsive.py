"""A model that cannot answer: free its instances from calls that never end; replace stubs that are all stopped.

Why: a model whose callable hangs on every instance, with no execution timeout, serves nothing: the
stub waits for its worker, Triton queues every further request behind it, and nothing ever fails.

The rule (issue 42): **the watch never unloads a model for a slow or hung call, and never refuses a
request while any instance can serve.** Unloading made Triton answer every new request 404 ("has
no available versions"), also while the other instances were idle and while the slow calls were
about to finish (measured: 33 of 94 instant requests failed beside two 6 s calls with a 4 s limit,
and one 300 s call kept a two-instance model down). Triton's dynamic batcher already sends requests
only to idle instances, so one stuck instance costs nothing but its own capacity. So:

* as long as one instance of a model is free, nothing happens;
* once every instance has been in one and the same call for :data:`UNRESPONSIVE_AFTER_S` (only
  where the model has no execution timeout, which bounds its calls otherwise, and is not
  decoupled), the watch fails those calls: each stub gets the retryable answer
  :data:`STUCK_TEXT` (HTTP 503, gRPC UNAVAILABLE) at once and its instance serves the requests
  queued behind it. A thread instance's call is told it was abandoned (``CallAbandoned``, its
  requests read as cancelled) and its result is discarded, in a thread or in a worker process; a
  backend instance's call is failed the same way through a signal to its stub, which is killed and
  replaced by the supervisor only if the call does not end (proxy/_backend_kind.py). The model
  stays loaded and ready throughout: it can serve again at once.
* A stub stopped by a signal cannot take a request at all: when every instance's stub has been
  stopped for :data:`STOPPED_AFTER_S`, a new generation of stubs is loaded next to them at once
  (requests wait in Triton's queue meanwhile) and the stopped ones are killed once it serves, so
  that only the requests Triton had already given them fail (Triton's 500). The model is not
  unloaded: without a ready version Triton answers every request 404 (it did for 2.8 s).

The decision is :class:`HungCalls` (pure, a fake clock in tests); the actions run on the supervisor
thread of :mod:`pytriton._serving.supervisor` (one event at a time, never during a restart). Hook: the
supervisor starts the watch when it starts (``supervisor.Supervisor._supervise``; the watch ends within a poll of
``stop()``) and hands it the events named in :data:`EVENTS`.

Settings: ``PYTRITON_UNRESPONSIVE_AFTER_S`` (read when ``run()`` starts; default 60 s; 0: the watch
is off, for stopped stubs too).
Unit tests: tests/unit/test_unresponsive.py; end to end: tests/e2e/test_unresponsive.py.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Protocol, Set, Tuple

from pytriton.exceptions import PyTritonValidationError
from pytriton.proxy.stubside._messages import STUCK_TEXT
from pytriton.server.process import kill_stub

LOGGER = logging.getLogger("pytriton.triton")

ENV = "PYTRITON_UNRESPONSIVE_AFTER_S"
UNRESPONSIVE_AFTER_S = 60.0
POLL_S = 0.25
EVENTS = ("unresponsive", "responsive", "stuck")
_RELOAD_WAIT_S = 10.0  # how long a reload waits for the batches Triton had queued before the unload

Instance = Tuple[bool, float, bool]
"""What the watch reads of one instance: (busy in a call now, time its last call ended, its stub is stopped)."""

STOPPED_AFTER_S = 0.5
"""How long a stub must stay stopped (state ``T``) before it counts as unresponsive: a moment's stop passes."""


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
            f"{ENV}={raw!r}: give the seconds after which the calls of a model whose every instance is stuck in "
            "one call are failed with a retryable error (0: never)."
        )
    return value


# (first seen stuck, last call's end then, stopped rather than busy, its call was already failed by the watch)
_Entry = Tuple[float, float, bool, bool]


class Stuck(NamedTuple):
    """What :meth:`HungCalls.update` reports of a model whose every instance is stuck."""

    seconds: float  # how long the most recent of them has been stuck
    why: str
    busy: List[int]  # the instances stuck in one call, whose calls are to be failed (empty: every stub is stopped)


class HungCalls:
    """Which models have every instance stuck: in one unbroken call for ``limit_s``, or its stub stopped.

    An instance is in an unbroken call while it is busy and the end time of its last call has not
    changed since it was first seen busy (a call that ended and a new one that began between two
    polls change that time, so they never add up). A stopped stub counts after
    ``min(limit_s, STOPPED_AFTER_S)``. A call reported once (:attr:`Stuck.busy`) is not reported
    again, and its instance counts as free from then on (its call is being failed, so it serves
    again at once or after its worker process is replaced).
    """

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self._since: Dict[str, List[Optional[_Entry]]] = {}

    def update(self, name: str, instances: List[Instance], now: float) -> Optional[Stuck]:
        """Record one poll of model ``name``; a :class:`Stuck` if every instance is stuck, else None."""
        previous = self._since.get(name, [])
        current: List[Optional[_Entry]] = []
        for index, (busy, last_end, stopped) in enumerate(instances):
            seen = previous[index] if index < len(previous) else None
            if stopped:
                current.append(seen if seen is not None and seen[2] else (now, last_end, True, False))
            elif not busy:
                current.append(None)
            elif seen is None or seen[2] or seen[1] != last_end:
                current.append((now, last_end, False, False))  # a new call
            else:
                current.append(seen)
        self._since[name] = current
        # A failed call's instance can serve (again soon): the model is not stuck while it does.
        entries = [entry for entry in current if entry is not None and not entry[3]]
        if not current or len(entries) < len(current):
            return None
        limits = [min(self.limit_s, STOPPED_AFTER_S) if entry[2] else self.limit_s for entry in entries]
        if any(now - entry[0] < limit for entry, limit in zip(entries, limits)):
            return None
        stuck_calls = [index for index, entry in enumerate(current) if entry is not None and not entry[2]]
        for index in stuck_calls:
            entry = current[index]
            assert entry is not None
            current[index] = (entry[0], entry[1], False, True)
        why = "in one call of the callable" if stuck_calls else "its stub is stopped"
        return Stuck(now - max(entry[0] for entry in entries), why, stuck_calls)

    def still_stuck(self, name: str, instances: List[Instance]) -> bool:
        """True while at least one instance recorded as stopped for ``name`` still is."""
        for index, entry in enumerate(self._since.get(name, [])):
            if entry is None or index >= len(instances) or not entry[2]:
                continue
            if instances[index][2]:
                return True
        return False

    def forget(self, name: str) -> None:
        self._since.pop(name, None)


class UnresponsiveWatch:
    """A thread that posts the events of :data:`EVENTS` to the supervisor's queue.

    ``("stuck", (name, Stuck))``: every instance is stuck and ``Stuck.busy`` are in a call to fail;
    ``("unresponsive", (name, (seconds, why)))``: every stub is stopped (replace them);
    ``("responsive", name)``: a stopped stub of an unloaded model resumed or was replaced.

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
        self.unloaded: Set[str] = set()  # every stub stopped: reported unresponsive, not yet reported back
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
            if stuck is None:
                continue
            if stuck.busy:  # fail the stuck calls; the model stays loaded (module docstring)
                self._post(("stuck", (name, stuck)))
            else:  # every stub is stopped: nothing can serve until the replacement loads
                self.unloaded.add(name)
                self._post(("unresponsive", (name, (stuck.seconds, stuck.why))))

    def _run(self) -> None:
        while not self._stopped.wait(self.poll_s) and self._running():
            try:
                self.check(time.monotonic())
            except Exception:  # noqa: BLE001 - the watch must outlive a surprise (a model unbound meanwhile)
                LOGGER.exception("pytriton's unresponsive-model watch failed one round")


class Supervised(Protocol):
    """What the watch needs of the supervisor (``supervisor.Supervisor``) whose thread runs its actions."""

    restarting: bool

    def load_next_generation(self, model_name: str) -> Optional[Exception]:
        """Load ``model_name`` again as a new generation of stubs; the failure, if any."""


class Models(Protocol):
    """What the watch reads of the ``Triton``'s models (``backend.Registry``)."""

    def running(self) -> bool: ...

    def versions(self, model_name: str) -> List[Any]: ...

    def model_names(self) -> List[str]: ...


class Server(Protocol):
    """What the watch asks of the server (``backend.ServerBackend``)."""

    def repository_request(self, action: str, model_name: str) -> None: ...

    def is_serving(self) -> bool: ...


def watch_for(registry: Models, post: Callable[[Tuple[str, Any]], None]) -> UnresponsiveWatch:
    """The watch for a running ``Triton``'s models; its events go to the supervisor's queue through ``post``."""

    def models() -> Dict[str, List[Instance]]:
        found: Dict[str, List[Instance]] = {}
        for name in registry.model_names():
            for model in registry.versions(name):
                # A call bounded by an execution timeout is not stuck, nor is a streaming call (a decoupled
                # model's generator may rightly run for minutes, and its timeout bounds each response, not
                # the call); a stopped stub is, whatever the kind of model.
                bounded = bool(model.execution_timeout_s) or bool(getattr(model.config, "decoupled", False))
                states = model.instance_states()
                found.setdefault(name, []).extend((busy and not bounded, end, stop) for busy, end, stop in states)
        return found

    try:
        limit_s = limit_from_env()
    except PyTritonValidationError as exc:  # this runs on the supervisor thread, which must not end
        LOGGER.error("%s Using the default, %.0f s.", exc, UNRESPONSIVE_AFTER_S)
        limit_s = UNRESPONSIVE_AFTER_S
    watch = UnresponsiveWatch(models, post, limit_s, running=registry.running)
    watch.start()
    return watch


def handle(
    kind: str, payload: Any, *, registry: Models, server: Server, supervisor: Supervised, unloaded: Dict[str, int]
) -> None:
    """Act on one event of :data:`EVENTS` on the supervisor's thread.

    ``unloaded``: the supervisor's record of the models whose every stub was stopped, with their generation
    then (the name is kept from when they were unloaded; now they are replaced).
    """
    if kind == "stuck":
        _fail_stuck_calls(payload, registry=registry, supervisor=supervisor)
        return
    if kind == "unresponsive":
        name, (stuck, why) = payload
        models = registry.versions(name)
        if not models or supervisor.restarting:
            return  # unbound meanwhile, or the restart in progress loads every model again anyway
        # Not unloaded (issue 42 item 4): with no ready version Triton answers every request 404 (2.8 s of
        # them, measured). A new generation of stubs is loaded next to the stopped ones at once, as for a
        # dead stub: requests wait in Triton's queue meanwhile, and Triton switches to it once it is ready.
        unloaded[name] = models[0].generation
        started = time.monotonic()
        failure = supervisor.load_next_generation(name)
        if failure is not None:
            LOGGER.error("Model %s: every stub is stopped, and loading new ones failed: %s", name, failure)
            return
        # The stopped stubs answer nothing again (and a resumed one would abort Triton, proxy/_stub_watch.py):
        # end them now rather than at the stub watch's limit, so that what Triton gave them fails at once.
        pids = [pid for model in models for pid in model.retire_generation()]
        ended = sum(1 for pid in pids if kill_stub(pid))
        LOGGER.warning(
            "Model %s: every instance's stub has been stopped for %.1f s (%s); loaded new stubs (generation %d) in "
            "%.2f s and ended %d stopped one(s); requests that Triton had given them failed (%s=0 turns this off).",
            name,
            stuck,
            why,
            models[0].generation,
            time.monotonic() - started,
            ended,
            ENV,
        )
        return
    name = payload
    models = registry.versions(name)
    generation = unloaded.pop(name, None)
    if not models or generation is None:
        return  # unbound, or never unloaded
    if models[0].generation != generation:
        return  # replaced (the stopped-stub case above, or by the supervisor after a stub death)
    deadline = time.monotonic() + _RELOAD_WAIT_S  # the requests Triton queued before the unload are served first
    while any(model.busy for model in models) and time.monotonic() < deadline and server.is_serving():
        time.sleep(0.05)
    started = time.monotonic()
    failure = supervisor.load_next_generation(name)
    if failure is not None:
        LOGGER.error("Model %s: loading it again after it answered failed: %s", name, failure)
        return
    LOGGER.warning(
        "Model %s: it answers again; loaded it again (generation %d) in %.2f s.",
        name,
        models[0].generation,
        time.monotonic() - started,
    )


def _fail_stuck_calls(payload: Tuple[str, Stuck], *, registry: Models, supervisor: Supervised) -> None:
    """Fail the calls of a model whose every instance is stuck; the model stays loaded (module docstring).

    ``Stuck.busy`` numbers the instances of every bound version of the model in turn, as ``watch_for``
    lists them; each bound model fails its own (``BoundModel.fail_stuck_calls``).
    """
    name, stuck = payload
    models = registry.versions(name)
    if not models or supervisor.restarting:
        return  # unbound meanwhile, or the restart in progress ends every call anyway
    LOGGER.warning(
        "Model %s: every instance has been in one call for %.1f s (%s); failing %d such call(s) with a retryable "
        "error (HTTP 503, gRPC UNAVAILABLE) so that the requests queued behind them are served. The model stays "
        "loaded. Give a model whose calls may rightly run that long an execution_timeout_s, more instances, or a "
        "larger %s.",
        name,
        stuck.seconds,
        ENV,
        len(stuck.busy),
        ENV,
    )
    offset = 0
    for model in models:
        count = len(model.instance_states())
        mine = [index - offset for index in stuck.busy if offset <= index < offset + count]
        if mine:
            # Half the time it was seen stuck: a call begun since the poll is a few milliseconds old.
            model.fail_stuck_calls(mine, STUCK_TEXT, stuck.seconds / 2)
        offset += count
