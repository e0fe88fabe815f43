"""Unauthenticated requests that crash or bloat tritonserver 2.51 do not end the service (issue 25, items 3, 4).

Against a default server run by ``serve()`` (on a thread, as a user's program would block in it):

* a flood of crash bodies (200 KB of ``[``; a shape whose element count overflows int64) makes
  Triton abort every time; the supervisor restarts it each time (docs/architecture.md,
  "Self-healing") and ``serve()`` never gives up; after the flood the model serves again. The
  recovery time is printed (``-s``), not asserted: the bound here is a liveness bound;
* memory bombs (an 80-byte JSON request declaring ``[1, 2**33]`` UINT8, 8 GiB) never make the
  server's processes resident beyond 2 GiB: tritonserver's private memory is capped
  (``TritonServerProcess.cap_memory``), the allocation fails and the server restarts cleanly;
* a crash body that reaches the first server before pytriton's readiness probe has seen it ready
  is a crash like any other: ``run()`` returns and the server is restarted.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Dict, Iterator, List, Optional

import numpy as np
import pytest

from pytriton.client import ModelClient
from pytriton.model_config import ModelConfig, Tensor
from pytriton.server.process import group_members
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports, wait_for

FLOOD_BODIES = 60
FLOOD_PACE_S = 0.5  # at most 60 bodies in 30 s
FLOOD_CRASHES = 8  # the flood ends once this many crashed the server (the old supervisor gave up at the 6th)
RECOVERY_BOUND_S = 30.0  # liveness bound; the measured time is printed
DEEP_BODY = b"[" * 200_000  # Triton's JSON parser recurses once per bracket
OVERFLOW_BODY = json.dumps(
    {"inputs": [{"name": "x", "shape": [3037000500, 3037000500], "datatype": "UINT8", "data": [1]}]}
).encode()
BOMB_BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 2**33], "datatype": "UINT8", "data": [1]}]}).encode()
PEAK_RSS_LIMIT = 2 << 30


def identity(requests):
    return [{"y": request["x"]} for request in requests]


class Served:
    """A ``Triton`` blocked in ``serve()`` on a thread, and raw HTTP helpers."""

    def __init__(self, triton: Triton, ports: Dict[str, int], thread: threading.Thread):
        self.triton = triton
        self.ports = ports
        self.thread = thread
        self.url = f"http://127.0.0.1:{ports['http_port']}"

    def post(self, body: bytes, timeout_s: float = 60.0) -> Optional[int]:
        """POST an inference body; the status, or None when the connection failed (the server died)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.ports["http_port"], timeout=timeout_s)
        try:
            connection.request("POST", "/v2/models/Identity/infer", body=body)
            response = connection.getresponse()
            response.read()
            return response.status
        except OSError:
            return None
        finally:
            connection.close()

    def serves(self) -> bool:
        """True when one real inference round-trips."""
        body = json.dumps({"inputs": [{"name": "x", "shape": [3], "datatype": "UINT8", "data": [1, 2, 3]}]})
        return self.post(body.encode(), timeout_s=5.0) == 200

    def wait_serving(self, bound_s: float) -> float:
        """Seconds until the model serves again; fails the test past ``bound_s``."""
        started = time.monotonic()
        assert wait_for(self.serves, bound_s, 0.02), f"not serving again within {bound_s} s"
        return time.monotonic() - started


