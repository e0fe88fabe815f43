"""``Triton(embedded=True)``: bound callables served by the server library inside this process, no port.

The first tests start embedded servers of their own, before the module's shared one exists: Triton's
Python backend is shared by every in-process server alive in a process and keeps the first one's
shared-memory prefix, and these tests check that nothing with the instance's own prefix is left.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
from typing import Dict, List, Set

import numpy as np
import pytest

import pytriton.inprocess as tritonserver
from pytriton.decorators import batch
from pytriton.exceptions import PyTritonInvalidOperationError, PyTritonModelConfigError, PyTritonServerError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import needs_stub_strings, shm_entries, wait_for
from tests.e2e.test_inprocess_server import child_stubs

CHILD = pathlib.Path(__file__).with_name("embedded_child.py")
F32 = np.float32


@batch
def _identity(x):
    return {"y": x}


@batch
def _add_sub(a, b):
    return {"add": a + b, "sub": a - b}


@batch
def _upper(text):
    return {"upper": np.vectorize(lambda item: bytes(item).upper(), otypes=[object])(text)}


@batch
def _count(n):
    for step in range(int(n[0, 0])):
        yield {"step": np.array([[step]], dtype=np.int32)}


def _fails(requests):
    raise ValueError("no good")


def _bind_identity(triton: Triton, name: str = "Identity") -> None:
    triton.bind(
        name,
        _identity,
        [Tensor(name="x", shape=(-1,), dtype=F32)],
        [Tensor(name="y", shape=(-1,), dtype=F32)],
        config=ModelConfig(max_batch_size=16),
    )


def _listening_sockets() -> Set[int]:
    """Inodes of this process's TCP sockets in the LISTEN state."""
    own = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            own.add(int(target[8:-1]))
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = pathlib.Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[9]) in own:  # 0A: LISTEN
                listening.add(int(fields[9]))
    return listening


def test_stop_leaves_no_stub_segment_socket_or_directory():
    triton = Triton(embedded=True)
    _bind_identity(triton)
    triton.run()
    prefix, socket_dir, workspace = triton._shm_prefix, triton._socket_dir, triton._workspace.path
    assert triton.inprocess_server.shm_region_prefix.startswith(prefix)  # no other server shares the backend
    client = triton.client("Identity")
    assert client.infer_sample(np.arange(3, dtype=F32))["y"].tolist() == [0.0, 1.0, 2.0]
    assert child_stubs(prefix), "the model's stub runs as a child of this process"
    assert shm_entries(prefix), "the Python backend's region and the arenas exist while serving"
    scratch = triton._backend.scratch.path
    assert triton.stop() is True
    assert triton.stop() is False  # twice is harmless
    assert not child_stubs(prefix), "stub processes left behind"
    assert not shm_entries(prefix), f"/dev/shm leftovers: {shm_entries(prefix)}"
    assert socket_dir is not None and not socket_dir.exists()
    assert not workspace.exists()
    assert scratch is None or not pathlib.Path(scratch).exists()
    # After stop(): the client's handle and Triton's accessors both raise.
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        client.infer_sample(np.arange(3, dtype=F32))
    with pytest.raises(PyTritonInvalidOperationError, match="stopped"):
        triton.client("Identity")
    with pytest.raises(PyTritonInvalidOperationError, match="stopped"):
        triton.bind(
            "Late", _identity, [Tensor(name="x", shape=(-1,), dtype=F32)], [Tensor(name="y", shape=(-1,), dtype=F32)]
        )


def test_a_killed_stub_is_replaced_and_stop_still_leaves_nothing():
    triton = Triton(embedded=True)
    try:
        _bind_identity(triton)
        triton.run()
        prefix = triton._shm_prefix
        client = triton.client("Identity")
        (stub,) = child_stubs(prefix)
        os.kill(stub, signal.SIGKILL)
        # The supervisor loads a new generation of the model (in-process) next to the dead one.
        assert wait_for(lambda: set(child_stubs(prefix)) - {stub}, 30), "no replacement stub started"

        def serves() -> bool:
            try:
                return client.infer_sample(np.ones(2, F32))["y"].tolist() == [1.0, 1.0]
            except tritonserver.TritonError:  # "Stub process ... is not healthy" until the switch
                return False

        assert wait_for(serves, 30, 0.2)
    finally:
        triton.stop()  # the dead generation never unloads; stop() does not wait its exit timeout for it
    assert not child_stubs(prefix)
    assert wait_for(lambda: not shm_entries(prefix), 5), shm_entries(prefix)


