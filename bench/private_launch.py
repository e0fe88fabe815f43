"""What the private launch costs: ``Triton.run()``, a bind after ``run()`` and a crash restart, with and without it.

``python -m bench.private_launch [ROUNDS]`` alternates, in this one process, a ``Triton`` started the
default way (server/_launch.py: the token passed through the environment and the argv pointer moved
under ``PTRACE_TRACEME``, umask 077, the chmod filter) and one started the old way (the token in
argv, no filter), ROUNDS times each (default 3). Each round times ``run()`` with one bound model, one
``bind()`` after ``run()`` (a repository-API load with the token: the path stub replacement and
recycling use too) and the time from SIGKILL of the server to the model serving again. Prints one
JSON object: the median seconds of each step per mode and the ratio private / plain (docs/security.md).
``spawn_true_ms`` times the launch alone (``/bin/true`` with one hidden flag, 50 starts per mode).
Every loop is bounded in count and time.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

import numpy as np

from bench.__main__ import free_ports
from pytriton.model_config import Tensor
from pytriton.server import _launch
from pytriton.triton import Triton, TritonConfig

ROUNDS = 3


def identity(requests: List[Dict[str, np.ndarray]]) -> List[Dict[str, np.ndarray]]:
    return [{"y": request["x"]} for request in requests]


PRIVATE = _launch.PrivateLaunch


def _plain(argv: List[str], env: Dict[str, str], **_: Any) -> _launch.PrivateLaunch:
    return PRIVATE(argv, env, traced=False, filtered=False)


def _serving(triton: Triton, model: str) -> bool:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(triton.http_url.replace("http://", ""))
    try:
        return bool(client.is_model_ready(model))
    except Exception:  # refused while the server restarts
        return False
    finally:
        client.close()


def _one(private: bool) -> Dict[str, float]:
    setattr(_launch, "PrivateLaunch", PRIVATE if private else _plain)  # noqa: B010
    spec = [Tensor(name="x", shape=(-1,), dtype=np.float32)], [Tensor(name="y", shape=(-1,), dtype=np.float32)]
    http_port, grpc_port, metrics_port = free_ports(3)
    config = TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    with Triton(config=config) as triton:
        triton.bind("First", identity, *spec)
        started = time.perf_counter()
        triton.run()
        run_s = time.perf_counter() - started
        started = time.perf_counter()
        triton.bind("Late", identity, *spec)
        bind_s = time.perf_counter() - started
        assert triton._backend.server is not None and triton._backend.server.pid is not None
        os.kill(triton._backend.server.pid, signal.SIGKILL)
        started = time.perf_counter()
        deadline = started + 60
        time.sleep(0.05)
        while not (triton.server_restarts == 1 and _serving(triton, "Late")) and time.perf_counter() < deadline:
            time.sleep(0.01)
        restart_s = time.perf_counter() - started
    return {"run_s": run_s, "bind_after_run_s": bind_s, "sigkill_to_serving_s": restart_s}


def spawn_ms(private: bool, count: int = 50) -> float:
    """Median ms to start ``/bin/true`` with one hidden flag and reap it (the launch alone)."""
    argv = ["/bin/true", "--http-restricted-api=model-repository:triton-access-token=" + "t" * 43]
    times = []
    for _ in range(count):
        launch = PRIVATE(argv, dict(os.environ)) if private else _plain(argv, dict(os.environ))
        started = time.perf_counter()
        child = subprocess.Popen(launch.argv, env=launch.env, preexec_fn=launch.preexec)  # noqa: S603,PLW1509
        launch.after_spawn(child.pid)
        child.wait()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1e3, 2)


def measure(rounds: int = ROUNDS) -> Dict[str, Any]:
    """Median seconds per step for each mode and the ratio private / plain."""
    spawn = {"private": spawn_ms(True), "plain": spawn_ms(False)}
    samples: Dict[str, List[Dict[str, float]]] = {"private": [], "plain": []}
    try:
        for _ in range(rounds):
            for mode in ("private", "plain"):
                samples[mode].append(_one(mode == "private"))
    finally:
        setattr(_launch, "PrivateLaunch", PRIVATE)  # noqa: B010
    medians = {
        mode: {step: round(statistics.median(row[step] for row in rows), 3) for step in rows[0]}
        for mode, rows in samples.items()
    }
    ratios = {step: round(medians["private"][step] / medians["plain"][step], 2) for step in medians["plain"]}
    return {"rounds": rounds, "spawn_true_ms": spawn, "median_s": medians, "ratio_private_to_plain": ratios}


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else ROUNDS), indent=2))
