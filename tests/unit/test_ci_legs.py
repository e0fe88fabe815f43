"""CI's reviewed list of e2e modules per leg (tests/e2e/conftest.py) stays whole and is what CI selects.

Every e2e module is placed on purpose: in ``LEG_MODULES`` (it also runs on the numpy 1.x, 3.9 or
3.13 leg) or in ``FULL_RUN_ONLY`` (it runs in the full python3 run only); a new module fails here until
its review puts it in one. The markers are registered, and ``.ci/run`` selects by each of them.
"""

from __future__ import annotations

import pathlib
import shlex
import subprocess
import sys

from tests.e2e import conftest as e2e

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_e2e_module_is_placed_once_and_every_name_exists():
    modules = {path.name for path in (ROOT / "tests" / "e2e").glob("test_*.py")}
    listed = set(e2e.LEG_MODULES)
    unplaced = modules - listed - e2e.FULL_RUN_ONLY
    assert not unplaced, (
        f"e2e modules not placed for CI: {sorted(unplaced)}; add each to LEG_MODULES (with the evidence "
        "that its behaviour depends on numpy 1.x, Python 3.9 or 3.13) or to FULL_RUN_ONLY in tests/e2e/conftest.py"
    )
    assert not (listed & e2e.FULL_RUN_ONLY), f"in both lists: {sorted(listed & e2e.FULL_RUN_ONLY)}"
    gone = (listed | e2e.FULL_RUN_ONLY) - modules
    assert not gone, f"tests/e2e/conftest.py names modules that do not exist: {sorted(gone)}"


def test_every_leg_has_modules_and_is_registered_and_selected_by_ci():
    pyproject = (ROOT / "pyproject.toml").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for leg in e2e.LEGS:
        assert any(leg in legs for legs in e2e.LEG_MODULES.values()), f"no e2e module is listed for {leg}"
        assert f'"{leg}: ' in pyproject, f"marker {leg} is not registered in pyproject.toml"
        assert leg in ci, f".ci/run does not select the {leg} leg"
    for name, legs in e2e.LEG_MODULES.items():
        assert legs and set(legs) <= set(e2e.LEGS) and len(set(legs)) == len(legs), (name, legs)


def test_markers_follow_the_test_files_path():
    e2e_dir = ROOT / "tests" / "e2e"
    assert e2e.leg_markers(ROOT / "tests" / "unit" / "test_ci_legs.py") == ()
    assert e2e.leg_markers(e2e_dir / "test_data_path.py") == ("e2e",) + e2e.LEG_MODULES["test_data_path.py"]
    only_full = sorted(e2e.FULL_RUN_ONLY)[0]
    assert e2e.leg_markers(e2e_dir / only_full) == ("e2e",)


def test_not_e2e_selects_the_unit_tests_and_a_leg_selects_its_modules():
    """The e2e conftest's hook sees every collected item: it must mark e2e items only (before, a run that
    collected tests/e2e marked the unit tests e2e too, and -m "not e2e" selected nothing)."""

    def collected(mark):
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", mark,
             "tests/unit/test_ci_legs.py", "tests/e2e/test_security.py", "tests/e2e/test_check.py"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        return {line.split("::")[0] for line in result.stdout.splitlines() if "::" in line}

    assert collected("not e2e") == {"tests/unit/test_ci_legs.py"}
    assert collected("e2e and py39_leg") == {"tests/e2e/test_security.py"}
    assert collected("e2e") == {"tests/e2e/test_security.py", "tests/e2e/test_check.py"}


def test_ci_runs_every_test_once_on_python3_as_two_halves_that_cover_the_suite():
    """.ci/run splits the README's `make test` on python3 into its e2e and unit halves (run side by side):
    together they must select every test (``-m e2e`` and ``-m "not e2e"``), both on python3's venv."""
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line for line in ci.splitlines() if not line.lstrip().startswith("#")]
    halves = [line for line in commands if " test TEST_MARK=" in line and "PYTHON=" not in line]
    marks = sorted(shlex.split(line.split("TEST_MARK=", 1)[1])[0] for line in halves)
    assert marks == ["e2e", "not e2e"], halves
    assert "make server" in ci  # the install the halves share is made before either starts