def test_a_server_that_cannot_start_fails_run_with_tritons_words():
    triton = Triton(embedded=True, config=TritonConfig(cache_config=["local,size=not-a-number"]))
    _bind_identity(triton)
    with pytest.raises(PyTritonServerError, match="failed to start in this process.*LocalCache"):
        triton.run()
    assert not triton.is_alive() and not triton._workspace.path.exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_serve_blocks_until_a_signal_then_cleans_up(signum):
    child = subprocess.Popen([sys.executable, str(CHILD)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        info = json.loads(child.stdout.readline())
        assert info["stubs"]
        assert child.stdout.readline().strip() == "serving"
        child.send_signal(signum)
        # Wait before reading to the end: a child killed by the signal would stay a zombie, which its
        # stubs (holding the pipe) take for a live parent.
        child.wait(60)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err[-2000:]
    assert "served" in out
    assert wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in info["stubs"]), 10)
    assert not shm_entries(info["shm_prefix"])
    assert not os.path.exists(info["socket_dir"]) and not os.path.exists(info["workspace"])
    assert info["scratch"] and not os.path.exists(info["scratch"])


def test_a_killed_process_leaves_nothing_behind():
    child = subprocess.Popen([sys.executable, str(CHILD)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout is not None
        info = json.loads(child.stdout.readline())
    finally:
        child.kill()
        child.wait()
    # The watchdog sees its pipe close, kills the stubs (found by their command line: Triton's own
    # detection in the stub can deadlock) and removes segments, sockets and workspace. That takes about
    # 2 s on a loaded 2-core machine (pytriton/_serving/embedded.py); 15 s leaves a wide margin.
    assert wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in info["stubs"]), 15)
    assert wait_for(lambda: not shm_entries(info["shm_prefix"]), 15), shm_entries(info["shm_prefix"])
    assert wait_for(lambda: not os.path.exists(info["workspace"]), 15)
    assert not os.path.exists(info["socket_dir"])
    assert info["scratch"], "the Python backend's scratch directory was not identified"
    assert wait_for(lambda: not os.path.exists(info["scratch"]), 15), f"{info['scratch']} left behind"
    assert info["watchdog_pid"] is not None
    assert wait_for(lambda: not os.path.exists(f"/proc/{info['watchdog_pid']}"), 15)


# -- one embedded Triton for the rest of the module --------------------------------------------------------
@pytest.fixture(scope="module")
def triton():
    instance = Triton(embedded=True)
    _bind_identity(instance)
    instance.bind(
        "AddSub",
        _add_sub,
        [Tensor(name="a", shape=(-1,), dtype=F32), Tensor(name="b", shape=(-1,), dtype=F32)],
        [Tensor(name="add", shape=(-1,), dtype=F32), Tensor(name="sub", shape=(-1,), dtype=F32)],
        config=ModelConfig(max_batch_size=8),
    )
    instance.bind(
        "Upper",
        _upper,
        [Tensor(name="text", shape=(-1,), dtype=bytes)],
        [Tensor(name="upper", shape=(-1,), dtype=bytes)],
        config=ModelConfig(max_batch_size=8),
    )
    instance.bind(
        "Count",
        _count,
        [Tensor(name="n", shape=(1,), dtype=np.int32)],
        [Tensor(name="step", shape=(1,), dtype=np.int32)],
        config=ModelConfig(max_batch_size=1, decoupled=True),
    )
    instance.bind(
        "Fails", _fails, [Tensor(name="x", shape=(-1,), dtype=F32)], [Tensor(name="y", shape=(-1,), dtype=F32)]
    )
    instance.run()
    yield instance
    instance.stop()


def test_models_are_served_with_no_port(triton):
    assert triton.is_alive()
    assert _listening_sockets() == set(), "an embedded Triton must not listen on any TCP port"
    assert triton.get_access_token() is None
    with pytest.raises(PyTritonInvalidOperationError, match="no network endpoints"):
        triton.http_url  # noqa: B018
    assert any("loading: Identity" in line for line in triton.server_log), triton.server_log[-20:]  # Triton's log


def test_infer_sample_and_infer_batch(triton):
    client = triton.client("Identity")
    np.testing.assert_array_equal(client.infer_sample(np.arange(5, dtype=F32))["y"], np.arange(5, dtype=F32))
    batch_in = np.arange(6, dtype=F32).reshape(2, 3)
    np.testing.assert_array_equal(client.infer_batch(batch_in)["y"], batch_in)
    add_sub = triton.client("AddSub")
    result = add_sub.infer_sample(np.array([1, 2], F32), np.array([0.5, 0.5], F32))
    assert result["add"].tolist() == [1.5, 2.5] and result["sub"].tolist() == [0.5, 1.5]
    named = add_sub.infer_batch(a=np.ones((2, 2), F32), b=np.ones((2, 2), F32))
    assert named["add"].tolist() == [[2, 2], [2, 2]] and named["sub"].tolist() == [[0, 0], [0, 0]]


