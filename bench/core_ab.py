"""Sequential p50 and server CPU per request of the proxy against the plain Python-backend model, for two source trees.

Usage::

    python bench/core_ab.py BEFORE_TREE AFTER_TREE [COUNT] [ROUNDS]

``BEFORE_TREE``/``AFTER_TREE`` are checkouts of pytriton (e.g. ``git archive main | tar -x -C /tmp/before``
and this worktree). Each round runs one child per tree, alternating (before, after, before, ...), so
that drift of a shared machine hits both alike. A child starts one ``Triton`` from its tree with the
proxied identity model and the plain Python-backend identity model (bench/models.py), then

- measures ``COUNT`` sequential HTTP requests per model in alternating blocks of 50
  (``bench.load.latency_interleaved``): p50 per model and their ratio;
- sends ``COUNT`` sequential requests to each model alone and reads the CPU time (user + system) of
  the server's process group (``tritonserver`` and its stubs) from ``/proc`` before and after: CPU per
  request per model and their ratio. The proxied model's own callable runs in the child, which is not
  counted: this is the server side of the cost, as Triton accounts its own work.

Prints one JSON line per child and a summary (medians over rounds) as the last line. Written for issue
26 (the serving core refactor), which had to leave both figures unchanged.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, List

CHILD = r"""
import json, os, pathlib, shutil, sys, tempfile, time
from bench.__main__ import free_ports, load, load_plain_models
from bench.models import BatchCounter, bind_project_models, write_plain_models
from pytriton.server.process import group_members
from pytriton.triton import Triton, TritonConfig

count = int(sys.argv[1])
tick = os.sysconf("SC_CLK_TCK")


def group_cpu_s(pgid):
    total = 0
    for pid in group_members(pgid):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / tick


http_port, grpc_port, metrics_port = free_ports(3)
repository = pathlib.Path(tempfile.mkdtemp(prefix="pytriton-core-ab-"))
names = write_plain_models(repository)
config = TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, model_repository=repository)
try:
    with Triton(config=config) as triton:
        bind_project_models(triton, BatchCounter())
        triton.run()
        load_plain_models(http_port, names, triton.get_access_token())
        server = getattr(triton, "_backend", None)
        server = server.server if server is not None else triton._server
        pgid = server.pid
        latency = load({"scenario": "latency_interleaved", "protocol": "http", "port": http_port, "count": count,
                        "models": ["proxy_identity", "plain_identity"], "max_s": 120.0})
        cpu = {}
        for model in ("proxy_identity", "plain_identity"):
            before = group_cpu_s(pgid)
            load({"scenario": "latency_interleaved", "protocol": "http", "port": http_port, "count": count,
                  "models": [model], "max_s": 120.0, "warmup": 0})
            cpu[model] = (group_cpu_s(pgid) - before) / count * 1e6
        print(json.dumps({
            "p50_ms": {m: latency[m]["p50_ms"] for m in ("proxy_identity", "plain_identity")},
            "server_cpu_us_per_request": cpu,
        }))
finally:
    shutil.rmtree(repository, ignore_errors=True)
"""


def child(tree: str, count: int) -> Dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=tree)
    completed = subprocess.run(
        [sys.executable, "-c", CHILD, str(count)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"{tree}: {completed.stderr[-3000:]}")
    result: Dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, float]:
    p50_ratio = [r["p50_ms"]["proxy_identity"] / r["p50_ms"]["plain_identity"] for r in runs]
    cpu = [r["server_cpu_us_per_request"] for r in runs]
    return {
        "proxy_p50_ms": statistics.median(r["p50_ms"]["proxy_identity"] for r in runs),
        "plain_p50_ms": statistics.median(r["p50_ms"]["plain_identity"] for r in runs),
        "p50_ratio_to_plain": statistics.median(p50_ratio),
        "proxy_server_cpu_us": statistics.median(c["proxy_identity"] for c in cpu),
        "plain_server_cpu_us": statistics.median(c["plain_identity"] for c in cpu),
        "server_cpu_ratio_to_plain": statistics.median(c["proxy_identity"] / c["plain_identity"] for c in cpu),
    }


def main(argv: List[str]) -> int:
    before, after = argv[0], argv[1]
    count = int(argv[2]) if len(argv) > 2 else 2000
    rounds = int(argv[3]) if len(argv) > 3 else 3
    runs: Dict[str, List[Dict[str, Any]]] = {"before": [], "after": []}
    for _ in range(rounds):
        for label, tree in (("before", before), ("after", after)):
            result = child(tree, count)
            runs[label].append(result)
            print(json.dumps({label: result}), flush=True)
    print(json.dumps({label: summarize(results) for label, results in runs.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
