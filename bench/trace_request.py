"""Where one sequential request spends its time, from the kernel scheduler's point of view.

``python -m bench.trace_request PORT MODEL [COUNT]`` sends COUNT (default 500) sequential
``[1,16]`` float32 HTTP requests to MODEL on a running server, with the scheduler's wake-up and
switch events recorded by the kernel (tracefs), and prints the median of each segment:

- client send: from the start of the call until the client blocks waiting for the answer;
- Triton in: until Triton wakes the model's stub process (``triton_python_b...``);
- stub: until the stub wakes Triton back with the responses. For a pytriton model this splits into
  the stub's own work before and after the hand-off and the worker thread in the user's process
  (from its wake-up until it sleeps again);
- Triton out and client receive: the way back.

Needs root (or access to ``/sys/kernel/tracing``) and Linux; it changes no setting other than the
trace events it enables, and disables them again. Loops are bounded by COUNT.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from bench.load import LeanHttp

TRACING = "/sys/kernel/tracing/"
EVENTS = ("sched/sched_switch", "sched/sched_waking")
_LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\[\d+\]\s+\S+\s+([\d.]+): (\w+): (.*)$")
Event = Tuple[float, str, int, str, str]  # time (us), comm, pid, event, details


def _write(name: str, value: str) -> None:
    with open(TRACING + name, "w") as handle:
        handle.write(value)


def record(port: int, model: str, count: int) -> Tuple[str, List[float]]:
    """Run the requests with tracing on; return the raw trace and the client-side latencies (s)."""
    client = LeanHttp(port, model, np.ones((1, 16), np.float32), "FP32")
    for _ in range(200):  # warm up connection, server and caches
        client.call()
    _write("trace", "")
    for event in EVENTS:
        _write(f"events/{event}/enable", "1")
    latencies = []
    try:
        with open(TRACING + "trace_marker", "w", buffering=1) as marker:
            _write("tracing_on", "1")
            for index in range(count):
                marker.write(f"REQ_START {index}\n")
                started = time.perf_counter()
                client.call()
                latencies.append(time.perf_counter() - started)
                marker.write(f"REQ_END {index}\n")
    finally:
        _write("tracing_on", "0")
        for event in EVENTS:
            _write(f"events/{event}/enable", "0")
    with open(TRACING + "trace") as handle:
        return handle.read(), latencies


def requests(trace: str) -> List[List[Event]]:
    """The events between each REQ_START and REQ_END marker."""
    found: List[List[Event]] = []
    current: Optional[List[Event]] = None
    for line in trace.splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        comm, pid, stamp, event, details = match.groups()
        item = (float(stamp) * 1e6, comm, int(pid), event, details)
        if event == "tracing_mark_write" and "REQ_START" in details:
            current = [item]
        elif current is not None:
            current.append(item)
            if event == "tracing_mark_write" and "REQ_END" in details:
                found.append(current)
                current = None
    return found


def _first(events: List[Event], test: Callable[[Event], bool]) -> Optional[Event]:
    return next((event for event in events if test(event)), None)


def segments(request: List[Event]) -> Dict[str, float]:
    """Durations (us) of the request's segments; a segment the trace does not show is left out."""
    start, end = request[0], request[-1]
    client = start[2]
    out: Dict[str, float] = {"total": end[0] - start[0]}
    client_sleeps = _first(request, lambda e: e[3] == "sched_switch" and f"prev_pid={client} " in e[4])
    stub_woken = _first(request, lambda e: e[3] == "sched_waking" and "comm=triton_python_b" in e[4])
    stub_done = _first(
        request, lambda e: e[3] == "sched_waking" and e[1].startswith("triton_python_b") and "comm=tritonserver" in e[4]
    )
    client_woken = _first(request, lambda e: e[3] == "sched_waking" and f"pid={client} " in e[4])
    worker_woken = _first(  # the stub waking a user-space task other than Triton: pytriton's worker
        request,
        lambda e: (
            e[3] == "sched_waking"
            and e[1].startswith("triton_python_b")
            and not re.search(r"comm=(tritonserver|triton_python_b|kworker|ksoftirqd|rcu|migration)", e[4])
        ),
    )
    if client_sleeps:
        out["client send"] = client_sleeps[0] - start[0]
        if stub_woken:
            out["Triton in"] = stub_woken[0] - client_sleeps[0]
    if stub_woken and stub_done:
        out["stub, all"] = stub_done[0] - stub_woken[0]
        if worker_woken and worker_woken[0] < stub_done[0]:
            worker_pid = re.search(r" pid=(\d+)", worker_woken[4])
            sleeps = worker_pid and _first(
                request,
                lambda e: (
                    e[3] == "sched_switch" and f"prev_pid={worker_pid.group(1)} " in e[4] and e[0] > worker_woken[0]
                ),
            )
            out["  stub before the hand-off"] = worker_woken[0] - stub_woken[0]
            if sleeps:
                out["  worker in the user's process"] = sleeps[0] - worker_woken[0]
                out["  stub after the reply"] = stub_done[0] - sleeps[0]
    if stub_done and client_woken:
        out["Triton out"] = client_woken[0] - stub_done[0]
    if client_woken:
        out["client receive"] = end[0] - client_woken[0]
    return out


def main() -> None:
    port, model = int(sys.argv[1]), sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 500
    if not os.path.exists(TRACING + "trace"):
        # Containers often have /sys/kernel/tracing as an empty mount point: say how to fix it
        # rather than fail on the first write.
        raise SystemExit(
            f"bench.trace_request: no tracefs at {TRACING}; as root, mount it with "
            f"`mount -t tracefs nodev {TRACING.rstrip('/')}` and run this again."
        )
    trace, latencies = record(port, model, count)
    table: Dict[str, List[float]] = {}
    for request in requests(trace):
        for name, value in segments(request).items():
            table.setdefault(name, []).append(value)
    print(f"{model}: {len(latencies)} requests, client-side p50 {statistics.median(latencies) * 1e6:.0f} us")
    for name, values in table.items():
        print(f"  {name:34s} p50 {statistics.median(values):7.1f} us   ({len(values)} requests)")


if __name__ == "__main__":
    main()
