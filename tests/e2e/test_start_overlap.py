"""``run()`` starts the server while worker processes load their callables, against a real server.

A worker process that cannot load its callable must still fail ``run()`` with ``WorkerStartError`` as
soon as it fails (its stub waits for it, so the server would otherwise only give up after its start-up
timeout), and leave nothing behind: server and stubs, sockets, segments, worker processes. Unit tests of
the ordering: tests/unit/test_start_overlap.py.
"""

from __future__ import annotations

import os
import pathlib
import sys
import threading
import time
import types

import numpy as np
import pytest

from pytriton._serving.endpoints import STARTUP_TIMEOUT_S
from pytriton.client import ModelClient
from pytriton.model_config import Tensor
from pytriton.proxy._process import WorkerStartError
from pytriton.triton import Triton, TritonConfig
from tests.conftest import process_group_alive, shm_entries, triton_ports, wait_for
from tests.e2e import process_models

X = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
Y = [Tensor(name="y", shape=(-1,), dtype=np.float32)]


def _worker_processes() -> list:
    """Worker processes of this test process (their command line runs ``_process_child``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes()
            status = pathlib.Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = status.rsplit(b")", 1)[1].split()
        if b"_process_child" in cmdline and int(fields[1]) == os.getpid() and fields[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


# The callable's module as a worker process imports it (from the test's folder on sys.path): it fails,
# but only once the test opens the gate (bounded, so that a test that never opens it still ends).
GHOST_MODULE = """
import os, time
deadline = time.monotonic() + 60.0
while not os.path.exists({gate!r}) and time.monotonic() < deadline:
    time.sleep(0.01)
raise ImportError("pytriton_e2e_ghost cannot be imported in a worker process")
"""


def test_a_worker_that_cannot_load_its_callable_fails_run_at_once_and_leaves_nothing(monkeypatch, tmp_path):
    module = types.ModuleType("pytriton_e2e_ghost")  # this process's copy; a worker imports the file below
    exec("def infer(requests):\n    return [{'y': r['x']} for r in requests]\n", module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    gate = tmp_path / "fail-now"
    (tmp_path / "pytriton_e2e_ghost.py").write_text(GHOST_MODULE.format(gate=str(gate)))
    monkeypatch.syspath_prepend(str(tmp_path))
    triton = Triton(config=TritonConfig(**triton_ports()))

    def fail_once_the_backend_started() -> None:
        # The worker fails only after the server's Python backend started an instance (so made its /tmp
        # directory): under load the server can start so late that the worker fails first and the server is
        # ended before its backend makes anything (tests/unit/test_start_overlap.py covers that order).
        def started() -> bool:
            server = triton._backend.server
            return server is not None and server.python_backend_started

        wait_for(lambda: started() or gate.exists(), 60, 0.01)
        gate.touch()

    opener = threading.Thread(target=fail_once_the_backend_started, daemon=True)
    try:
        triton.bind("Thread", process_models.doubled, X, Y)  # a healthy model beside it is stopped too
        triton.bind("Ghost", module.infer, X, Y, instance_kind="process")
        socket_dir = triton._socket_dir
        opener.start()
        started = time.monotonic()
        with pytest.raises(WorkerStartError, match="pytriton_e2e_ghost"):
            triton.run()
        elapsed = time.monotonic() - started
        server = triton._backend.server
        assert server is not None and server.pid is not None  # the server had been started beside the worker
        assert server.python_backend_started  # the gate opened: the order this test is about
        assert elapsed < STARTUP_TIMEOUT_S / 2, f"run() failed only after {elapsed:.0f} s"
        assert wait_for(lambda: not process_group_alive(server.pid), 10), "server or stub processes left behind"
        assert wait_for(lambda: not _worker_processes(), 10), "a worker process was left behind"
        assert wait_for(lambda: not shm_entries(triton._shm_prefix), 10), shm_entries(triton._shm_prefix)
        assert socket_dir is not None and not socket_dir.exists()
        assert not pathlib.Path(triton._workspace.path).exists()
        # The Python backend had started (the stubs waited for the worker), so it made its /tmp directory.
        scratch = triton._backend.scratch.path
        assert scratch is not None and not os.path.exists(scratch), "the Python backend's scratch directory was left"
        assert triton.stop() is False  # run() stopped it already
    finally:
        gate.touch()  # a worker still waiting ends at once
        opener.join(10)
        triton.stop()


def test_process_and_thread_models_started_together_serve(monkeypatch):
    with Triton(config=TritonConfig(**triton_ports())) as triton:
        triton.bind("Proc", [process_models.doubled] * 2, X, Y, instance_kind="process")
        triton.bind("Thread", process_models.doubled, X, Y)
        triton.run()
        assert triton.is_alive()
        for name in ("Proc", "Thread"):
            with ModelClient(triton.http_url, name) as client:
                result = client.infer_batch(x=np.ones((1, 3), dtype=np.float32))
            np.testing.assert_array_equal(result["y"], np.full((1, 3), 2.0, dtype=np.float32))
