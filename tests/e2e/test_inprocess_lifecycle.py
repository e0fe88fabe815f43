"""In-process servers of their own: model control, lifecycle, two servers, a dying stub, bad repositories.

This module starts no server shared between tests, so each test can check that its server leaves
no stub process and no shared-memory region behind.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import pytriton.inprocess as tritonserver
from pytriton.inprocess import _request
from pytriton.inprocess._scratch import BACKEND_SCRATCH
from tests.conftest import shm_entries, wait_for
from tests.e2e.inprocess_models import write_repository
from tests.e2e.test_inprocess_server import child_stubs


@pytest.fixture
def tmp_path():
    """A temporary directory removed when the test ends (pytest's own would be kept for a while)."""
    with tempfile.TemporaryDirectory(prefix="pytriton-inproc-test-") as directory:
        yield pathlib.Path(directory)


def test_bad_repository_path_and_bad_config(tmp_path):
    before = set(child_stubs())
    with pytest.raises(tritonserver.InternalError, match="stat.*missing"):
        tritonserver.Server(model_repository=str(tmp_path / "missing")).start()
    bad = tmp_path / "bad"
    (bad / "broken" / "1").mkdir(parents=True)
    (bad / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\nmax_batch_size: oops\n')
    # Without a log configured, the error quotes the model's reason (pytriton/inprocess/_errorlog.py).
    expected = "failed to load all models: 'broken': failed to read text proto"
    with pytest.raises(tritonserver.InternalError, match=expected):
        tritonserver.Server(model_repository=str(bad)).start()
    log = tmp_path / "triton.log"
    with pytest.raises(tritonserver.InternalError, match="failed to load all models"):
        tritonserver.Server(model_repository=str(bad), log_file=str(log), log_error=True).start()
    assert "failed to read text proto" in log.read_text() and "broken" in log.read_text()  # the reason, logged
    assert wait_for(lambda: set(child_stubs()) <= before, 20)


def test_syntax_error_in_model_py_is_quoted_in_the_start_error(tmp_path):
    repository = write_repository(tmp_path / "repo", ("add_sub",))
    model_py = repository / "add_sub" / "1" / "model.py"
    source = model_py.read_text()
    broken = source.replace("def execute(self, requests):", "def execute(self, requests)", 1)
    assert broken != source
    model_py.write_text(broken)
    server = tritonserver.Server(model_repository=str(repository))
    with pytest.raises(tritonserver.InternalError) as info:
        server.start(wait_until_ready=True, timeout=60)
    assert "failed to load all models: 'add_sub' version 1" in str(info.value)
    assert "SyntaxError" in str(info.value) and "model.py, line" in str(info.value)
    assert server._error_log is None  # the private log is gone with the failed start
    server.stop()


def _explicit_server(repository: pathlib.Path, *startup: str) -> tritonserver.Server:
    """A started server with EXPLICIT model control over ``repository``, ``startup`` models loaded."""
    options = tritonserver.Options()
    options.model_control_mode = tritonserver.ModelControlMode.EXPLICIT
    options.model_repository = str(repository)
    options.startup_models = list(startup)
    server = tritonserver.Server(options)
    server.start(wait_until_ready=True, timeout=120)
    return server


def test_explicit_control_and_lifecycle(tmp_path):
    repository = write_repository(tmp_path / "repo", ("add_sub", "identity"))
    extra = write_repository(tmp_path / "extra", ("faulty",))
    server = _explicit_server(repository, "add_sub")
    prefix = server.shm_region_prefix
    assert child_stubs(prefix)
    try:
        with pytest.raises(tritonserver.InvalidArgumentError):
            server.start()
        states = {key[0]: model.state for key, model in server.models().items()}
        assert states == {"add_sub": "READY", "identity": None}
        model = server.load("identity")
        assert model.ready()
        server.unload("identity", wait_until_unloaded=True, timeout=60)
        assert not server.model("identity").ready()
        assert wait_for(lambda: not child_stubs(f"{repository}/identity/"), 20)  # its stub exited
        override = '{"max_batch_size": 4, "dynamic_batching": {}, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}], "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}], "backend": "python"}'  # noqa: E501
        server.load("identity", {"config": override})
        assert server.model("identity").config()["max_batch_size"] == 4
        with pytest.raises(tritonserver.TritonError):
            server.load("not_in_any_repository")
        server.register_model_repository(str(extra), {"faulty": "renamed"})
        server.load("renamed")
        (response,) = server.model("renamed").infer(inputs={"INPUT0": np.array([2], np.float32)})
        assert float(np.from_dlpack(response.outputs["OUTPUT0"])[0]) == 2
        server.unload("renamed", wait_until_unloaded=True, timeout=60)
        assert wait_for(lambda: not child_stubs(f"{extra}/faulty/"), 20)
        server.unregister_model_repository(str(extra))
        assert ("renamed", -1) not in server.models()
    finally:
        started = time.monotonic()
        server.stop()
        stop_s = time.monotonic() - started
    assert stop_s < 20  # the 30 s exit timeout was not waited out
    server.stop()  # twice is harmless
    assert not server.live() and not server.ready()
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        server.model("add_sub")
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        server.models()
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        tritonserver.Model(server, "add_sub").infer(inputs={"INPUT0": np.zeros(4, np.float32)})
    assert wait_for(lambda: not child_stubs(prefix), 20)
    assert shm_entries(prefix) == []


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _states(server: tritonserver.Server, name: str) -> list:
    return [(model.state, model.reason) for key, model in server.models().items() if key[0] == name]


def test_reloading_in_a_tight_loop_waits_until_triton_destroyed_the_old_model(tmp_path):
    """``unload(wait_until_unloaded=True)`` returns after Triton destroyed the old model, not just not-ready.

    Triton destroys the old model on a thread of its own (its model deleter) after the model
    reports not ready. Each round checks that the index says UNAVAILABLE ("unloaded": set after the
    deleter destroyed the model) and the old stubs are gone when it returns, then loads at once;
    every other round unloads without waiting, so that ``load()`` itself must wait for the unload to
    finish. (The crash once blamed on this window, SIGSEGV in ``StopBackendThread``, was the unload
    right *after* a load: tests/e2e/test_inprocess_reload.py.)
    """
    repository = write_repository(tmp_path / "repo", ("identity",))
    server = _explicit_server(repository, "identity")
    try:
        for round_ in range(6):
            old = child_stubs(f"{repository}/identity/")
            assert old
            if round_ % 2:
                server.unload("identity")  # load() waits for it
            else:
                server.unload("identity", wait_until_unloaded=True, timeout=60)
                assert _states(server, "identity") == [("UNAVAILABLE", "unloaded")]
                assert not [pid for pid in old if _running(pid)]
            server.load("identity")
        (response,) = server.model("identity").infer(inputs={"INPUT0": np.array([[5]], np.float32)})
        assert float(np.from_dlpack(response.outputs["OUTPUT0"]).flat[0]) == 5
    finally:
        server.stop()
    assert wait_for(lambda: not child_stubs(f"{repository}/identity/"), 20)


def _scratch_dirs() -> set:
    """The Python backends' /tmp directories of this user (pytriton/inprocess/_scratch.py).

    Other processes make and remove such directories meanwhile: one gone between the listing and
    its ``stat`` is not counted.
    """
    found = set()
    for path in pathlib.Path("/tmp").glob("python_env_*"):
        try:
            if path.stat().st_uid == os.geteuid():
                found.add(path)
        except FileNotFoundError:
            pass
    return found


def test_stub_that_dies(tmp_path):
    scratch_before = _scratch_dirs()
    server = tritonserver.Server(model_repository=str(write_repository(tmp_path / "repo", ("faulty", "identity"))))
    server.options.exit_timeout = 5  # the dead stub's model cannot unload: Triton waits this long
    server.start(wait_until_ready=True, timeout=120)
    prefix = server.shm_region_prefix
    # This server's backend directory. Nothing names it positively (pytriton/server/_scratch.py): the
    # server claims the one directory that appeared while its backend started, under the lock every
    # pytriton start of this user takes. It is checked, not the global set: other servers of this user
    # (other tests, other checkouts) make and remove such directories meanwhile.
    appeared = _scratch_dirs() - scratch_before
    claimed = BACKEND_SCRATCH.path
    try:
        assert claimed is not None and pathlib.Path(claimed) in appeared, (
            f"this server did not claim its Python backend's directory (claimed {claimed!r}; "
            f"appeared while it started: {sorted(map(str, appeared))})"
        )
        with pytest.raises(tritonserver.TritonError, match="(?i)stub"):
            list(server.model("faulty").infer(inputs={"INPUT0": np.array([99], np.float32)}))
        # the process survived and the other model still answers
        (response,) = server.model("identity").infer(inputs={"INPUT0": np.ones((1, 1), np.float32)})
        assert response.error is None
        assert os.path.isdir(claimed)  # the backend's, in use until the server is deleted
    finally:
        server.stop()  # logs the expired exit timeout, does not raise
    assert wait_for(lambda: not child_stubs(prefix), 20)
    assert shm_entries(prefix) == []
    # The dead stub's model never unloaded, so the backend never finalized: its directory is ours to remove.
    assert not os.path.exists(claimed), f"the Python backend's directory {claimed} was left behind"


def test_two_servers_over_one_repository_each_unloads_its_own_model(tmp_path):
    """A default-mode server and an EXPLICIT one over the same repository: the second's unload waits
    for its own model only (it once waited for the first server's stub, which never exits)."""
    repository = write_repository(tmp_path / "repo", ("identity",))
    one = np.ones((1, 2), np.float32)
    first = tritonserver.Server(model_repository=str(repository)).start(wait_until_ready=True, timeout=120)
    try:
        (response,) = first.model("identity").infer(inputs={"INPUT0": one})
        assert response.error is None
        second = _explicit_server(repository)
        try:
            second.load("identity")
            (response,) = second.model("identity").infer(inputs={"INPUT0": one * 2})
            np.testing.assert_array_equal(np.from_dlpack(response.outputs["OUTPUT0"]), one * 2)
            second.unload("identity", wait_until_unloaded=True, timeout=60)
            assert _states(second, "identity") == [("UNAVAILABLE", "unloaded")]
            assert first.model("identity").ready()  # the first server's model is untouched
            second.load("identity")  # and it loads again at once
            assert second.model("identity").ready()
        finally:
            second.stop()
        (response,) = first.model("identity").infer(inputs={"INPUT0": one * 3})
        np.testing.assert_array_equal(np.from_dlpack(response.outputs["OUTPUT0"]), one * 3)
    finally:
        first.stop()
    assert wait_for(lambda: not child_stubs(f"{repository}/identity/"), 20)
    assert shm_entries(first.shm_region_prefix) == []


def test_two_servers_in_one_process(tmp_path):
    first = tritonserver.Server(model_repository=str(write_repository(tmp_path / "one", ("add_sub",))))
    second = tritonserver.Server(model_repository=str(write_repository(tmp_path / "two", ("identity",))))
    first.start(wait_until_ready=True, timeout=120)
    try:
        second.start(wait_until_ready=True, timeout=120)
        try:
            assert second.shm_region_prefix == first.shm_region_prefix  # the backend keeps the first's
            (response,) = second.model("identity").infer(inputs={"INPUT0": np.ones((1, 2), np.float32)})
            assert response.error is None
            with pytest.raises(tritonserver.TritonError):
                second.model("add_sub").infer(
                    inputs={"INPUT0": np.ones(4, np.float32), "INPUT1": np.ones(4, np.float32)}
                )
        finally:
            second.stop()
        (response,) = first.model("add_sub").infer(
            inputs={"INPUT0": np.ones(4, np.float32), "INPUT1": np.ones(4, np.float32)}
        )
        np.testing.assert_array_equal(np.from_dlpack(response.outputs["OUTPUT0"]), [2, 2, 2, 2])
    finally:
        first.stop()
    assert wait_for(lambda: not child_stubs(first.shm_region_prefix), 20)
    assert shm_entries(first.shm_region_prefix) == []
    assert _request.inflight_count() == 0


def test_interpreter_exit_stops_a_forgotten_server(tmp_path):
    repository = write_repository(tmp_path / "repo", ("identity",))
    script = (
        "import pytriton.inprocess as tritonserver\n"
        f"server = tritonserver.Server(model_repository={str(repository)!r})\n"
        "server.start(wait_until_ready=True, timeout=120)\n"
        "print('PREFIX', server.shm_region_prefix, flush=True)\n"
    )  # no stop(): the atexit hook must do it
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert completed.returncode == 0, completed.stderr[-2000:]
    prefix = completed.stdout.split("PREFIX ", 1)[1].split()[0]
    assert prefix.startswith("pytriton-inproc-")
    assert wait_for(lambda: not _stubs_with(prefix), 20)
    assert shm_entries(prefix) == []


def _stubs_with(prefix: str) -> list:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if prefix.encode() in pathlib.Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found
