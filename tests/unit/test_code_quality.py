"""The code base stays lint-clean, formatted and type-checked (ruff and mypy are test dependencies)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[2]
PATHS = ["pytriton", "tests", "bench", "examples"]


def _run(*command):
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_lint():
    result = _run("ruff", "check", *PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format():
    result = _run("ruff", "format", "--check", *PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy():
    result = _run("mypy", "pytriton", "bench")
    assert result.returncode == 0, result.stdout + result.stderr
