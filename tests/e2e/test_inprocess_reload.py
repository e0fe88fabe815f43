"""An unload right after a load (and right after the start): the process survives, traffic beside it is served.

Triton's backend thread releases a load's caller a moment before it puts its model instance back in
its queue; an unload in that moment crashed the process in the model deleter (SIGSEGV in
``TritonBackendThread::StopBackendThread``, about 1 unload in 110 in loops under CPU load;
pytriton/inprocess/_settle.py, docs/inprocess.md "Known limitations of the server library").
``start()`` and ``load()`` now return only once the threads they started are idle.

The moment is made certain here: the child process runs with tests/e2e/payload_window_shim.c
preloaded, which keeps the backend thread running for a while right after it released the load, as
a preempted thread would be. The loop runs in that child (tests/e2e/inprocess_reload_child.py), so
that a crash fails this test with the signal instead of ending the pytest run. On the code before
the fix (3680ffc) the child crashed at its first unload in 3 runs of 3.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
from typing import Iterator, Optional, Tuple

import pytest

from pytriton.server.distribution import find_server
from tests.e2e.inprocess_models import ended, run_child, write_repository

SHIM_SOURCE = pathlib.Path(__file__).with_name("payload_window_shim.c")
EXECUTE = "_ZN6triton4core7Payload7ExecuteEPb"  # triton::core::Payload::Execute(bool*)
ROUNDS = 3
SPIN_MS = 200  # how long the shim keeps the backend thread in the window after each load


def _execute_range(library: pathlib.Path) -> Optional[Tuple[int, int]]:
    """Offsets of ``Payload::Execute``'s bytes in ``library``, from its symbol table (None if stripped)."""
    listing = subprocess.run(  # noqa: S603
        [str(shutil.which("nm")), "-S", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    for line in listing.splitlines():
        words = line.split()
        if len(words) == 4 and words[3] == EXECUTE:
            start, size = int(words[0], 16), int(words[1], 16)
            return start, start + size
    return None


@pytest.fixture(scope="module")
def shim_env() -> Iterator[dict]:
    """The child's environment: the shim preloaded and told where ``Payload::Execute`` lies."""
    compiler, nm = shutil.which("cc") or shutil.which("gcc"), shutil.which("nm")
    if compiler is None or nm is None:
        pytest.skip("needs a C compiler and nm (binutils) to build the fault-injection shim")
    libraries = [path for d in find_server().library_dirs for path in d.glob("libtritonserver*.so")]
    assert libraries, "no libtritonserver in the server install"
    execute = _execute_range(libraries[0])
    if execute is None:
        pytest.skip(f"{libraries[0].name} has no symbol table: the shim cannot find Payload::Execute")
    with tempfile.TemporaryDirectory(prefix="pytriton-shim-") as directory:
        shim = pathlib.Path(directory) / "payload_window_shim.so"
        subprocess.run(  # noqa: S603
            [compiler, "-shared", "-fPIC", "-O1", "-o", str(shim), str(SHIM_SOURCE), "-ldl"], check=True
        )
        yield {
            **os.environ,
            "LD_PRELOAD": str(shim),
            "PYTRITON_TEST_EXECUTE_RANGE": f"{execute[0]:x}:{execute[1]:x}",
            "PYTRITON_TEST_SPIN_MS": str(SPIN_MS),
        }


@pytest.fixture
def repository() -> Iterator[pathlib.Path]:
    with tempfile.TemporaryDirectory(prefix="pytriton-inproc-test-") as directory:
        yield write_repository(pathlib.Path(directory) / "repo", ("identity", "add_sub"))


def _run_child(shim_env: dict, repository: pathlib.Path, *args: str) -> dict:
    """Run inprocess_reload_child with ``args``; its JSON result, after asserting it exited with 0."""
    code, out, err = run_child("tests.e2e.inprocess_reload_child", repository, *args, env=shim_env, timeout_s=300)
    assert code == 0, f"the child {ended(code)}: {err[-3000:]}"
    result: dict = json.loads(out.strip().splitlines()[-1])
    return result


def test_unloading_right_after_the_start_and_each_load_never_crashes_and_traffic_is_served(shim_env, repository):
    result = _run_child(shim_env, repository, str(ROUNDS))
    assert result["rounds"] == ROUNDS and result["answer"] == 3  # the model loaded last serves
    # Healthy traffic to the other model the whole time: all of it answered, correctly.
    assert result["traffic_failed"] == 0, result["errors"]
    assert result["traffic_ok"] > 0


def test_stopping_right_after_a_load_never_crashes(shim_env, repository):
    """``stop()`` destroys the models through the same deleter (issue 42: a user's stop() must not end the process)."""
    result = _run_child(shim_env, repository, "2", "--stop-after-load")
    assert result == {"rounds": 2, "answers": [6.0, 6.0]}  # add_sub answered in each server before the stop
