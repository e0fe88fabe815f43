"""How busy the host is while the bench runs: the context for every latency ratio it reports.

On a virtual machine, sequential latency depends less on how fast code runs than on how long it
takes to wake a process on a CPU that had gone idle. On the 2-vCPU development VM that cost
changes several-fold from one hour to the next with the load of other tenants, and the proxy adds
one such wake-up per request. So the bench records it before and after the runs:

- ``wake_rtt_us``: median round trip of a 1-byte message between two processes pinned to
  different CPUs, each exchange after 500 us of idleness (as between sequential requests);
- ``same_cpu_rtt_us``: the same with both processes on one CPU (no cross-CPU wake-up);
- ``steal_percent``: CPU time the hypervisor gave to others over the whole run (``/proc/stat``).

Every loop is bounded in count.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from typing import Any, Dict, List, Optional

SAMPLES = 300
GAP_S = 500e-6


def _round_trips(cpu_a: int, cpu_b: int) -> Optional[float]:
    """Median round trip (us) between a forked echo child on ``cpu_b`` and this process on ``cpu_a``."""
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the echo child: answer every byte until the parent closes
        try:
            parent.close()
            os.sched_setaffinity(0, {cpu_b})
            for _ in range(SAMPLES + 1):
                data = child.recv(16)
                if not data:
                    break
                child.send(data)
        finally:
            os._exit(0)
    child.close()
    previous = os.sched_getaffinity(0)
    samples: List[float] = []
    try:
        os.sched_setaffinity(0, {cpu_a})
        for _ in range(SAMPLES):
            time.sleep(GAP_S)
            started = time.perf_counter()
            parent.send(b"x")
            if not parent.recv(16):
                return None
            samples.append(time.perf_counter() - started)
    finally:
        os.sched_setaffinity(0, previous)
        parent.close()
        os.waitpid(pid, 0)
    return round(statistics.median(samples) * 1e6, 1)


def _cpu_times() -> Optional[List[int]]:
    try:
        with open("/proc/stat") as stat:
            return [int(field) for field in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def probe() -> Dict[str, Any]:
    """Wake-up round trips now (needs Linux and 2 CPUs, else the figures are None)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        return {"wake_rtt_us": None, "same_cpu_rtt_us": None}
    return {"wake_rtt_us": _round_trips(cpus[0], cpus[1]), "same_cpu_rtt_us": _round_trips(cpus[0], cpus[0])}


class StealMeter:
    """Share of CPU time stolen by the hypervisor between construction and :meth:`percent`."""

    def __init__(self) -> None:
        self._start = _cpu_times()

    def percent(self) -> Optional[float]:
        end = _cpu_times()
        if self._start is None or end is None or len(end) < 8:
            return None
        delta = [b - a for a, b in zip(self._start, end)]
        total = sum(delta[:8])  # user nice system idle iowait irq softirq steal
        return round(100.0 * delta[7] / total, 2) if total else None
