"""examples/inprocess_add_sub.py runs in a fresh interpreter, prints its answers and leaves no stub."""

from __future__ import annotations

import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "inprocess_add_sub.py"


def test_inprocess_example_runs():
    completed = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=180)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "a + b = [1.5 2.5 3.5]" in completed.stdout
    assert "a - b = [0.5 1.5 2.5]" in completed.stdout
    # DCGM's "Error: Failed to initialize NVML" on a machine without a GPU is kept out of the output
    # (pytriton.inprocess keeps GPU metrics off there unless log_verbose is set).
    assert "NVML" not in completed.stderr, completed.stderr[-2000:]
