"""A backend instance's per-batch Python, cold, against a plain model's ``execute``: no server.

Usage: ``python -m bench.backend_cold [--tree DIR ...] [--runs N] [--calls N]``.

Why: on the 2-core machine a request's Python in the stub runs with caches the server and the
client evicted since the last request, so it costs several times what a warm loop shows, and the
server benchmarks (``bench.kinds``) cannot resolve a few microseconds under their noise. This one
drives ``stubside/_inline.py``'s model through ``execute`` with the fake
``triton_python_backend_utils`` of tests/unit/test_stub.py, evicts the caches before every call
(a write to every cache line of 16 MiB) and times the call; next to it, the same fakes run a plain
Python-backend identity ``execute`` (the floor). Reported per tree: median microseconds per
one-request batch of each, their difference (``excess``) and ratio, medians over ``--runs``
processes, the trees alternating. Absolute figures depend on the fakes; compare trees.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List

_CASE = pathlib.Path(__file__).with_name("_backend_cold_case.py")


def run_once(tree: pathlib.Path, calls: int) -> Dict[str, float]:
    """One pytest process in ``tree`` running the case; returns its medians (microseconds)."""
    target = tree / "tests" / "unit" / f"test_zz_backend_cold_{os.getpid()}.py"  # the tree's conftest and fakes apply
    with tempfile.TemporaryDirectory() as directory:
        out = pathlib.Path(directory) / "out.json"
        shutil.copy(_CASE, target)
        try:
            subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(target)],
                cwd=tree,
                env={**os.environ, "BACKEND_COLD_OUT": str(out), "BACKEND_COLD_CALLS": str(calls)},
                check=True,
                stdout=subprocess.DEVNULL,
                timeout=600,
            )
        finally:
            target.unlink()
        return json.loads(out.read_text())  # type: ignore[no-any-return]


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.backend_cold", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", type=pathlib.Path, help="a checkout to measure (repeatable)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args(argv)
    trees = [tree.resolve() for tree in (args.tree or [pathlib.Path(".")])]
    rows: Dict[pathlib.Path, List[Dict[str, float]]] = {tree: [] for tree in trees}
    for _ in range(max(1, args.runs)):
        for tree in trees:
            rows[tree].append(run_once(tree, args.calls))
    print("| tree | floor us | model us | excess us | ratio | excess per run |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for tree, runs in rows.items():
        floor = statistics.median(run["floor"] for run in runs)
        model = statistics.median(run["model"] for run in runs)
        excess = sorted(round(run["model"] - run["floor"], 1) for run in runs)
        ratio = statistics.median(run["model"] / run["floor"] for run in runs)
        print(f"| {tree} | {floor:.1f} | {model:.1f} | {statistics.median(excess):.1f} | {ratio:.2f}x | {excess} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
