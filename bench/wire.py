"""Sequential p50 and server CPU per request of the proxy against the plain Python-backend model.

Usage: ``python -m bench.wire [COUNT] [ROUNDS]`` (defaults 2000 and 3).

One ``Triton`` serves a bound ``[1,16]`` float32 identity callable (``proxy_identity``) and the plain
Python-backend identity (``plain_identity``). In each round, each model in turn (the order reversed
every other round) gets ``COUNT`` sequential HTTP requests from one client process (``bench.load``);
around each block the script reads the CPU time of the serving side: this process (the user's worker
threads) plus every descendant process except the client (tritonserver and its stubs). The figures
are medians over the rounds; compare them only to the baseline measured in the same run.
Written for the typed wire messages (issue 26): run it on two trees back to back to compare them.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import sys
import tempfile
from typing import Dict, List

import numpy as np

from bench.__main__ import free_ports, load, load_plain_models
from bench.models import identity, write_plain_models
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> List[int]:
    """The kernel's list of ``pid``'s children, from every thread of it (CONFIG_PROC_CHILDREN)."""
    found: List[int] = []
    for task in pathlib.Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def serving_cpu_s() -> float:
    """CPU seconds of this process and its descendants, the load generator excepted."""
    total, pending = 0.0, [os.getpid()]
    while pending:
        pid = pending.pop()
        try:
            if b"bench.load" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime
        pending.extend(_children(pid))
    return total


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    http_port, grpc_port, metrics_port = free_ports(3)
    samples: Dict[str, Dict[str, List[float]]] = {m: {"p50_ms": [], "cpu_us": []} for m in ("proxy", "plain")}
    with tempfile.TemporaryDirectory(prefix="pytriton-bench-wire-") as directory:
        repository = pathlib.Path(directory)
        write_plain_models(repository)
        config = TritonConfig(
            http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, model_repository=repository
        )
        with Triton(config=config) as triton:
            triton.bind(
                "proxy_identity", identity, [Tensor(name="INPUT", shape=(16,), dtype=np.float32)],
                [Tensor(name="OUTPUT", shape=(16,), dtype=np.float32)], config=ModelConfig(max_batch_size=32),
            )  # fmt: skip
            triton.run()
            load_plain_models(http_port, ["plain_identity"], triton.get_access_token())
            order = [("proxy", "proxy_identity"), ("plain", "plain_identity")]
            for _ in range(rounds):
                for side, model in order:
                    spec = {"scenario": "latency_interleaved", "protocol": "http", "port": http_port,
                            "models": [model], "count": count, "warmup": 100, "max_s": 120.0}  # fmt: skip
                    before = serving_cpu_s()
                    measured = load(spec, timeout_s=200.0)[model]
                    spent = serving_cpu_s() - before
                    samples[side]["p50_ms"].append(measured["p50_ms"])
                    samples[side]["cpu_us"].append(spent / (count + 100) * 1e6)
                order.reverse()
    result = {side: {k: statistics.median(v) for k, v in s.items()} for side, s in samples.items()}
    result["ratio"] = {k: result["proxy"][k] / result["plain"][k] for k in ("p50_ms", "cpu_us")}
    print(json.dumps({"count": count, "rounds": rounds, "samples": samples, "median": result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
