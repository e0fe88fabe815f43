"""Start-up probe: bind one model, run, print "ready <run() s> <stub CPU s>"; on "stop" on stdin, stop and print the stop time.

``python -m bench.startup_child HTTP GRPC METRICS [KIND]``: KIND is the model's ``instance_kind``
(``thread`` by default). The stub CPU is the CPU time the server's children (the model's stub) had
used when ``run()`` returned, from every thread's ``/proc/<pid>/task/<tid>/schedstat``: what the
stub's start costs, less disturbed by other work on the machine than wall-clock time.
``bench/suite.py`` (start-up scenario) and ``bench/start_stop.py`` run it.
"""

import os
import sys
import time

import numpy as np  # noqa: E402  (imported after pytriton on purpose: it is already loaded)

from bench.models import identity
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def children_cpu_s(parent: int) -> float:
    """CPU seconds used so far by every thread of every child process of ``parent``."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                if int(stat.read().rsplit(b")", 1)[1].split()[1]) != parent:
                    continue
            for task in os.listdir(f"/proc/{entry}/task"):
                with open(f"/proc/{entry}/task/{task}/schedstat") as schedstat:
                    total += int(schedstat.read().split()[0])
        except (OSError, ValueError, IndexError):  # a process that ended meanwhile
            continue
    return total / 1e9


if __name__ == "__main__":  # process and backend instances import this module as __mp_main__: no second Triton
    http_port, grpc_port, metrics_port = (int(value) for value in sys.argv[1:4])
    kind = sys.argv[4] if len(sys.argv) > 4 else "thread"
    triton = Triton(config=TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port))
    triton.bind(
        "proxy_identity",
        identity,
        [Tensor(name="INPUT", shape=(16,), dtype=np.float32)],
        [Tensor(name="OUTPUT", shape=(16,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=32),
        instance_kind=kind,
    )
    started = time.perf_counter()
    triton.run()
    run_s = time.perf_counter() - started
    server = triton._local.server if triton._local is not None else None
    stub_cpu_s = children_cpu_s(server.pid) if server is not None and server.pid else 0.0
    print(f"ready {run_s:.4f} {stub_cpu_s:.4f}", flush=True)
    sys.stdin.readline()
    started = time.perf_counter()
    triton.stop()
    print(f"{time.perf_counter() - started:.4f}", flush=True)
