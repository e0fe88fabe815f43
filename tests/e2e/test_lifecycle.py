"""Server lifecycle: start, stop, signals, crashes, bad environments; nothing may be left behind."""

from __future__ import annotations

import json
import os
import pathlib
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pytriton.exceptions import PyTritonServerError, PyTritonServerNotInstalledError
from pytriton.model_config import Tensor
from pytriton.server import distribution
from pytriton.triton import Triton, TritonConfig
from tests.conftest import owned_resources, process_group_alive, shm_entries, triton_ports, wait_for
from tests.e2e._kinds import model
from tests.e2e.kind_models import identity

CHILD = pathlib.Path(__file__).with_name("serve_child.py")
REPO = pathlib.Path(__file__).parents[2]


def _bind_echo(triton, name="Echo", kind="thread"):
    triton.bind(
        name,
        identity,
        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
        instance_kind=kind,
    )


def _call(port, name="Echo"):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    x = np.arange(4, dtype=np.float32)[None]
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(name, [tensor]).as_numpy("x")
    client.close()
    np.testing.assert_array_equal(result, x)


def _assert_clean(server_pid, shm_prefix, socket_dir, workspace, scratch=None):
    assert wait_for(lambda: not process_group_alive(server_pid), 10), "server or stub processes left behind"
    if scratch is not None:  # the Python backend's /tmp/python_env_* directory (server/_scratch.py)
        assert wait_for(lambda: not pathlib.Path(scratch).exists(), 10), f"{scratch} left behind"
    assert wait_for(lambda: not shm_entries(shm_prefix), 10), f"/dev/shm leftovers: {shm_entries(shm_prefix)}"
    assert not pathlib.Path(socket_dir).exists(), "socket directory left behind"
    assert not pathlib.Path(workspace).exists(), "workspace left behind"


@pytest.fixture()
def stop_at_teardown():
    """Tritons a test drives by hand: stopped at teardown too, so a failed assertion leaks no server."""
    made = []
    yield made.append
    for triton in made:
        triton.stop()


def test_start_serve_stop_leaves_nothing(ports, stop_at_teardown):
    started = time.monotonic()
    triton = Triton(config=TritonConfig(**ports))
    stop_at_teardown(triton)
    _bind_echo(triton)
    _bind_echo(triton, model("Echo", "backend"), "backend")  # its stub, payload and page go too
    triton.run()
    ready_s = time.monotonic() - started
    assert triton.is_alive()
    _call(ports["http_port"])
    _call(ports["http_port"], model("Echo", "backend"))
    # A client holding a keep-alive connection must not delay the stop.
    client = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}")
    assert client.is_server_live()
    info = owned_resources(triton)
    assert shm_entries(triton._shm_prefix), "the python backend and the arenas should have segments while running"
    assert triton._backend.scratch.path and pathlib.Path(triton._backend.scratch.path).is_dir(), (
        "backend scratch directory not found"
    )
    stopping = time.monotonic()
    triton.stop()
    stop_s = time.monotonic() - stopping
    client.close()
    print(f"start-to-ready {ready_s:.2f} s, stop {stop_s:.2f} s")
    assert not triton.is_alive()
    _assert_clean(*info)
    triton.stop()  # idempotent


def test_polling_worker_serves_and_stops_promptly(ports, monkeypatch, stop_at_teardown):
    # Both polling windows at their maximum: the worker polls between the sequential requests
    # below, and stop() must still end it at once (shutdown wakes a polling recv as well).
    monkeypatch.setenv("PYTRITON_WORKER_SPIN_US", "1000000")
    monkeypatch.setenv("PYTRITON_PROXY_SPIN_US", "1000000")
    triton = Triton(config=TritonConfig(**ports))
    stop_at_teardown(triton)
    _bind_echo(triton)
    triton.run()
    client = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}")
    for step in range(100):
        x = np.full((1, 3), step, dtype=np.float32)
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("Echo", [tensor]).as_numpy("x"), x)
    client.close()
    info = (triton._backend.server.pid, triton._shm_prefix, triton._socket_dir, triton._workspace.path)
    stopping = time.monotonic()
    triton.stop()
    # stop() promises not to wait for the workers' polling; a worker stuck in its poll would keep
    # stop() until the 30 s exit timeout, so this margin only fails on that, never on a slow host.
    assert time.monotonic() - stopping < 20.0
    _assert_clean(*info)
    assert not [t for t in threading.enumerate() if t.name.startswith("pytriton-Echo")], "worker thread left"


def test_live_binding_claims_the_backend_scratch_directory(ports, stop_at_teardown):
    # No model at start-up: the Python backend starts with the first live bind, and its /tmp
    # directory must be found then, and removed at stop.
    triton = Triton(config=TritonConfig(**ports))
    stop_at_teardown(triton)
    triton.run()
    assert triton._backend.scratch.path is None
    _bind_echo(triton)
    scratch = triton._backend.scratch.path
    assert scratch and pathlib.Path(scratch).is_dir()
    _call(ports["http_port"])
    _bind_echo(triton, "Second")  # a later bind claims nothing new
    assert triton._backend.scratch.path == scratch
    triton.stop()
    assert not pathlib.Path(scratch).exists()


