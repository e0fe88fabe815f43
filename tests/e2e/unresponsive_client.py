"""Issue 42 item 4's measurement: a parallel client of instant requests beside two slow calls.

``python -m tests.e2e.unresponsive_client [limit_s] [slow_s]`` (defaults 4 and 6, the issue's
scenario) starts a ``Triton`` with ``PYTRITON_UNRESPONSIVE_AFTER_S=limit_s`` and a 2-instance model,
sends two ``slow_s`` requests (one per instance) and, meanwhile and for 1 s after, instant requests
one after another; prints the statuses of both. The e2e test
(tests/e2e/test_unresponsive.py::test_slow_calls_on_every_instance_never_fail_a_parallel_client)
asserts the same at a 1 s limit.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Dict

import numpy as np

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports
from tests.e2e.kind_models import sleeps_for_x
from tests.e2e.test_unresponsive import _infer


def main() -> None:
    limit_s = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    slow_s = float(sys.argv[2]) if len(sys.argv) > 2 else 6.0
    os.environ["PYTRITON_UNRESPONSIVE_AFTER_S"] = str(limit_s)
    ports = triton_ports()
    triton = Triton(config=TritonConfig(**ports))
    spec = dict(
        inputs=[Tensor(name="x", shape=(-1,), dtype=np.float32)],
        outputs=[Tensor(name="y", shape=(-1,), dtype=np.float32)],
    )
    triton.bind("Slow2", [sleeps_for_x, sleeps_for_x], config=ModelConfig(max_batch_size=4), **spec)
    triton.run()
    try:
        slow_statuses = []
        threads = []
        for _ in range(2):
            thread = threading.Thread(target=lambda: slow_statuses.append(_infer(ports, "Slow2", slow_s)[0]))
            thread.start()
            threads.append(thread)
            time.sleep(0.2)
        statuses: Dict[int, int] = {}
        started = time.monotonic()
        stop_at = None
        while time.monotonic() - started < 120:
            if stop_at is None and not any(t.is_alive() for t in threads):
                stop_at = time.monotonic() + 1.0
            if stop_at is not None and time.monotonic() > stop_at:
                break
            status = _infer(ports, "Slow2", 0.5)[0]
            statuses[status] = statuses.get(status, 0) + 1
        failed = sum(count for status, count in statuses.items() if status != 200)
        print(
            f"limit {limit_s:g} s, two {slow_s:g} s calls: parallel client {failed} failed of "
            f"{sum(statuses.values())} in {time.monotonic() - started:.1f} s (statuses {statuses}); "
            f"slow calls answered {sorted(slow_statuses)}"
        )
    finally:
        triton.stop()


if __name__ == "__main__":
    main()