def _identity_server(ports: Dict[str, int]) -> Triton:
    """A default ``Triton`` (max_server_restarts=5 within 60 s) with model Identity bound, not yet run."""
    triton = Triton(config=TritonConfig(**ports))
    triton.bind(
        "Identity",
        identity,
        [Tensor(name="x", shape=(-1,), dtype=np.uint8)],
        [Tensor(name="y", shape=(-1,), dtype=np.uint8)],
        config=ModelConfig(batching=False),
    )
    return triton


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    ports = triton_ports()
    triton = _identity_server(ports)
    failure: List[BaseException] = []

    def serve() -> None:
        try:
            triton.serve(monitoring_period_s=0.2)
        except BaseException as exc:  # noqa: BLE001 - reported by the tests
            failure.append(exc)

    thread = threading.Thread(target=serve, name="test-serve", daemon=True)
    thread.start()
    server = Served(triton, ports, thread)
    try:
        server.wait_serving(120.0)
        yield server
        assert not failure, f"serve() raised: {failure}"
    finally:
        triton._wakeup.set()  # what SIGINT does: serve() stops the server and returns
        thread.join(60.0)
        triton.stop()


SERVER_COMMANDS = ("tritonserver", "triton_python_b")  # /proc comm is cut at 15 characters


def _peak_rss(pids: List[int]) -> Dict[int, int]:
    """VmHWM (bytes) of each live tritonserver or stub process among ``pids``.

    Other processes of the group are left out: a crashing Triton prints its backtrace through
    dozens of short-lived helper processes that never run at the same time.
    """
    peaks = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue
        if fields.get("Name", "").strip() in SERVER_COMMANDS and "VmHWM" in fields:
            peaks[pid] = int(fields["VmHWM"].split()[0]) * 1024
    return peaks


class PeakWatcher:
    """Polls the peak RSS of the server's processes (tritonserver and its stubs, every restart's)."""

    def __init__(self, triton: Triton):
        self._triton = triton
        self.peaks: Dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            server = self._triton._backend.server
            if server is not None and server.pid is not None:
                for pid, peak in _peak_rss(group_members(server.pid)).items():
                    self.peaks[pid] = max(peak, self.peaks.get(pid, 0))
            time.sleep(0.01)

    def __enter__(self) -> PeakWatcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def largest_total(self) -> int:
        return sum(self.peaks.values())


def _attack(served: Served, body: bytes, until: float) -> Optional[str]:
    """Deliver ``body`` before ``until``, retrying while the server refuses connections (restarting).

    Returns ``"crashed"`` (the server that took it died), ``"answered"``, or None (never accepted).
    """
    triton = served.triton
    while time.monotonic() < until:
        server = triton._backend.server
        connection = http.client.HTTPConnection("127.0.0.1", served.ports["http_port"], timeout=30.0)
        try:
            connection.connect()
        except OSError:  # refused: the server is restarting
            connection.close()
            time.sleep(0.01)
            continue
        try:
            connection.request("POST", "/v2/models/Identity/infer", body=body)
            connection.getresponse().read()
            return "answered"
        except OSError:
            # The connection dropped: the server died (its group is killed at once, which also
            # resets connections that its stubs inherited).
            wait_for(lambda taker=server: taker is None or not taker.is_alive(), 10.0, 0.01)
            return "crashed" if server is not None and not server.is_alive() else "answered"
        finally:
            connection.close()
    return None


