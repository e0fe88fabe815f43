"""Sequential p50 and server CPU per request of a bound model and the plain Python-backend model, for two source trees.

Usage::

    python -m bench.core_ab BEFORE_TREE AFTER_TREE [COUNT] [BLOCK] [--kind thread|process|backend]

``BEFORE_TREE``/``AFTER_TREE`` are checkouts of pytriton (e.g. ``git archive main | tar -x -C /tmp/before``
and this worktree). One child process per tree starts a ``Triton`` from that tree, at the same time,
with the bound identity model (``proxy_identity``: the identity callable bound with ``--kind``,
thread instances by default; ``--callable batch``: the ``@batch`` identity instead) and the plain Python-backend identity model (bench/models.py) in one
server. This process then sends sequential HTTP ``[1,16]`` float32 requests in blocks of ``BLOCK``
(100), cycling through (tree, model) in an order reversed every round, until each pair had ``COUNT``
(3000): a shared machine's drift hits all four alike, which separate runs one after the other did not
achieve on the 2-core development machine (the proxy's p50 moved 4x between runs). Per pair it
reports the p50 and the CPU time (every thread's ``/proc/<pid>/task/<tid>/schedstat``, nanoseconds)
that the tree's server process group (``tritonserver`` and its stubs) spent during that pair's blocks,
per request; only one pair's requests are in flight at any time, so the group's CPU in a block is
that model's. A thread or process instance's callable runs outside the group and is not counted:
this is the server side of the cost; a backend instance's runs in its stub, inside the group.

Prints per tree: p50 and CPU per request of each model and the proxy/plain ratios, as one JSON line.
Written for issue 26 (the serving core refactor), which had to leave both ratios unchanged;
``--kind backend`` compares two versions of the backend kind's per-batch path (issue 30).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Tuple

CHILD = r"""
import json, pathlib, shutil, sys, tempfile
from bench.__main__ import free_ports, load_plain_models
from bench.models import BatchCounter, batch_identity, bind_project_models, identity, write_plain_models
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
import numpy as np

http_port, grpc_port, metrics_port = free_ports(3)
repository = pathlib.Path(tempfile.mkdtemp(prefix="pytriton-core-ab-"))
names = write_plain_models(repository)
config = TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, model_repository=repository)
try:
    with Triton(config=config) as triton:
        kind, callable_ = sys.argv[1], sys.argv[2]
        if kind == "thread" and callable_ == "raw":
            bind_project_models(triton, BatchCounter())
        else:
            spec = [Tensor(name="INPUT", shape=(16,), dtype=np.float32)], [Tensor(name="OUTPUT", shape=(16,), dtype=np.float32)]
            infer = batch_identity if callable_ == "batch" else identity
            triton.bind("proxy_identity", infer, *spec, config=ModelConfig(max_batch_size=32), instance_kind=kind)
        triton.run()
        load_plain_models(http_port, names, triton.get_access_token())
        backend = getattr(triton, "_backend", None)  # this tree's layout, or the one before issue 26
        server = backend.server if backend is not None else triton._server
        print(json.dumps({"http_port": http_port, "pgid": server.pid}), flush=True)
        sys.stdin.read()  # until the parent closes it
finally:
    shutil.rmtree(repository, ignore_errors=True)
"""
MODELS = ("proxy_identity", "plain_identity")


def group_cpu_s(pgid: int) -> float:
    """CPU seconds of the live threads of process group ``pgid`` (``schedstat``: nanoseconds, where
    ``/proc/<pid>/stat`` counts in clock ticks of 10 ms, a third of a block of 100 requests)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[2]) != pgid:
                    continue
            for task in os.listdir(f"/proc/{entry}/task"):
                with open(f"/proc/{entry}/task/{task}/schedstat") as schedstat:
                    total += int(schedstat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a process or thread that ended meanwhile
    return total / 1e9


def start(tree: str, kind: str, callable_: str = "raw") -> Tuple[subprocess.Popen[str], Dict[str, int]]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, callable_],
        cwd=tree,
        env=dict(os.environ, PYTHONPATH=tree),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        child.kill()
        raise RuntimeError(f"{tree}: the server child failed to start (see its stderr above)")
    info: Dict[str, int] = json.loads(line)
    return child, info


def measure(servers: Dict[str, Dict[str, int]], count: int, block: int) -> Dict[str, Any]:
    from bench.load import _sequential_call

    pairs = [(label, model) for label in servers for model in MODELS]
    calls = {pair: _sequential_call("http", servers[pair[0]]["http_port"], pair[1]) for pair in pairs}
    for call in calls.values():
        for _ in range(200):  # warm-up, not counted
            call()
    samples: Dict[Tuple[str, str], List[float]] = {pair: [] for pair in pairs}
    cpu: Dict[Tuple[str, str], float] = dict.fromkeys(pairs, 0.0)
    order = list(pairs)
    while min(len(s) for s in samples.values()) < count:
        for pair in order:
            call, sink, pgid = calls[pair], samples[pair], servers[pair[0]]["pgid"]
            before = group_cpu_s(pgid)
            for _ in range(block):
                started = time.perf_counter()
                call()
                sink.append(time.perf_counter() - started)
            cpu[pair] += group_cpu_s(pgid) - before
        order.reverse()
    result: Dict[str, Any] = {}
    for label in servers:
        row: Dict[str, float] = {}
        for model in MODELS:
            ordered = sorted(samples[(label, model)])
            row[f"{model}_p50_ms"] = ordered[len(ordered) // 2] * 1e3
            row[f"{model}_cpu_us"] = cpu[(label, model)] / len(ordered) * 1e6
        row["p50_ratio"] = row["proxy_identity_p50_ms"] / row["plain_identity_p50_ms"]
        row["cpu_ratio"] = row["proxy_identity_cpu_us"] / row["plain_identity_cpu_us"]
        result[label] = row
    return result


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.core_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("count", nargs="?", type=int, default=3000)
    parser.add_argument("block", nargs="?", type=int, default=100)
    parser.add_argument("--kind", choices=("thread", "process", "backend"), default="thread")
    parser.add_argument(
        "--callable",
        choices=("raw", "batch"),
        default="raw",
        help="the bound identity: on List[Request] (raw, default) or @batch (bench.models.batch_identity)",
    )
    args = parser.parse_args(argv)
    children = []
    try:
        servers: Dict[str, Dict[str, int]] = {}
        for label, tree in (("before", args.before), ("after", args.after)):
            child, info = start(tree, args.kind, args.callable)
            children.append(child)
            servers[label] = info
        print(json.dumps(measure(servers, args.count, args.block)), flush=True)
    finally:
        for child in children:
            if child.stdin is not None:
                child.stdin.close()
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
