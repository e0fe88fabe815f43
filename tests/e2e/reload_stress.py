"""How often the in-process unload/load loop crashes its process, beside busy processes (a reproduction tool).

Runs ``tests/e2e/inprocess_reload_child.py`` (an in-process server that unloads a model right after
each load, with traffic to a second model beside it) CHILDREN times in sequence, each for ROUNDS
reloads, with BUSY processes spinning beside it, and prints one JSON line per child and a summary:
how many children ended by a signal. It measured Triton 2.51's unload-right-after-load crash
(docs/inprocess.md, "Known limitations of the server library") before and after
``pytriton/inprocess/_settle.py``; run it with ``PYTHONPATH`` at another tree to measure that tree.
Bounded: each child at most 900 s. Stubs a crashed child leaves behind are killed, and its regions
removed, by the child's pid in their names.

Usage: ``python -m tests.e2e.reload_stress CHILDREN ROUNDS [BUSY]`` (for example ``18 20 2``).
"""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys
import tempfile
from typing import Dict, List, Union

from tests.e2e.inprocess_models import clean_after_child, write_repository


def main(children: int, rounds: int, busy: int = 2) -> int:
    spinners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(busy)]
    results: List[Dict[str, Union[int, str]]] = []
    try:
        with tempfile.TemporaryDirectory() as directory:
            repository = write_repository(pathlib.Path(directory) / "repo", ("identity", "add_sub"))
            for index in range(children):
                child = subprocess.Popen(
                    [sys.executable, "-m", "tests.e2e.inprocess_reload_child", str(repository), str(rounds)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                try:
                    code: Union[int, str] = child.wait(timeout=900)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                    code = "timeout"
                clean_after_child(child.pid)
                if isinstance(code, int) and code < 0:
                    code = signal.Signals(-code).name
                results.append({"child": index, "exit": code})
                print(json.dumps(results[-1]), flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    failed = [result for result in results if result["exit"] != 0]
    print(json.dumps({"children": len(results), "rounds_each": rounds, "busy": busy, "failed": len(failed)}))
    return 1 if failed else 0


if __name__ == "__main__":
    arguments = [int(word) for word in sys.argv[1:]]
    if len(arguments) not in (2, 3):
        sys.exit(__doc__)
    sys.exit(main(*arguments))
