"""Start-up probe: bind one model, run, print "ready <run() seconds>"; on "stop" on stdin, stop and print the stop time.

``python -m bench.startup_child HTTP GRPC METRICS [KIND]``: KIND is the model's ``instance_kind``
(``thread`` by default). ``bench/__main__.py`` (start-up scenario) and ``bench/start_stop.py`` run it.
"""

import sys
import time

import numpy as np  # noqa: E402  (imported after pytriton on purpose: it is already loaded)

from bench.models import identity
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

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
    print(f"ready {time.perf_counter() - started:.4f}", flush=True)
    sys.stdin.readline()
    started = time.perf_counter()
    triton.stop()
    print(f"{time.perf_counter() - started:.4f}", flush=True)
