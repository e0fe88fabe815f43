"""Helper process for the supervisor tests (tests/e2e/test_supervisor.py): serve ``Echo``, take commands on stdin.

Arguments: ``HTTP GRPC METRICS [WARM_S]``. With ``WARM_S``, a model ``Warm`` is also bound whose
warmup takes that many seconds: ``run()`` is then still loading it after ``Echo`` answers ready.
Prints one JSON line once running and one after each restart (the state a leftover check needs,
the restart count and this process's ``RLIMIT_NOFILE``); ``served`` once ``serve()`` returned.

Commands, one per line on stdin, each answered by a line on stdout:

- ``exhaust``: lower the soft descriptor limit to just above what is open and take every free
  descriptor (``exhausted N``): the next restart meets a real ``EMFILE``;
- ``release``: close them and restore the limit (``released``);
- ``missing-binary``: restarts run a ``tritonserver`` that does not exist (``missing``): each
  restart attempt fails with ``FileNotFoundError``.
"""

import dataclasses
import json
import os
import pathlib
import resource
import sys
import threading
import time

import numpy as np

from pytriton.model_config import ModelConfig, Tensor
from pytriton.model_config.common import ModelWarmup, WarmupInput
from pytriton.triton import Triton, TritonConfig

X = [Tensor(name="x", shape=(-1,), dtype=np.float32)]


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")  # no new descriptor: works while they are all taken
    sys.stdout.flush()


def _report(triton: Triton) -> None:
    info = {
        "server_pid": triton._backend.server.pid,
        "shm_prefix": triton._shm_prefix,
        "socket_dir": str(triton._socket_dir),
        "workspace": str(triton._workspace.path),
        "scratch": triton._backend.scratch.path,
        "restarts": triton.server_restarts,
        "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
    }
    _say(json.dumps(info))


def _watch_restarts(triton: Triton) -> None:
    seen = 0
    while True:
        time.sleep(0.05)
        if triton.server_restarts != seen and triton.is_alive():
            seen = triton.server_restarts
            _report(triton)


def _commands(triton: Triton) -> None:
    held = []
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    for line in sys.stdin:
        command = line.strip()
        if command == "exhaust":
            resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, limits[1]))
            try:
                while True:
                    held.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                pass
            _say(f"exhausted {len(held)}")
        elif command == "release":
            while held:
                os.close(held.pop())
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
            _say("released")
        elif command == "missing-binary":
            plan, env = triton._backend._launch
            missing = pathlib.Path("/nonexistent/pytriton-test/tritonserver")
            triton._backend._launch = (dataclasses.replace(plan, binary=missing), env)
            # What a spent budget does is tested here; the retries' delays are the unit tests' (with a
            # fake clock, tests/unit/test_restarts.py): 0.05 s doubling to 0.2 s instead of 0.5 to 4 s.
            triton._supervisor.policy._retry_base_s = 0.05
            triton._supervisor.policy._retry_cap_s = 0.2
            _say("missing")


def main() -> None:
    http, grpc, metrics = (int(value) for value in sys.argv[1:4])
    triton = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
    triton.bind("Echo", lambda requests: [dict(r.items()) for r in requests], X, X)
    if len(sys.argv) > 4:
        warm_s = float(sys.argv[4])

        def slow_warmup(requests):
            time.sleep(warm_s)
            return [dict(r.items()) for r in requests]

        warmup = [ModelWarmup(name="slow", batch_size=1, inputs={"x": WarmupInput(np.float32, (1,), zero_data=True)})]
        triton.bind("Warm", slow_warmup, X, X, config=ModelConfig(max_batch_size=4, model_warmup=warmup))
        triton.serve(monitoring_period_sec=0.2)  # the signal test: run() inside serve()
        _say("served")
        return
    triton.run()
    _report(triton)
    threading.Thread(target=_watch_restarts, args=(triton,), daemon=True).start()
    threading.Thread(target=_commands, args=(triton,), daemon=True).start()
    triton.serve(monitoring_period_sec=0.2)
    _say("served")


if __name__ == "__main__":
    main()