@needs_stub_strings
def test_bytes_tensors(triton):
    result = triton.client("Upper").infer_sample(np.array([b"ab", b"", b"\x00c"], dtype=object))
    assert list(result["upper"]) == [b"AB", b"", b"\x00C"]


def test_a_decoupled_model_streams_through_the_model_handle(triton):
    model = triton.model("Count")
    assert isinstance(model, tritonserver.Model)
    assert model.transaction_properties() == tritonserver.ModelTxnPropertyFlag.DECOUPLED
    steps: List[int] = []
    finals = []
    for response in model.infer(inputs={"n": np.array([[4]], dtype=np.int32)}):
        finals.append(response.final)
        if "step" in response.outputs:
            steps.append(int(np.from_dlpack(response.outputs["step"]).ravel()[0]))
    assert steps == [0, 1, 2, 3]
    assert finals[-1] is True and not any(finals[:-1])
    with pytest.raises(tritonserver.InvalidArgumentError, match="decoupled"):
        triton.client("Count").infer_sample(np.array([1], dtype=np.int32))


def test_the_model_handle_reads_config_metadata_and_statistics(triton):
    model = triton.model("AddSub")
    assert model.ready()
    assert model.config()["max_batch_size"] == 8
    assert [entry["name"] for entry in model.metadata()["inputs"]] == ["a", "b"]
    before = model.statistics()["model_stats"][0]["inference_count"]
    triton.client("AddSub").infer_sample(np.ones(1, F32), np.ones(1, F32))
    # Triton counts a request when it releases it, a moment after the response has been delivered.
    assert wait_for(lambda: model.statistics()["model_stats"][0]["inference_count"] == before + 1, 5)
    with pytest.raises(PyTritonInvalidOperationError, match="No model 'Missing' is bound"):
        triton.model("Missing")


def test_bad_inputs_and_failing_callables_raise_clear_errors(triton):
    client = triton.client("AddSub")
    with pytest.raises(tritonserver.InvalidArgumentError, match="takes 2 inputs, got 3"):
        client.infer_sample(np.ones(1, F32), np.ones(1, F32), np.ones(1, F32))
    with pytest.raises(tritonserver.InvalidArgumentError, match="'c'"):
        client.infer_sample(a=np.ones(1, F32), c=np.ones(1, F32))
    with pytest.raises(tritonserver.InvalidArgumentError, match="data-type"):
        client.infer_sample(np.ones(1, np.float64), np.ones(1, np.float64))
    with pytest.raises(tritonserver.InvalidArgumentError, match="expected 2 inputs but got 1"):
        client.infer_sample(np.ones(1, F32))
    with pytest.raises(tritonserver.InternalError, match="ValueError: no good"):
        triton.client("Fails").infer_sample(np.ones(1, F32))
    # The failing model and the server keep serving.
    assert client.infer_sample(np.ones(1, F32), np.ones(1, F32))["add"].tolist() == [2.0]


def test_many_threads_at_once_get_their_own_answers(triton):
    client = triton.client("Identity")
    results: Dict[int, np.ndarray] = {}
    errors: List[BaseException] = []

    def call(index: int) -> None:
        try:
            for _ in range(10):
                results[index] = client.infer_sample(np.full(4, index, dtype=F32))["y"]
                assert results[index].tolist() == [float(index)] * 4
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(index,)) for index in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert sorted(results) == list(range(16))


def test_live_bind_and_unbind(triton):
    with pytest.raises(PyTritonInvalidOperationError, match="No model 'Late' is bound"):
        triton.client("Late")
    _bind_identity(triton, "Late")  # loaded into the running in-process server before bind returns
    assert triton.client("Late").infer_sample(np.ones(2, F32))["y"].tolist() == [1.0, 1.0]
    late = triton.model("Late")
    triton.unbind("Late")
    assert not late.ready()
    with pytest.raises(PyTritonInvalidOperationError, match="No model 'Late' is bound"):
        triton.client("Late")
    with pytest.raises(tritonserver.TritonError):
        tritonserver.InProcessModelClient(triton.inprocess_server, "Late").infer_sample(np.ones(2, F32))
    assert wait_for(lambda: not child_stubs("/Late/"), 20), "the unbound model's stub kept running"


def test_a_load_that_fails_is_reported_and_the_server_keeps_serving(triton):
    # (Not a failing warmup: Triton 2.51 crashes on one of those about once in ten loads, and an
    # embedded server shares this process; see docs/inprocess.md.)
    with pytest.raises(PyTritonModelConfigError, match="could not load model 'NotInTheRepository'"):
        triton._backend.repository_request("load", "NotInTheRepository")
    assert triton.client("Identity").infer_sample(np.ones(1, F32))["y"].tolist() == [1.0]
