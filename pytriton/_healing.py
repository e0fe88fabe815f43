"""Self-healing of a running ``Triton``: restarting a dead server, replacing dead stubs, recycling memory.

:class:`SelfHealing` is a mixin of :class:`pytriton.triton.Triton`; its methods run on the
supervisor thread (one event at a time) or report events to it. See docs/architecture.md,
"Self-healing", for what each case does and its limits.

Unit tests: tests/unit/test_restarts.py (the restart loop and its backoff, with a fake clock and a
fake server), tests/unit/test_self_healing.py (which lost stubs are replaced),
tests/unit/test_recycle.py (what recycling reads); restarts, replacements and recycling end to end:
tests/e2e/test_healing.py, tests/e2e/test_memory.py, tests/e2e/test_hostile_requests.py (crash floods).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import pathlib
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from pytriton._exit import describe_exit
from pytriton._plan import LaunchPlan
from pytriton.constants import DEFAULT_TRITON_STARTUP_TIMEOUT_S
from pytriton.exceptions import PyTritonServerError
from pytriton.proxy._binding import BoundModel, backend_region_prefix
from pytriton.proxy.stubside import _segments
from pytriton.server import _recycle
from pytriton.server._restarts import RestartPolicy
from pytriton.server._scratch import ScratchDirTracker
from pytriton.server.process import TritonServerProcess, kill_stub
from pytriton.server.settings import Settings
from pytriton.server.triton_config import TritonConfig

LOGGER = logging.getLogger(__name__)
STARTUP_TIMEOUT_S = float(DEFAULT_TRITON_STARTUP_TIMEOUT_S)  # also for a restarted server


class _State(enum.Enum):
    """Where a ``Triton`` instance is in its life: ``run()`` makes it RUNNING, ``stop()`` STOPPED (for good)."""

    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"


class SelfHealing:
    """Server restarts, stub replacement and shared-memory recycling (a mixin of ``Triton``).

    The attributes and methods declared here without a body are the ``Triton`` state it works on.
    """

    _config: TritonConfig
    _lock: threading.RLock
    _state: _State
    _server: Optional[TritonServerProcess]
    _repository: Optional[pathlib.Path]
    _models: Dict[Tuple[str, int], BoundModel]
    _startup_models: List[str]
    _shm_prefix: str
    _scratch: ScratchDirTracker
    _wakeup: threading.Event
    _launch: Optional[Tuple[LaunchPlan, Dict[str, str]]]
    _events: queue.Queue[Tuple[str, Any]]
    _restart_policy: RestartPolicy
    _restarts: int
    _restarting: bool
    _healing: Set[str]
    _failure: Optional[PyTritonServerError]
    _recycled_at: Dict[str, float]
    _settings: Settings

    def _versions(self, model_name: str) -> List[BoundModel]:
        raise NotImplementedError

    def _model_names(self) -> List[str]:
        raise NotImplementedError

    def _write_name(self, model_name: str) -> None:
        raise NotImplementedError

    def _request_load(self, model_name: str) -> None:
        raise NotImplementedError

    def _apply_trace_settings(self, model_names: Sequence[str]) -> None:
        raise NotImplementedError

    def _ready_probe(self) -> Callable[[], bool]:
        raise NotImplementedError

    def _claim_scratch(self, loaded: bool) -> None:
        raise NotImplementedError

    def _tell_watchdog(self, line: str) -> None:
        raise NotImplementedError

    def _on_server_exit(self, returncode: int) -> None:
        """The server died on its own (called on its log reader thread): let the supervisor restart it."""
        self._events.put(("server", returncode))

    def _on_stub_lost(self, model_name: str, generation: int, server_pid: int) -> None:
        """A stub died without saying goodbye (called on a worker thread): let the supervisor replace it."""
        with self._lock:
            if self._state is not _State.RUNNING or model_name in self._healing or self._restarting:
                return
            if not self._versions(model_name) or not self._stub_loss_is_ours(server_pid):
                return  # unbound meanwhile (its stubs go away), or a stub of a server that is gone
            self._healing.add(model_name)
        LOGGER.error(
            "Model %s: a stub process died (generation %d); replacing the model's instances.", model_name, generation
        )
        self._events.put(("stub", (model_name, generation)))

    def _stub_loss_is_ours(self, server_pid: int) -> bool:
        """True if a stub whose parent was ``server_pid`` died under the running server (replace it).

        Otherwise its server died or was replaced, and restarting the server handles it.
        """
        server = self._server
        return server is not None and server.pid == server_pid and server.is_alive()

    def _server_serving(self) -> bool:
        """True while the server the models are loaded into runs."""
        server = self._server
        return server is not None and server.is_alive()

    def _supervise(self) -> None:
        """Handle server deaths and stub deaths one at a time, until :meth:`stop`.

        This thread also spawns every replacement server: ``PR_SET_PDEATHSIG`` fires when the
        *thread* that forked the server ends, so that thread must live as long as the server.
        """
        # Between events the supervisor looks for grown shared-memory regions of idle models.
        poll_s = self._settings.recycle_idle_s / 4 if self._settings.recycle_byte_size else None
        while True:
            try:
                kind, payload = self._events.get(timeout=poll_s)
            except queue.Empty:
                kind, payload = "recycle", None
            if kind == "stop" or self._state is not _State.RUNNING:
                return
            if kind == "recycle":
                try:
                    self._recycle_grown_models()
                except Exception:  # noqa: BLE001 - memory upkeep must never stop the supervisor
                    LOGGER.exception("pytriton: checking the Python backend's shared memory failed")
                continue
            try:
                if kind == "server":
                    self._restart_server(int(payload))
                else:
                    self._replace_stubs(*payload)
            except Exception:  # noqa: BLE001 - keep supervising
                LOGGER.exception("pytriton: recovering from a %s failure failed", kind)

    def _give_up(self, message: str) -> None:
        """Record why the server is not restarted any more and wake ``serve()`` to raise it."""
        self._failure = PyTritonServerError(message)
        LOGGER.error("%s", self._failure)
        self._wakeup.set()

    def _backoff(self, delay_s: float) -> bool:
        """Wait ``delay_s`` before a restart; False if the instance was stopped meanwhile."""
        deadline = time.monotonic() + delay_s
        while self._state is _State.RUNNING:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, 0.05))
        return False

    def _wait_ready_or_crashed(self) -> bool:
        """Wait for the first server to be ready: True; False if it listened, then died before the probe saw it ready.

        Its startup models had loaded (Triton listens only after that), so such a death is a crash,
        typically a request that killed it (a client polling readiness faster than the probe), never
        a failed start: ``run()`` returns and the supervisor restarts the server as after any crash
        (the server reports no exit itself before it was seen ready, so this queues the report).
        """
        server = self._server
        assert server is not None
        try:
            server.wait_until(self._ready_probe(), STARTUP_TIMEOUT_S, "Triton failed to start")
            return True
        except PyTritonServerError as exc:
            returncode = getattr(server, "returncode", None)  # the embedded server has none
            if not getattr(server, "listening", False) or returncode is None:
                raise
            LOGGER.error("tritonserver died right after it came up (%s); restarting it.", exc)
            self._on_server_exit(returncode)
            return False

    def _restart_server(self, returncode: int) -> None:
        """Start a new server with the same command line after the old one died; wait until it is ready.

        A server that had been serving is always started again, after the delay the restart policy
        (server/_restarts.py) gives: crashes caused by requests must not end the service. Starts
        that fail (the server exits or is not ready in time) are retried a few times, then
        ``serve()`` is woken to raise.
        """
        old = self._server
        assert old is not None and self._launch is not None
        if old.is_alive():
            return  # a late report about a server that was already replaced
        # Its stubs may outlive it, holding their slot locks, its ports and its output pipe: end the
        # whole process group first (that also lets the log reader catch the server's last lines).
        old.stop(grace_s=0.0)
        errors = old.crash_lines()
        reason = describe_exit(returncode) + ("; its last error lines:\n  " + "\n  ".join(errors) if errors else "")
        delay = self._restart_policy.crashed()
        if delay is None:
            self._give_up(f"tritonserver died ({reason}); restarts are off (max_server_restarts=0): giving up.")
            return
        recent = self._restart_policy.recent_crashes()
        LOGGER.error(
            "tritonserver died (%s); restarting it%s (%d crash(es) within %g s).",
            reason,
            f" in {delay:.2f} s" if delay else "",
            recent,
            self._restart_policy.window_s,
        )
        started = time.monotonic()
        with self._lock:
            if self._state is not _State.RUNNING:
                return
            self._restarting = True
        try:
            if delay and not self._backoff(delay):
                return
            while True:
                old.stop(grace_s=0.0)  # idempotent; also ends a replacement that failed to start
                self._scratch.remove()  # the dead server's /tmp/python_env_* (server/_scratch.py)
                _segments.sweep_segments(f"{self._shm_prefix}-pb")  # its Python-backend regions
                plan, env = self._launch
                plan = plan.loading_only(set(self._model_names()))  # a model unbound since run() is not loaded again
                with self._lock:
                    if self._state is not _State.RUNNING:
                        return
                    server = TritonServerProcess(
                        plan.to_argv(),
                        env,
                        log_path=self._config.log_file,
                        data_headroom=self._settings.server_data_headroom,
                    )
                    server.register_on_exit(self._on_server_exit)
                    self._scratch = ScratchDirTracker()
                    if self._models:
                        self._scratch.before_first_load()
                    server.start()
                    self._server = server
                self._tell_watchdog(f"pgid {server.pid}")
                try:
                    server.wait_until(self._ready_probe(), STARTUP_TIMEOUT_S, "Triton failed to restart")
                    for name in self._model_names():
                        if name not in self._startup_models:  # bound after run(): load it again
                            self._request_load(name)
                    self._apply_trace_settings(self._startup_models)  # a new server knows none
                except PyTritonServerError as exc:
                    self._claim_scratch(False)
                    if self._state is not _State.RUNNING:
                        return
                    if server.listening and not server.is_alive():
                        # It accepted connections, then died before pytriton's probe saw it ready:
                        # a request can do that (an attacker polling readiness faster than the
                        # probe), so it is a crash like any other, never a failed start.
                        delay = self._restart_policy.crashed() or 0.0
                        LOGGER.error("tritonserver died right after it came up (%s); restarting it.", exc)
                        if delay and not self._backoff(delay):
                            return
                        old = server
                        continue
                    if not self._restart_policy.start_failed():
                        self._give_up(
                            f"tritonserver could not be started again ({self._restart_policy.failed_starts} "
                            f"failed starts in a row); giving up. Last failure: {exc}"
                        )
                        return
                    LOGGER.error("Restarting tritonserver failed (%s); trying again.", exc)
                    old = server
                    continue
                self._restart_policy.started()
                self._claim_scratch(True)
                break
        finally:
            with self._lock:
                self._restarting = False
        self._restarts += 1
        LOGGER.warning(
            "tritonserver restarted in %.2f s (restart %d; pid %s).",
            time.monotonic() - started,
            self._restarts,
            server.pid,
        )

    def _replace_stubs(self, model_name: str, generation: int) -> None:
        """Reload a model whose stub died, then retire the old generation's stubs.

        Triton 2.51's Python backend neither restarts a dead stub nor unloads a model that has
        sent requests to one (the unload never completes), so pytriton loads a new generation of
        the model next to the old one (its stubs take their own slot locks, see proxy/stubside/_stub.py);
        Triton switches traffic to it once it is ready. The old generation's surviving stubs are
        then ended once idle (Triton may never finalize them).
        """
        try:
            models = self._versions(model_name)
            if not models or models[0].generation != generation or not self._server_serving():
                return  # unbound, already replaced, or the server itself died (restarted as a whole)
            if self._restarting or self._state is not _State.RUNNING:
                return
            assert self._repository is not None
            started = time.monotonic()
            failure = self._load_next_generation(model_name)
            if failure is not None:
                LOGGER.error("Model %s: replacing its dead stub failed: %s", model_name, failure)
                return
            pids = [pid for model in models for pid in model.retire_generation()]
            deadline = time.monotonic() + 5.0
            while (
                any(model.retired_busy for model in models)
                and time.monotonic() < deadline
                and self._state is _State.RUNNING
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
            with self._lock:
                self._healing.discard(model_name)

    def _load_next_generation(self, model_name: str) -> Optional[Exception]:
        """Load every version of a model again with the generation raised (new stubs next to the old).

        Returns the error if it failed (the old generation keeps serving then).
        """
        assert self._repository is not None
        models = self._versions(model_name)
        for model in models:
            model.generation += 1
        try:
            self._write_name(model_name)
            self._request_load(model_name)
        except Exception as exc:  # noqa: BLE001 - reported by the caller, the old generation keeps serving
            for model in models:
                model.generation -= 1
            # The files must describe the generation that serves: a restarted server loads from them.
            with contextlib.suppress(Exception):
                self._write_name(model_name)
            return exc
        return None

    def _recycle_grown_models(self) -> None:
        """Reload idle models whose Python-backend region grew past the limit, giving its memory back.

        A region never shrinks (server/_recycle.py); a new generation of the model gets new stubs
        with new regions, and Triton unloads the old generation, whose stubs then exit normally and
        whose regions are removed. Runs on the supervisor thread, so it never overlaps a restart or
        a stub replacement; a model that served a batch since its last recycle is eligible again.
        """
        server, repository = self._server, self._repository
        if server is None or server.pid is None or repository is None or self._restarting:
            return
        regions = _recycle.stub_regions(server.pid, repository, backend_region_prefix(self._shm_prefix))
        now = time.monotonic()
        for name, resident in _recycle.grown_models(regions, self._settings.recycle_byte_size).items():
            models = self._versions(name)
            if not models or name in self._healing or any(m.busy for m in models) or self._state is not _State.RUNNING:
                continue
            last_active = max(m.last_active for m in models)
            if now - last_active < self._settings.recycle_idle_s or last_active <= self._recycled_at.get(name, 0.0):
                continue  # still in use, or nothing ran since the last recycle (old stubs still exiting)
            self._recycled_at[name] = now
            started = time.monotonic()
            failure = self._load_next_generation(name)
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
