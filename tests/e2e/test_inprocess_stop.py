"""``stop()`` and ``unload()`` with a stub stopped inside a Python-backend lock: the process survives (issue 42 item 9).

The one ``Fatal Python error: Aborted`` seen in ``stop()`` in CI: the Python backend, finalizing an
instance whose stub missed its 1 s health check, SIGKILLs the stub wherever it is and then locks the
region's allocator mutex to free the stub's IPC control block; a stub killed holding that mutex
makes the lock throw ``boost::interprocess::lock_exception`` and the process aborts inside
``stop()``. The stall is made certain here: the child (tests/e2e/inprocess_stop_child.py) serves a
model whose stub, after answering, takes the allocator's mutex in a thread of its own and stops
(the mutex lies at a fixed offset in the stub's region, measured with gdb once), as a stub preempted
inside an allocation and then stopped would be. On the code before the fix the child aborted
(``lock_exception``, SIGABRT) in ``stop()`` in 3 runs of 3 on 9636a79 and 1 of 1 on 3680ffc, and in
``unload()`` likewise (3 of 3, 1 of 1); now pytriton kills such a stub outside the locks first
(pytriton/inprocess/_stopped_stubs.py), and a second model is served beside it until the call.
"""

from __future__ import annotations

import json
import pathlib
import platform
import tempfile
from typing import Iterator

import pytest

from tests.e2e.inprocess_models import ended, run_child, write_repository

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64",
    reason="the allocator mutex's offset in the stub's region was measured on x86_64",
)


@pytest.fixture
def repository() -> Iterator[pathlib.Path]:
    with tempfile.TemporaryDirectory(prefix="pytriton-inproc-stop-") as directory:
        yield write_repository(pathlib.Path(directory) / "repo", ("identity", "add_sub"))


def _run_child(repository: pathlib.Path, *args: str) -> dict:
    """Run inprocess_stop_child with ``args``; its JSON result, after asserting it exited with 0."""
    code, out, errors = run_child("tests.e2e.inprocess_stop_child", repository, *args, timeout_s=400)
    assert code == 0, f"the child {ended(code)}: {errors[-3000:]}"
    result: dict = json.loads(out.strip().splitlines()[-1])
    assert result["gdb_ok"], errors[-3000:]
    return result


def test_stop_with_a_stub_stalled_inside_the_allocator_lock_returns_and_the_other_model_served(repository):
    result = _run_child(repository)
    assert result["held"] is True  # the stub was stopped holding a robust mutex (its robust list says so)
    assert result["stub_left"] is False  # ended, and reaped by the backend
    assert result["traffic_failed"] == 0 and result["traffic_ok"] > 0  # add_sub served beside it until the stop


def test_unload_with_a_stub_stalled_inside_the_allocator_lock_returns_and_serving_goes_on(repository):
    result = _run_child(repository, "--unload")
    assert result["held"] is True and result["stub_left"] is False
    assert result["traffic_failed"] == 0 and result["traffic_ok"] > 0
    assert result["answer"] == 6.0  # add_sub answers after the unload