def test_two_servers_in_one_process():
    first_ports, second_ports = triton_ports(), triton_ports()
    with Triton(config=TritonConfig(**first_ports)) as first, Triton(config=TritonConfig(**second_ports)) as second:
        _bind_echo(first, "First")
        _bind_echo(second, "Second")
        first.run()
        second.run()
        _call(first_ports["http_port"], "First")
        _call(second_ports["http_port"], "Second")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{second_ports['grpc_port']}")
        assert grpc.is_model_ready("Second") and not grpc.is_model_ready("First")
        grpc.close()


def test_port_in_use_is_reported_quickly_with_the_port(ports):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", ports["grpc_port"]))
    blocker.listen(1)
    started = time.monotonic()
    triton = Triton(config=TritonConfig(**ports))
    _bind_echo(triton)
    try:
        with pytest.raises(PyTritonServerError, match=str(ports["grpc_port"])) as info:
            triton.run()
        assert "in use" in str(info.value)
        # Fails fast is the promise: the margin only guards against waiting for the 120 s startup timeout.
        assert time.monotonic() - started < 60
    finally:
        triton.stop()
        blocker.close()
    assert not triton._workspace.path.exists()


def test_bad_server_option_fails_fast_with_the_servers_words(ports):
    started = time.monotonic()
    # Entering the context starts the server (NVIDIA PyTriton's default lifecycle policy): it fails there.
    with (
        pytest.raises(PyTritonServerError, match="log-format"),
        Triton(config=TritonConfig(log_format="bogus", **ports)),
    ):
        pass
    # Fails fast is the promise: the margin only guards against waiting for the 120 s startup timeout.
    assert time.monotonic() - started < 60


def test_missing_server_names_the_install_command(tmp_path, monkeypatch, ports):
    monkeypatch.setenv("PYTRITON_HOME", str(tmp_path))
    monkeypatch.delenv("PYTRITON_TRITONSERVER_DIR", raising=False)
    monkeypatch.setattr(distribution, "NGC_DIR", tmp_path / "none")
    with (
        pytest.raises(PyTritonServerNotInstalledError, match="pytriton install-server"),
        Triton(config=TritonConfig(**ports)),
    ):
        pass
    assert list(tmp_path.iterdir()) == []  # the temporary workspace is gone as well


def test_interpreter_without_shared_libpython_is_refused(monkeypatch, ports):
    import sysconfig

    real = sysconfig.get_config_var
    monkeypatch.setattr(sysconfig, "get_config_var", lambda name: 0 if name == "Py_ENABLE_SHARED" else real(name))
    with pytest.raises(PyTritonServerError, match="enable-shared"), Triton(config=TritonConfig(**ports)):
        pass


def _spawn_child(ports, stderr=None):
    process = subprocess.Popen(
        [sys.executable, str(CHILD), str(ports["http_port"]), str(ports["grpc_port"]), str(ports["metrics_port"])],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        cwd=REPO,
    )
    line = process.stdout.readline()
    assert line, "child did not start"
    return process, json.loads(line)


def test_serve_says_where_it_listens_and_that_it_stopped_without_logging_configured(ports):
    # serve_child.py configures no logging: the two lines a terminal user needs still reach stderr.
    process, info = _spawn_child(ports, stderr=subprocess.PIPE)
    # The child is serving (its JSON line came first); the line is written before serve() waits.
    ready, _, _ = select.select([process.stderr], [], [], 30)
    if not ready:
        process.kill()
        process.communicate(timeout=20)
        pytest.fail("serve() wrote nothing to stderr")
    first = process.stderr.readline()
    assert first.startswith("pytriton: Triton listening on ") and f":{ports['http_port']}" in first
    assert "models: Echo" in first and "Ctrl-C" in first
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=20)
    assert process.returncode == 0
    assert re.search(r"^pytriton: stopped in [0-9.]+ s$", err, re.M), err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_serve_returns_on_signal_and_cleans_up(ports, signum):
    process, info = _spawn_child(ports)
    _call(ports["http_port"])
    process.send_signal(signum)
    out, _ = process.communicate(timeout=20)
    assert process.returncode == 0 and "served" in out
    _assert_clean(info["server_pid"], info["shm_prefix"], info["socket_dir"], info["workspace"])
    assert wait_for(lambda: not _pid_alive(info["watchdog_pid"]), 5)


def test_sigkill_of_user_process_leaves_nothing(ports):
    process, info = _spawn_child(ports)
    _call(ports["http_port"])
    process.kill()
    process.wait(10)
    assert info["scratch"] and pathlib.Path(info["scratch"]).is_dir()
    _assert_clean(info["server_pid"], info["shm_prefix"], info["socket_dir"], info["workspace"], info["scratch"])
    assert wait_for(lambda: not _pid_alive(info["watchdog_pid"]), 10)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers; treat it as gone.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"
