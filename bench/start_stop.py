"""``Triton.run()`` and ``stop()`` per instance kind, next to a plain ``tritonserver`` start, in one run.

Usage: ``python -m bench.start_stop [--repeats N] [--kinds thread,process,backend] [--tree DIR ...]``.

Each repeat starts, for every kind in turn (the order rotates from repeat to repeat), a fresh
``bench/startup_child.py`` (run by path) that binds the ``[16]`` float32 identity with that
``instance_kind``, times ``run()`` and then ``stop()`` inside its own process, and reports both with
the CPU time the model's stub had used when ``run()`` returned (less disturbed by a busy host); then
a plain ``tritonserver`` with one Python-backend identity model is launched and timed from launch to
ready, and from SIGINT to exit (``bench._common.startup_plain``): the floor a bound model's start is
compared with. Prints one JSON object: per kind the median ``run_s`` and ``stop_s`` over the repeats
(5 by default), every sample, the ratio of ``run_s`` to the plain server's ready time, and the host's
load average before and after.

``--tree DIR`` (repeatable; ``.`` is this checkout) runs the children against another checkout's
``pytriton`` (and ``bench.models``), e.g. an export of ``main`` for a before/after comparison in the
same run: every repeat times each tree for each kind, alternating which goes first. The child's code
is this tree's ``bench/startup_child.py``, run by path with ``DIR`` as its working directory, so ``DIR`` comes
first on its ``sys.path`` (``PYTHONPATH``; this checkout is run the same way). Timings on the shared 2-core machine are noisy: compare medians of one run, and say
what else was running.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench._common import ROOT, free_ports, startup_plain

KINDS = ("thread", "process", "backend")
CHILD = ROOT / "bench" / "startup_child.py"
CHILD_TIMEOUT_S = 120.0


def one_start(kind: str, tree: Optional[pathlib.Path] = None) -> Dict[str, float]:
    """Start one child serving a model of ``kind``; ``{"run_s", "stop_s", "stub_cpu_s"}`` as the child measured them."""
    ports = [str(port) for port in free_ports(3)]
    root = tree or ROOT
    # This tree's child script by path, for every tree alike: the tree's pytriton and bench.models come
    # first on sys.path (PYTHONPATH), and worker processes and backend stubs rerun the script by path
    # as their main module, as they would a user's script.
    env = dict(os.environ, PYTHONPATH=str(root))
    child = subprocess.Popen(  # noqa: S603
        [sys.executable, str(CHILD), *ports, kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env=env,
    )
    assert child.stdout is not None and child.stdin is not None
    try:
        words = child.stdout.readline().split()
        if words[:1] != ["ready"] or len(words) != 3:
            raise RuntimeError(f"start-up child ({kind}) failed: {words!r}")
        run_s, stub_cpu_s = float(words[1]), float(words[2])
        child.stdin.write("stop\n")
        child.stdin.flush()
        stop_s = float(child.stdout.readline())
        child.wait(CHILD_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return {"run_s": run_s, "stop_s": stop_s, "stub_cpu_s": stub_cpu_s}


def _summary(rows: List[Dict[str, float]], plain_ready_s: float) -> Dict[str, Any]:
    run_s = statistics.median(row["run_s"] for row in rows)
    return {
        "run_s": round(run_s, 3),
        "stop_s": round(statistics.median(row["stop_s"] for row in rows), 3),
        "stub_cpu_s": round(statistics.median(row["stub_cpu_s"] for row in rows), 3),
        "run_to_plain_ready": round(run_s / plain_ready_s, 2),
        "run_samples": [round(row["run_s"], 3) for row in rows],
        "stop_samples": [round(row["stop_s"], 3) for row in rows],
        "stub_cpu_samples": [round(row["stub_cpu_s"], 3) for row in rows],
    }


def measure(repeats: int, kinds: List[str], trees: Sequence[Optional[pathlib.Path]] = (None,)) -> Dict[str, Any]:
    """Median ``run()`` and ``stop()`` seconds per tree and kind over ``repeats``, and the plain server's start.

    ``trees``: the checkouts whose ``pytriton`` is timed (``None``: this one), interleaved in every repeat.
    """
    load_before = os.getloadavg()
    samples: Dict[Tuple[int, str], List[Dict[str, float]]] = {
        (i, kind): [] for i in range(len(trees)) for kind in kinds
    }
    plain_ready: List[float] = []
    plain_stop: List[float] = []
    for repeat in range(repeats):
        order = kinds[repeat % len(kinds) :] + kinds[: repeat % len(kinds)]
        for kind in order:
            for index in range(len(trees)) if repeat % 2 == 0 else reversed(range(len(trees))):
                samples[(index, kind)].append(one_start(kind, trees[index]))
        plain = startup_plain(1)
        plain_ready.append(plain["ready_s"])
        plain_stop.append(plain["stop_s"])
    plain_ready_s = statistics.median(plain_ready)
    return {
        "repeats": repeats,
        "plain_server": {
            "ready_s": round(plain_ready_s, 3),
            "stop_s": round(statistics.median(plain_stop), 3),
            "ready_samples": [round(value, 3) for value in plain_ready],
        },
        "trees": [
            {
                "tree": str(tree or ROOT),
                "kinds": {kind: _summary(samples[(index, kind)], plain_ready_s) for kind in kinds},
            }
            for index, tree in enumerate(trees)
        ],
        "loadavg_before": [round(value, 2) for value in load_before],
        "loadavg_after": [round(value, 2) for value in os.getloadavg()],
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument(
        "--tree",
        type=pathlib.Path,
        action="append",
        help="a checkout whose pytriton is timed, interleaved with the others ('.' for this one); repeatable",
    )
    args = parser.parse_args(argv)
    kinds = [kind for kind in args.kinds.split(",") if kind]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds or args.repeats < 1:
        parser.error(f"--kinds takes some of {','.join(KINDS)} and --repeats a positive count")
    started = time.monotonic()
    trees = [None if tree.resolve() == ROOT else tree.resolve() for tree in args.tree or [ROOT]]
    result = measure(args.repeats, kinds, trees)
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