def test_a_flood_of_crash_bodies_never_ends_the_service(served):
    # Up to FLOOD_BODIES bodies, one every FLOOD_PACE_S (at most 60 in 30 s), each sent as soon as
    # the server accepts a connection within its slot, alternating the two crash shapes, until
    # FLOOD_CRASHES of them crashed the server (about 10 s; 20 bodies paced over a fixed 30 s before).
    triton = served.triton
    restarts_before = triton.server_restarts
    started = time.monotonic()
    outcomes = []
    last_crash = started
    for number in range(FLOOD_BODIES):
        slot_end = started + (number + 1) * FLOOD_PACE_S
        outcomes.append(_attack(served, DEEP_BODY if number % 2 == 0 else OVERFLOW_BODY, slot_end))
        if outcomes[-1] == "crashed":
            last_crash = time.monotonic()
        if outcomes.count("crashed") >= FLOOD_CRASHES:
            break
        time.sleep(max(0.0, slot_end - time.monotonic()))
    flood_s = time.monotonic() - started
    recovery_s = served.wait_serving(RECOVERY_BOUND_S)
    since_crash_s = time.monotonic() - last_crash
    crashes = outcomes.count("crashed")
    print(
        f"\n{len(outcomes)} crash bodies paced over {flood_s:.1f} s: {crashes} crashed the server, "
        f"{outcomes.count(None)} found it restarting for their whole slot, {outcomes.count('answered')} answered; "
        f"{triton.server_restarts - restarts_before} restarts; serving again {recovery_s:.2f} s after the flood's "
        f"end, {since_crash_s:.2f} s after the last crash"
    )
    # Triton 2.51 aborts on each of these bodies (FACTS.md); the old supervisor gave up after the
    # 6th crash within 60 s (max_server_restarts=5).
    assert crashes >= 6, (
        f"only {crashes} of {len(outcomes)} bodies crashed the server ({outcomes}); the test lost its point"
    )
    assert served.thread.is_alive() and triton._supervisor.failure is None  # serve() still blocks
    with ModelClient(served.url, "Identity", init_timeout_s=RECOVERY_BOUND_S) as client:
        x = np.arange(5, dtype=np.uint8)
        np.testing.assert_array_equal(client.infer_sample(x=x)["y"], x)


def test_memory_bombs_stay_under_the_servers_memory_cap(served):
    triton = served.triton
    served.wait_serving(RECOVERY_BOUND_S)
    statuses: List[Optional[int]] = []
    with PeakWatcher(triton) as watcher:
        time.sleep(0.1)  # a first sample of the idle server
        threads = [threading.Thread(target=lambda: statuses.append(served.post(BOMB_BODY))) for _ in range(4)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120.0)
        bombs_s = time.monotonic() - started
        recovery_s = served.wait_serving(RECOVERY_BOUND_S)
    peak = watcher.largest_total()
    print(
        f"\n4 concurrent bombs answered in {bombs_s:.2f} s ({statuses}); peak RSS summed over "
        f"{len(watcher.peaks)} server processes {peak / (1 << 20):.0f} MiB; serving {recovery_s:.2f} s later"
    )
    assert len(statuses) == 4 and 200 not in statuses
    assert watcher.peaks, "the watcher saw no server process"
    assert peak < PEAK_RSS_LIMIT, f"the server's processes reached {peak / (1 << 20):.0f} MiB resident"
    assert served.thread.is_alive() and triton._supervisor.failure is None


def test_a_crash_body_that_beats_the_first_readiness_probe_is_a_crash_not_a_failed_start(monkeypatch):
    # The server listens once its startup models are loaded; a client polling faster than
    # pytriton's readiness probe can crash it before run() has seen it ready. That was reported as
    # "Triton failed to start" and ended serve() (CI, Python 3.9: the flood test's first body
    # arrived in that window); it is a crash like any later one: run() returns, the server restarts.
    ports = triton_ports()
    triton = _identity_server(ports)
    served = Served(triton, ports, threading.current_thread())
    real_probe = triton._backend._probe
    attacks: List[Optional[int]] = []

    def probe_that_loses_the_race():
        probe = real_probe()

        def racing() -> bool:
            # One probe per call: probing twice let the server come up between the two, and then
            # run() saw it ready before any body was sent (a flake of this test, not of pytriton).
            up = probe()
            if up and not attacks:  # up, but before pytriton sees it: the attacker's body lands
                attacks.append(served.post(DEEP_BODY))
                return False
            return up

        return racing

    monkeypatch.setattr(triton._backend, "_probe", probe_that_loses_the_race)
    with triton:
        triton.run()
        served.wait_serving(RECOVERY_BOUND_S)
        assert attacks == [None], "the body did not crash the server"
        # The restart is counted once the supervisor is done with it, which can be a moment after
        # the new server serves.
        assert wait_for(lambda: triton.server_restarts == 1, RECOVERY_BOUND_S), triton.server_restarts
        assert triton._supervisor.failure is None
