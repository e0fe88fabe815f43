"""The code base stays lint-clean, formatted and type-checked (ruff and mypy are test dependencies)."""

import ast
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[2]
PATHS = ["pytriton", "tests", "bench", "examples", "deploy"]


def _run(*command):
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_lint():
    result = _run("ruff", "check", *PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format():
    result = _run("ruff", "format", "--check", *PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy():
    """Strict mypy for the running interpreter's version, so each CI interpreter (3.9 to 3.13) checks its own target."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    result = _run("mypy", "--python-version", version, "pytriton", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_module_has_a_unit_test_file_or_names_one():
    """``tests/unit/test_<module>.py`` exists, or the module's docstring names the unit test files covering it."""
    unit = ROOT / "tests" / "unit"
    missing = []
    for path in sorted((ROOT / "pytriton").rglob("*.py")):
        if (unit / f"test_{path.stem.lstrip('_')}.py").exists():
            continue
        source = path.read_text()
        docstring = ast.get_docstring(ast.parse(source)) or ""
        # Public modules keep the note in a comment after the docstring (out of the API reference).
        comments = "\n".join(line for line in source.splitlines()[:80] if line.lstrip().startswith("#"))
        named = re.findall(r"tests/unit/(test_\w+\.py)", docstring + "\n" + comments)
        if not named or not all((unit / name).exists() for name in named):
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"no unit test file for, or named in the docstring of: {missing}"
