"""Issue 42 item 4's measurement for stopped stubs: a parallel client while the stubs of a model are stopped.

``python -m tests.e2e.stopped_client [one|all] [pause_s]`` (defaults ``all`` and 8) starts a ``Triton``
with a 2-instance model, runs two threads of instant HTTP requests one after another, stops (SIGSTOP)
one or both of the model's stubs for ``pause_s`` seconds, then resumes whatever is left of them, and
prints the requests, the failures by status, when the failures began and ended (seconds from the stop)
and their first and last error. The e2e test
(tests/e2e/test_unresponsive.py::test_stopped_stubs_are_replaced_without_an_unload_and_a_parallel_client_never_gets_a_404)
asserts the same on a shared server.
"""

from __future__ import annotations

import collections
import http.client
import json
import os
import signal
import sys
import threading
import time
from typing import List, Optional, Tuple

import numpy as np

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports
from tests.e2e.kind_models import sleeps_for_x
from tests.e2e.test_healing import _stubs

_BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}]})


def _client(port: int, stop: threading.Event, log: List[Tuple[float, float, object, bytes]]) -> None:
    connection: Optional[http.client.HTTPConnection] = None
    for _ in range(1_000_000):
        if stop.is_set():
            break
        began = time.monotonic()
        try:
            connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request("POST", "/v2/models/Two/infer", body=_BODY)
            response = connection.getresponse()
            data, status = response.read(), response.status
        except (OSError, http.client.HTTPException) as exc:
            status, data, connection = repr(exc), b"", None
        log.append((began, time.monotonic(), status, data[:120]))
    if connection is not None:
        connection.close()


def main(which: str, pause_s: float) -> None:
    ports = triton_ports()
    spec = dict(
        inputs=[Tensor(name="x", shape=(-1,), dtype=np.float32)],
        outputs=[Tensor(name="y", shape=(-1,), dtype=np.float32)],
    )
    with Triton(config=TritonConfig(**ports)) as triton:
        triton.bind("Two", [sleeps_for_x, sleeps_for_x], config=ModelConfig(max_batch_size=4), **spec)
        triton.run()
        stubs = _stubs(triton._backend.server.pid, "Two")
        targets = stubs[:1] if which == "one" else stubs
        log: List[Tuple[float, float, object, bytes]] = []
        stop = threading.Event()
        threads = [threading.Thread(target=_client, args=(ports["http_port"], stop, log)) for _ in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        stopped_at = time.monotonic()
        for pid in targets:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(pause_s)
        stop.set()
        for thread in threads:
            thread.join(60)
        for pid in targets:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        failures = [(b - stopped_at, e - stopped_at, s, d) for b, e, s, d in log if s != 200]
        counts = collections.Counter(status for _, _, status, _ in failures)
        print(f"stubs stopped: {which} ({len(targets)} of {len(stubs)}) for {pause_s:.0f} s")
        print(f"requests: {len(log)}; failures: {len(failures)} {dict(counts)}")
        if failures:
            print(f"failures from {failures[0][0]:.2f} s to {failures[-1][1]:.2f} s after the stop")
            print(f"first: {failures[0][3]!r}; last: {failures[-1][3]!r}")
        print(f"server restarts: {triton.server_restarts}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "all", float(sys.argv[2]) if len(sys.argv) > 2 else 8.0)
