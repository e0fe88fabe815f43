"""The supervisor of a running ``Triton``: restarting a dead server, replacing dead stubs, recycling memory, the drain.

:class:`Supervisor` works on a :class:`~pytriton._serving.backend.ServerBackend` and on the model registry
(:class:`~pytriton._serving.backend.Registry`, the ``Triton``). Its thread handles one event at a time;
:meth:`Supervisor.on_stub_lost` and the backend's exit callback report events to it from other
threads. The drain (:meth:`Supervisor.drain`, :meth:`Supervisor.wait_detached`) runs on the thread
that calls ``Triton.stop()``. See docs/architecture.md, "Self-healing" and "Graceful drain", for what
each case does and its limits.

Resource contract: the supervisor thread (``pytriton-supervisor-<token>``), started by :meth:`start`
and ended by :meth:`request_stop` plus :meth:`join`; every server it starts belongs to the backend.

Unit tests: tests/unit/test_restarts.py (the restart loop and its backoff, with a fake clock and a
fake server), tests/unit/test_self_healing.py (which lost stubs are replaced),
tests/unit/test_recycle.py (what recycling reads, when pinned generations recycle the server); restarts, replacements and recycling end to end:
tests/e2e/test_healing.py, tests/e2e/test_memory.py, tests/e2e/test_hostile_requests.py (crash floods),
tests/e2e/test_supervisor.py (a real EMFILE at a restart retried; a spent budget ending the program).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from typing import Any, Dict, Optional, Sequence, Set, Tuple

from pytriton._exit import describe_exit
from pytriton._serving import unresponsive as _unresponsive
from pytriton._serving.backend import LocalServer, QueueReporting, Registry, RestartableServer, ServerBackend
from pytriton.exceptions import PyTritonServerError
from pytriton.proxy._binding import BoundModel
from pytriton.server import _drain, _recycle, versions
from pytriton.server._restarts import RestartPolicy
from pytriton.server.process import TritonServerProcess, kill_stub
from pytriton.server.settings import Settings

LOGGER = logging.getLogger(__name__)
# When batches were still running as a stop began, it waits this much longer after the last one:
# the worker marks a batch done before its reply reaches the stub, and Triton then writes the
# responses; with 8 instances finishing together on 2 cores that took over 0.1 s
# (tests/e2e/test_drain.py). A stop of an idle server does not pay it.
RESPONSE_SETTLE_S = 0.4


def _one_line(text: str) -> str:
    """``text`` on one line (a server's quoted error output spans several): lines joined with " | "."""
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


def _nothing_queued() -> Dict[Tuple[str, str], int]:
    """The drain's reading of a server whose queues cannot be read (embedded, remote): nothing queued."""
    return {}


def wait_detached(models: Sequence[BoundModel], deadline: float) -> bool:
    """Wait until no stub of ``models`` is attached (or ``deadline``); True if none is.

    Triton's unload call returns once the model stops taking requests, while its stubs are still
    finishing and exiting. Loading the same name again before they have gone races their
    teardown inside the server, so an unload followed by a load waits here in between.
    """
    while any(model.connected for model in models):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


class Supervisor:
    """Server restarts, stub replacement, shared-memory recycling and the drain of one ``Triton``.

    Args:
        registry: the ``Triton``'s models and state.
        backend: where the server runs; restarts only a ``RestartableServer``, recycles only a ``LocalServer``'s
            regions (its capabilities, pytriton/_serving/backend.py).
        settings: the resolved settings (recycling thresholds, drain delay).
        policy: when restarts are delayed or given up (server/_restarts.py).
        name: the thread's name.
    """

    def __init__(
        self, registry: Registry, backend: ServerBackend, settings: Settings, policy: RestartPolicy, name: str
    ) -> None:
        self._registry = registry
        self._backend = backend
        self._settings = settings
        self.policy = policy
        self._name = name
        self._events: queue.Queue[Tuple[str, Any]] = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self.restarts = 0  # how many times the server was restarted after dying on its own
        self.restarting = False
        self.healing: Set[str] = set()  # names of models whose stubs are being replaced
        self.failure: Optional[PyTritonServerError] = None  # why serve() must end
        # Giving grown Python-backend regions back (server/_recycle.py): model -> when it was recycled.
        self._recycled_at: Dict[str, float] = {}
        self._healed_at = 0.0  # time.monotonic() when the last stub replacement ended (see _recycle_pinned_server)
        # Models unloaded because they stopped answering (pytriton/_serving/unresponsive.py), with their generation then.
        self._unresponsive_unloaded: Dict[str, int] = {}
        # Regions of model generations that only a new server process frees (server/_recycle.py), per server pid.
        try:
            self._pinned_limit = _recycle.pinned_limit(dict(os.environ))
        except ValueError as exc:  # as for pytriton's other PYTRITON_* knobs: said, and the default applies
            LOGGER.error("%s Using the default, %d.", exc, _recycle.PINNED_REGIONS_LIMIT)
            self._pinned_limit = _recycle.PINNED_REGIONS_LIMIT
        self._pinned = _recycle.PinnedRegions()
        self._pinned_server: Optional[int] = None
        self._pinned_clean_count = 0  # regions of a scan that found every one with a live stub
        self.recycles = 0  # how many times the server was replaced to free pinned generations
        # What the backend can do beyond the core: only a local server reports its exit and has regions
        # to recycle, and only a restartable one is started again.
        self._local = backend if isinstance(backend, LocalServer) else None
        self._restartable = backend if isinstance(backend, RestartableServer) else None
        if self._local is not None:
            self._local.on_exit(self.on_server_exit)

    # -- the thread -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the supervisor thread (once, from ``run()``)."""
        self._thread = threading.Thread(target=self._supervise, name=self._name, daemon=True)
        self._thread.start()

    def active(self) -> bool:
        """True once :meth:`start` was called (``run()`` finished starting the server)."""
        return self._thread is not None

    def request_stop(self) -> None:
        """Tell the thread to end after the event it handles."""
        self._events.put(("stop", None))

    def join(self, timeout_s: float = 10.0) -> None:
        """Wait for the thread to end (a no-op on the thread itself, or when it never started)."""
        thread = self._thread
        if thread is None or thread is threading.current_thread() or not thread.is_alive():
            return
        thread.join(timeout_s)  # ends within moments once the server is gone (its waits check the state)
        if thread.is_alive():
            LOGGER.warning("The pytriton supervisor thread did not end; leaving it behind.")

    # -- events ---------------------------------------------------------------------------------
    def on_server_exit(self, returncode: int) -> None:
        """The server died on its own (called on its log reader thread): let the supervisor restart it."""
        self._events.put(("server", returncode))

    def on_stub_lost(self, model_name: str, generation: int, server_pid: int) -> None:
        """A stub died without saying goodbye (called on a worker thread): let the supervisor replace it."""
        with self._registry.lock:
            if not self._registry.running() or model_name in self.healing or self.restarting:
                return
            if not self._registry.versions(model_name) or not self._backend.stub_loss_is_ours(server_pid):
                return  # unbound meanwhile (its stubs go away), or a stub of a server that is gone
            self.healing.add(model_name)
        LOGGER.error(
            "Model %s: a stub process died (generation %d); replacing the model's instances.", model_name, generation
        )
        version = versions.server_version()
        if version is not None and versions.DEAD_STUB_REQUEST_UNANSWERED.active(version):
            # Nothing outside the server can answer those requests there; say why a client hangs.
            LOGGER.warning(
                "Model %s: on Triton %s a request that reached the dead stub is never answered (the Python "
                "backend waits for its reply without a timeout; 2.51 fails it): its client waits until its own "
                "timeout. The new generation serves the requests that follow.",
                model_name,
                version,
            )
        self._events.put(("stub", (model_name, generation)))

    def _supervise(self) -> None:
        """Handle server deaths and stub deaths one at a time, until :meth:`stop`.

        This thread also spawns every replacement server: ``PR_SET_PDEATHSIG`` fires when the
        *thread* that forked the server ends, so that thread must live as long as the server.
        """
        # Between events the supervisor looks for grown shared-memory regions of idle models, and for
        # pinned model generations that only a new server process frees.
        polls = bool(self._settings.recycle_byte_size) or self._restartable is not None
        poll_s = self._settings.recycle_idle_s / 4 if polls else None
        # Readiness while a callable hangs or a stub is stopped (pytriton/_serving/unresponsive.py); the watch ends
        # within a poll once the registry stops running.
        _unresponsive.watch_for(self._registry, self._events.put)
        # The upkeep runs every poll_s even while events keep coming (a stub killed every second
        # would otherwise postpone it for as long as the deaths go on).
        next_poll = time.monotonic() + poll_s if poll_s is not None else None
        while True:
            try:
                if next_poll is not None and time.monotonic() >= next_poll:
                    raise queue.Empty
                timeout = None if next_poll is None else max(0.0, next_poll - time.monotonic())
                kind, payload = self._events.get(timeout=timeout)
            except queue.Empty:
                kind, payload = "recycle", None
                next_poll = time.monotonic() + poll_s if poll_s is not None else None
            if kind == "stop" or not self._registry.running():
                return
            if kind == "recycle":
                try:
                    if self._settings.recycle_byte_size:
                        self._recycle_grown_models()
                    self._recycle_pinned_server()
                except Exception:  # noqa: BLE001 - memory upkeep must never stop the supervisor
                    LOGGER.exception("pytriton: checking the Python backend's shared memory failed")
                continue
            try:
                if kind == "server":
                    self._restart_server(int(payload))
                elif kind in _unresponsive.EVENTS:
                    _unresponsive.handle(
                        kind,
                        payload,
                        registry=self._registry,
                        server=self._backend,
                        supervisor=self,
                        unloaded=self._unresponsive_unloaded,
                    )
                else:
                    self._replace_stubs(*payload)
            except Exception as exc:  # noqa: BLE001 - keep supervising
                LOGGER.exception("pytriton: recovering from a %s failure failed", kind)
                if kind == "server" and self._registry.running() and self.failure is None:
                    # The restart retries every failure it knows; one that escapes it leaves no
                    # server: end serve() rather than stay alive serving nothing.
                    self._give_up(
                        f"restarting tritonserver failed unexpectedly ({type(exc).__name__}: {exc}); giving up."
                    )

    def _give_up(self, message: str) -> None:
        """Record why the server is not restarted any more and wake ``serve()`` to raise it.

        The reason is logged as one ERROR line (the server's quoted output joined with " | "): the
        line a process manager's journal shows for why the program ended.
        """
        self.failure = PyTritonServerError(_one_line(message))
        LOGGER.error("%s", self.failure)
        self._registry.wake()

    def _backoff(self, delay_s: float) -> bool:
        """Wait ``delay_s`` before a restart; False if the instance was stopped meanwhile."""
        deadline = time.monotonic() + delay_s
        while self._registry.running():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, 0.05))
        return False

    def _restart_server(self, returncode: int) -> None:
        """Start a new server with the same command line after the old one died; wait until it is ready.

        A server that had been serving is always started again, after the delay the restart policy
        (server/_restarts.py) gives: crashes caused by requests must not end the service. An attempt
        that fails, however it fails (the server exits or is not ready in time, or a step raises:
        ``EMFILE``, ``ENOMEM``, ``EAGAIN`` on fork, a missing file), is retried after the policy's
        growing delay; once its budget is spent, ``serve()`` is woken to raise, so that the program
        exits non-zero. Nothing here ends without either a ready server or a recorded failure.
        """
        if self._restartable is None:  # the embedded server never dies on its own; were it to, nothing restarts it
            self._give_up(f"the Triton server died ({describe_exit(returncode)}) and cannot be restarted; giving up.")
            return
        old = self._restartable.server
        assert old is not None
        if old.is_alive():
            return  # a late report about a server that was already replaced
        # Its stubs may outlive it, holding their slot locks, its ports and its output pipe: end the
        # whole process group first (that also lets the log reader catch the server's last lines).
        # Should that fail (no descriptor left to read /proc), the first attempt below repeats it.
        try:
            old.stop(grace_s=0.0)
        except Exception as exc:  # noqa: BLE001 - retried as part of the restart's first attempt
            LOGGER.debug("Ending the dead tritonserver's process group failed (%s); the restart retries it.", exc)
        errors = old.crash_lines()
        reason = describe_exit(returncode) + ("; its last error lines:\n  " + "\n  ".join(errors) if errors else "")
        delay = self.policy.crashed()
        if delay is None:
            self._give_up(f"tritonserver died ({reason}); restarts are off (max_server_restarts=0): giving up.")
            return
        recent = self.policy.recent_crashes()
        LOGGER.error(
            "tritonserver died (%s); restarting it%s (%d crash(es) within %g s).",
            reason,
            f" in {delay:.2f} s" if delay else "",
            recent,
            self.policy.window_s,
        )
        started = time.monotonic()
        with self._registry.lock:
            if not self._registry.running():
                return
            self.restarting = True
        try:
            if delay and not self._backoff(delay):
                return
            server = self._start_until_ready()
            if server is None:
                return
        finally:
            with self._registry.lock:
                self.restarting = False
        self.restarts += 1
        LOGGER.warning(
            "tritonserver restarted in %.2f s (restart %d; pid %s).",
            time.monotonic() - started,
            self.restarts,
            server.pid,
        )

    def _start_until_ready(self) -> Optional[TritonServerProcess]:
        """Start servers until one is ready with its models; None when stopped meanwhile or given up."""
        backend = self._restartable
        assert backend is not None  # only a restartable server is restarted (_restart_server)
        while True:
            server: Optional[TritonServerProcess] = None
            try:
                with self._registry.lock:
                    if not self._registry.running():
                        return None
                    names = self._registry.model_names()
                    # Loaded by the new server at its start, as at the first: every bound model
                    # without a warmup (bound before run() or loaded live since); a model unbound
                    # since is not loaded again.
                    startup = [name for name in self._registry.startup_models() if name in names]
                    server = backend.replace_server(startup)
                backend.wait_ready(server, "Triton failed to restart")
                for name in names:
                    if name not in startup:  # a model with a warmup: through the repository API
                        self._registry.request_load(name)
                self._registry.apply_trace_settings(startup)  # a new server knows none
            except Exception as exc:  # noqa: BLE001 - any failed step is a failed attempt, retried or given up
                # The attempt's first-load window stays open: its server may still make its Python backend's
                # directory until it is ended, by the next attempt (replace_server) or the stop (release).
                if not self._registry.running():
                    return None
                if (
                    isinstance(exc, PyTritonServerError)
                    and server is not None
                    and server.listening
                    and not server.is_alive()
                ):
                    # It accepted connections, then died before pytriton's probe saw it ready:
                    # a request can do that (an attacker polling readiness faster than the
                    # probe), so it is a crash like any other, never a failed start.
                    delay = self.policy.crashed() or 0.0
                    LOGGER.error("tritonserver died right after it came up (%s); restarting it.", exc)
                    if delay and not self._backoff(delay):
                        return None
                    continue
                what = str(exc) if isinstance(exc, PyTritonServerError) else f"{type(exc).__name__}: {exc}"
                if not self.policy.start_failed():
                    self._give_up(
                        f"tritonserver could not be started again ({self.policy.failed_starts} failed "
                        f"attempts in a row); giving up so that a process manager can restart the program. "
                        f"Last failure: {_one_line(what)}"
                    )
                    return None
                retry = self.policy.retry_delay()
                LOGGER.error(
                    "Restarting tritonserver failed (attempt %d of %d: %s); trying again in %.2f s.",
                    self.policy.failed_starts,
                    self.policy.max_failed_starts,
                    what,
                    retry,
                )
                if not self._backoff(retry):
                    return None
                continue
            self.policy.started()
            backend.after_load(True)
            return server

    def _replace_stubs(self, model_name: str, generation: int) -> None:
        """Reload a model whose stub died, then retire the old generation's stubs.

        Triton 2.51's Python backend neither restarts a dead stub nor unloads a model that has
        sent requests to one (the unload never completes), so pytriton loads a new generation of
        the model next to the old one (its stubs take their own slot locks, see proxy/stubside/_stub.py);
        Triton switches traffic to it once it is ready. The old generation's surviving stubs are
        then ended once idle (Triton may never finalize them).
        """
        try:
            models = self._registry.versions(model_name)
            if not models or models[0].generation != generation or not self._backend.is_serving():
                return  # unbound, already replaced, or the server itself died (restarted as a whole)
            if self.restarting or not self._registry.running():
                return
            started = time.monotonic()
            failure = self.load_next_generation(model_name)
            if failure is not None:
                LOGGER.error("Model %s: replacing its dead stub failed: %s", model_name, failure)
                return
            pids = [pid for model in models for pid in model.retire_generation()]
            deadline = time.monotonic() + 5.0
            while (
                any(model.retired_busy for model in models) and time.monotonic() < deadline and self._registry.running()
            ):
                time.sleep(0.01)
            for pid in pids:
                kill_stub(pid)
            LOGGER.warning(
                "Model %s: a stub process died; loaded generation %d of the model in %.2f s and ended %d old stub(s).",
                model_name,
                models[0].generation,
                time.monotonic() - started,
                len(pids),
            )
        finally:
            with self._registry.lock:
                self.healing.discard(model_name)
                self._healed_at = time.monotonic()

    def load_next_generation(self, model_name: str) -> Optional[Exception]:
        """Load every version of a model again with the generation raised (new stubs next to the old).

        Returns the error if it failed (the old generation keeps serving then).
        """
        models = self._registry.versions(model_name)
        for model in models:
            model.generation += 1
        try:
            self._registry.write_name(model_name)
            self._registry.request_load(model_name)
        except Exception as exc:  # noqa: BLE001 - reported by the caller, the old generation keeps serving
            for model in models:
                model.generation -= 1
            # The files must describe the generation that serves: a restarted server loads from them.
            with contextlib.suppress(Exception):
                self._registry.write_name(model_name)
            return exc
        return None

    def _recycle_grown_models(self) -> None:
        """Reload idle models whose Python-backend region grew past the limit, giving its memory back.

        A region never shrinks (server/_recycle.py); a new generation of the model gets new stubs
        with new regions, and Triton unloads the old generation, whose stubs then exit normally and
        whose regions are removed. Runs on the supervisor thread, so it never overlaps a restart or
        a stub replacement; a model that served a batch since its last recycle is eligible again.
        """
        if self._local is None:
            return  # a remote server's regions are not this process's to read or give back
        server, repository, prefix = self._local.server, self._registry.repository(), self._local.region_prefix
        if server is None or server.pid is None or repository is None or prefix is None or self.restarting:
            return
        threshold = self._settings.recycle_byte_size
        if not _recycle.any_region_over(prefix, threshold):
            return  # the common case, without reading every process's /proc entry
        regions = _recycle.stub_regions(server.pid, repository, prefix)
        now = time.monotonic()
        for name, resident in _recycle.grown_models(regions, threshold).items():
            models = self._registry.versions(name)
            if not models or name in self.healing or any(m.busy for m in models) or not self._registry.running():
                continue
            last_active = max(m.last_active for m in models)
            if now - last_active < self._settings.recycle_idle_s or last_active <= self._recycled_at.get(name, 0.0):
                continue  # still in use, or nothing ran since the last recycle (old stubs still exiting)
            self._recycled_at[name] = now
            started = time.monotonic()
            failure = self.load_next_generation(name)
            if failure is not None:
                LOGGER.warning("Model %s: reloading it to give back shared memory failed: %s", name, failure)
                if not server.is_alive():
                    return  # the server died under the reload: the restart it queued comes next
                continue
            LOGGER.info(
                "Model %s: its Python-backend shared memory had grown to %.0f MiB; reloaded its instances "
                "(generation %d) in %.2f s to give it back.",
                name,
                resident / (1 << 20),
                models[0].generation,
                time.monotonic() - started,
            )

    def _recycle_pinned_server(self) -> None:
        """Replace the server once pinned model generations are worth it (server/_recycle.py).

        A stub death after which Triton was handed a request for the dead instance pins that model
        generation (about 36 threads and one 4 MiB region per instance) for as long as the server
        process lives. When every model has been idle for ``recycle_idle_s``, any pinned region is
        reason enough; under traffic, only :data:`~pytriton.server._recycle.PINNED_REGIONS_LIMIT`
        of them, since the requests that arrive while the new server starts are refused. Only where
        the backend can replace its server (a launched ``tritonserver``); runs on the supervisor
        thread, never during a restart or a stub replacement.
        """
        if self._restartable is None or self.restarting or self.healing:
            return
        server, prefix = self._restartable.server, self._restartable.region_prefix
        if server is None or server.pid is None or prefix is None or not server.is_alive():
            return
        if self._pinned_server != server.pid:  # a new server: nothing of the old one counts
            self._pinned.reset()
            self._pinned_server, self._pinned_clean_count = server.pid, 0
        regions = _recycle.server_regions(prefix)
        if not self._pinned.tracking and len(regions) <= self._pinned_clean_count:
            return  # the common case, without reading every process's /proc entry
        pinned = self._pinned.update(regions, _recycle.live_stub_regions(server.pid, prefix))
        if not self._pinned.tracking:
            self._pinned_clean_count = len(regions)
        models = self._registry.models()
        busy = any(model.busy for model in models)
        # A request still waiting at a dead stub's instance is no batch: idle counts from the end of the
        # last stub replacement too, and not before DEAD_REQUEST_S after it (server/_recycle.py).
        now = time.monotonic()
        if now - self._healed_at < _recycle.DEAD_REQUEST_S:
            busy = True
        idle_for = None if busy else now - max([m.last_active for m in models] + [self._healed_at])
        reason = _recycle.server_recycle_reason(
            len(pinned), self._pinned_limit, idle_for, self._settings.recycle_idle_s
        )
        if reason is not None:
            self._recycle_server(reason)

    def _recycle_server(self, reason: str) -> None:
        """Let the batches in flight end (at most ``exit_timeout_s``), then start a new server as a restart does."""
        with self._registry.lock:
            if not self._registry.running() or self.restarting or self.healing:
                return
            self.restarting = True
        started = time.monotonic()
        try:
            deadline = started + self._settings.exit_timeout_s
            while any(m.busy for m in self._registry.models()) and time.monotonic() < deadline:
                if not self._registry.running():
                    return
                time.sleep(0.01)
            LOGGER.warning("pytriton: replacing tritonserver to free what stub deaths left in it (%s).", reason)
            server = self._start_until_ready()
        finally:
            with self._registry.lock:
                self.restarting = False
        if server is not None:
            self.recycles += 1
            LOGGER.warning(
                "tritonserver replaced in %.2f s (pid %s); the pinned model generations are gone.",
                time.monotonic() - started,
                server.pid,
            )

    # -- the drain (on the thread that stops the Triton) -------------------------------------------
    def drain(self, deadline: float) -> bool:
        """After SIGINT: the drain delay, then refuse new batches and wait for those in flight."""
        return _drain.drain(
            deadline,
            self._settings.drain_delay_s,
            self._registry.models,
            self.wait_detached,
            self._backend.is_serving,
            self._backend.pending_requests if isinstance(self._backend, QueueReporting) else _nothing_queued,
        )

    def wait_detached(self, deadline: float) -> bool:
        """After SIGINT: True once nothing can still be in flight, so the server may be killed.

        Triton keeps serving open keep-alive connections after SIGINT and only unloads models when
        they close (or after ``exit_timeout_secs``), then polls once per second. Waiting for that
        would make every stop take seconds, so pytriton watches its own workers instead: when
        every instance has said goodbye, or none has worked for a quiet period longer than any
        batcher queue delay (plus ``RESPONSE_SETTLE_S`` when batches ran during the stop or ended
        less than ``RESPONSE_SETTLE_S`` before it, so that their responses are written), no request is left to finish. Batches refused while draining do not count as
        work (their answer needs no callable).
        """
        quiet_s = 0.1 + max((model.max_queue_delay_s for model in self._registry.models()), default=0.0)
        signalled = time.monotonic()
        busy_at_start = any(model.busy for model in self._registry.models())
        while time.monotonic() < deadline:
            if not self._backend.is_serving():
                return False
            models = self._registry.models()
            # A batch cannot legitimately run past its model's execution timeout: stop waiting then.
            busy = [
                model
                for model in models
                if model.busy
                and (model.execution_timeout_s is None or time.monotonic() - signalled < model.execution_timeout_s)
            ]
            if not busy:
                if not any(model.connected for model in models):
                    return True
                worked = max((model.last_active for model in models), default=0.0)
                # A batch that ended just before the stop (the one that raised an unrecoverable error,
                # which is what started it) may not have its response written yet either.
                recent = busy_at_start or worked > signalled - RESPONSE_SETTLE_S
                settle = quiet_s + (RESPONSE_SETTLE_S if recent else 0.0)
                if time.monotonic() - max(signalled, worked) >= settle:
                    return True
            time.sleep(0.005)
        return False
