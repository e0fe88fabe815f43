"""One replica for ``python -m bench.rollout``: a pytriton process serving an identity model.

Run as ``python -m bench.rollout_replica HTTP_PORT GRPC_PORT METRICS_PORT [--work-ms MS]
[--drain-delay-secs S]``. It serves ``identity`` (FP32, any length, 4 instances; each batch
sleeps ``--work-ms`` to stand for model work, releasing the GIL) on the given loopback ports until
SIGTERM or SIGINT, on which ``Triton.serve()`` drains (docs/architecture.md, "Graceful drain")
and the process exits 0.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

INSTANCES = 4


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ports", type=int, nargs=3, metavar="PORT", help="HTTP, gRPC and metrics ports")
    parser.add_argument("--work-ms", type=float, default=5.0, help="time each batch takes (sleep)")
    parser.add_argument("--drain-delay-secs", type=int, default=0, help="TritonConfig.drain_delay_secs")
    parser.add_argument("--exit-timeout-secs", type=int, default=10, help="TritonConfig.exit_timeout_secs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="replica %(asctime)s %(levelname)s %(name)s: %(message)s")
    work_s = args.work_ms / 1000.0

    def identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
        if work_s > 0:
            time.sleep(work_s)
        return [{"OUTPUT": request["INPUT"]} for request in requests]

    http_port, grpc_port, metrics_port = args.ports
    config = TritonConfig(
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        drain_delay_secs=args.drain_delay_secs,
        exit_timeout_secs=args.exit_timeout_secs,
    )
    triton = Triton(config=config)
    triton.bind(
        "identity",
        [identity] * INSTANCES,
        inputs=[Tensor(name="INPUT", shape=(-1,), dtype=np.float32)],
        outputs=[Tensor(name="OUTPUT", shape=(-1,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=16),
    )
    triton.serve()  # run() inside; SIGTERM: drain, stop, return
    return 0


if __name__ == "__main__":
    sys.exit(main())
