"""bench/start_stop.py's summary and bench/startup_child.py's stub CPU probe (no server)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import start_stop
from bench.startup_child import children_cpu_s


def test_the_summary_takes_medians_and_the_ratio_to_the_plain_server() -> None:
    rows = [
        {"run_s": 0.5, "stop_s": 0.2, "stub_cpu_s": 0.3},
        {"run_s": 0.3, "stop_s": 0.1, "stub_cpu_s": 0.2},
        {"run_s": 0.4, "stop_s": 0.15, "stub_cpu_s": 0.25},
    ]
    summary = start_stop._summary(rows, plain_ready_s=0.2)
    assert summary["run_s"] == 0.4 and summary["stop_s"] == 0.15 and summary["stub_cpu_s"] == 0.25
    assert summary["run_to_plain_ready"] == 2.0
    assert summary["run_samples"] == [0.5, 0.3, 0.4]


def test_the_cpu_of_a_busy_child_is_counted_and_a_childless_process_has_none() -> None:
    # A fixed amount of work (not a time): the CPU it took is there however busy the machine is.
    code = "import sys, time\nsum(range(3_000_000))\nprint('done', flush=True)\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        assert children_cpu_s(os.getpid()) >= 0.01
        assert children_cpu_s(child.pid) == 0.0  # a process with no children
    finally:
        child.kill()
        child.wait()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        start_stop.main(["--kinds", "thread,nope"])
    with pytest.raises(SystemExit):
        start_stop.main(["--repeats", "0"])
