"""Start-up probe: bind one model, run, print "ready"; on "stop" on stdin, stop and print the stop time."""

import sys
import time

import numpy as np  # noqa: E402  (imported after pytriton on purpose: it is already loaded)

from bench.models import identity
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

http_port, grpc_port, metrics_port = (int(value) for value in sys.argv[1:4])
triton = Triton(config=TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port))
triton.bind(
    "proxy_identity",
    identity,
    [Tensor(name="INPUT", shape=(16,), dtype=np.float32)],
    [Tensor(name="OUTPUT", shape=(16,), dtype=np.float32)],
    config=ModelConfig(max_batch_size=32),
)
triton.run()
print("ready", flush=True)
sys.stdin.readline()
started = time.monotonic()
triton.stop()
print(time.monotonic() - started, flush=True)
