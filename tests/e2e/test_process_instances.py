"""Process instances (``bind(..., instance_kind="process")``) against a real server.

One module-scoped server serves every kind of callable from worker processes; two short-lived
child processes check that SIGTERM (``serve()`` then ``stop()``) and SIGKILL of the user's process
leave no worker process, socket or segment behind.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from pytriton.client import DecoupledModelClient, ModelClient
from pytriton.client.exceptions import PyTritonClientInferenceServerError
from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import shm_entries, triton_ports, wait_for
from tests.e2e import process_models

CHILD = pathlib.Path(__file__).with_name("process_child.py")
REPO = pathlib.Path(__file__).parents[2]


def _t(name, shape=(-1,), dtype=np.float32):
    return Tensor(name=name, shape=shape, dtype=dtype)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


@pytest.fixture(scope="module")
def served():
    ports = triton_ports()
    with Triton(config=TritonConfig(**ports)) as triton:
        bind = triton.bind
        bind(
            "Pid",
            [process_models.pid_echo] * 2,
            [_t("x")],
            [_t("x"), _t("pid", (1,), np.int64)],
            instance_kind="process",
        )
        bind("Doubled", process_models.doubled, [_t("x")], [_t("y")], instance_kind="process")
        bind("Scaler", process_models.Scaler(3.0), [_t("x")], [_t("y")], instance_kind="process")
        bind("Async", process_models.async_echo, [_t("x")], [_t("y")], instance_kind="process")
        bind(
            "Tokens",
            process_models.tokens,
            [_t("n", (1,), np.int32)],
            [_t("token", (1,), np.int32)],
            config=ModelConfig(decoupled=True),
            instance_kind="process",
        )
        bind("Faulty", process_models.fails_or_crashes, [_t("x")], [_t("y")], instance_kind="process")
        triton.run()
        yield triton, f"http://127.0.0.1:{ports['http_port']}", f"grpc://127.0.0.1:{ports['grpc_port']}"


def _worker_pids(triton, name):
    return [worker.pid for model in triton._models.values() if model.name == name for worker in model._workers]


def test_each_instance_runs_in_its_own_worker_process(served):
    triton, http, _ = served
    pids = _worker_pids(triton, "Pid")
    assert len(set(pids)) == 2 and os.getpid() not in pids
    seen = set()
    results = []

    def call():
        with ModelClient(http, "Pid") as client:
            for _ in range(20):
                results.append(client.infer_sample(np.arange(3, dtype=np.float32)))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 80
    for result in results:
        np.testing.assert_array_equal(result["x"], np.arange(3, dtype=np.float32))
        seen.add(int(result["pid"][0]))
    assert seen <= set(pids) and seen  # served by the worker processes, never by this process


@pytest.mark.parametrize("model, expected", [("Doubled", 2.0), ("Scaler", 3.0), ("Async", None)])
def test_decorated_functions_objects_and_async_callables(served, model, expected):
    _, http, _ = served
    x = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    with ModelClient(http, model) as client:
        y = client.infer_batch(x=x)["y"]
    np.testing.assert_array_equal(y, x * expected if expected is not None else x + 1)


def test_a_generator_streams_from_a_worker_process(served):
    _, _, grpc = served
    with DecoupledModelClient(grpc, "Tokens") as client:
        tokens = [int(r["token"][0]) for r in client.infer_sample(n=np.array([5], dtype=np.int32))]
    assert tokens == [0, 1, 2, 3, 4]


def test_an_exception_fails_the_request_and_the_instance_keeps_serving(served):
    triton, http, _ = served
    pid = _worker_pids(triton, "Faulty")[0]
    with ModelClient(http, "Faulty") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="ValueError: bad value 1"):
            client.infer_sample(np.array([1.0], dtype=np.float32))
        np.testing.assert_array_equal(client.infer_sample(np.array([5.0], np.float32))["y"], [5.0])
    assert _worker_pids(triton, "Faulty") == [pid]


def test_a_crashed_worker_fails_its_request_cleanly_and_is_replaced(served, caplog):
    triton, http, _ = served
    (old,) = _worker_pids(triton, "Faulty")
    with ModelClient(http, "Faulty") as client:
        with pytest.raises(PyTritonClientInferenceServerError) as failure:
            client.infer_sample(np.array([2.0], dtype=np.float32))  # os._exit(3) in the worker
        text = str(failure.value)
        assert "closed the connection" in text and "Traceback" not in text
        assert wait_for(lambda: _worker_pids(triton, "Faulty")[0] not in (None, old), 60)
        np.testing.assert_array_equal(client.infer_sample(np.array([7.0], np.float32))["y"], [7.0])
    assert not _alive(old)
    assert any("died (exit code 3)" in record.getMessage() for record in caplog.records)
    with ModelClient(http, "Doubled") as client:  # the other models were not affected
        np.testing.assert_array_equal(client.infer_sample(np.ones(2, np.float32))["y"], [2.0, 2.0])


def test_a_worker_killed_while_idle_is_replaced_without_failing_a_request(served):
    triton, http, _ = served
    (old,) = _worker_pids(triton, "Faulty")
    with ModelClient(http, "Faulty") as client:
        np.testing.assert_array_equal(client.infer_sample(np.array([3.0], np.float32))["y"], [3.0])
        os.kill(old, signal.SIGKILL)
        assert wait_for(lambda: _worker_pids(triton, "Faulty")[0] not in (None, old), 60)
        assert triton.is_alive()  # its stub lives on and connects again on its next batch
        np.testing.assert_array_equal(client.infer_sample(np.array([4.0], np.float32))["y"], [4.0])


def test_an_unpicklable_callable_is_refused_at_bind(served):
    triton, _, _ = served
    factor = 2.0
    with pytest.raises(PyTritonBadParameterError) as refused:
        triton.bind(
            "Lambda",
            lambda requests: [{"y": r["x"] * factor} for r in requests],
            [_t("x")],
            [_t("y")],
            instance_kind="process",
        )
    message = str(refused.value)
    assert "cannot be pickled" in message and "module level" in message and "instance_kind='thread'" in message
    assert ("Lambda", 1) not in triton._models


def test_a_live_bind_serves_and_unbind_ends_its_worker_processes(served):
    triton, http, _ = served
    triton.bind("Live", process_models.doubled, [_t("x")], [_t("y")], instance_kind="process")
    (pid,) = _worker_pids(triton, "Live")
    with ModelClient(http, "Live") as client:
        np.testing.assert_array_equal(client.infer_sample(np.ones(2, np.float32))["y"], [2.0, 2.0])
    triton.unbind("Live")
    assert wait_for(lambda: not _alive(pid), 10)


def _run_child(ports):
    child = subprocess.Popen(
        [sys.executable, str(CHILD), *(str(ports[key]) for key in ("http_port", "grpc_port", "metrics_port"))],
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    line = child.stdout.readline()
    assert line, "the child failed to start"
    return child, json.loads(line)


def _catches_sigterm(pid):
    with open(f"/proc/{pid}/status") as status:
        caught = next(line for line in status if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


def _assert_nothing_left(info):
    assert wait_for(lambda: not any(_alive(pid) for pid in info["workers"]), 10), "worker processes left behind"
    assert wait_for(lambda: not shm_entries(info["shm_prefix"]), 10), shm_entries(info["shm_prefix"])
    assert wait_for(lambda: not pathlib.Path(info["socket_dir"]).exists(), 10), "socket directory left behind"


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"]
)
def test_signals_leave_no_worker_process(signum):
    child, info = _run_child(triton_ports())
    try:
        assert len(info["workers"]) == 2 and all(_alive(pid) for pid in info["workers"])
        # serve() installs its SIGINT and SIGTERM handlers a moment after the line above.
        assert wait_for(lambda: _catches_sigterm(child.pid), 30)
        child.send_signal(signum)
        child.wait(60)
        if signum != signal.SIGKILL:  # serve() returned after stop()
            assert child.returncode == 0 and child.stdout.read().strip() == b"served"
        _assert_nothing_left(info)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()


def test_stop_drains_process_instances_without_losing_accepted_requests():
    """Requests running or queued when stop() begins are all answered, from worker processes too."""
    from pytriton.server import _drain

    ports = triton_ports()
    triton = Triton(config=TritonConfig(**ports, exit_timeout_secs=20))
    triton.bind(
        "Slow",
        [process_models.slow_echo] * 2,
        [_t("x")],
        [_t("y")],
        config=ModelConfig(batching=False),
        instance_kind="process",
    )
    triton.run()
    url = f"grpc://127.0.0.1:{ports['grpc_port']}"
    clients = [ModelClient(url, "Slow", init_timeout_s=10) for _ in range(8)]
    results = {}
    try:
        for client in clients:  # connected and ready before the burst
            client.infer_sample(x=np.zeros((2,), dtype=np.float32))

        def send(index):
            results[index] = clients[index].infer_sample(x=np.full((2,), float(index), dtype=np.float32))["y"].tolist()

        senders = [threading.Thread(target=send, args=(index,)) for index in range(8)]
        for sender in senders:
            sender.start()

        def accepted():  # two batches in the worker processes, six requests queued in Triton
            pending = _drain.pending_requests("127.0.0.1", ports["metrics_port"]).get(("Slow", "1"), 0)
            return triton._models[("Slow", 1)].busy and pending >= 6

        assert wait_for(accepted, 10.0)
        assert triton.stop()
        for sender in senders:
            sender.join(30)
    finally:
        triton.stop()
        for client in clients:
            client.close()
    assert results == {index: [float(index)] * 2 for index in range(8)}


def test_the_main_script_runs_again_only_where_the_callable_lives_in_it(tmp_path):
    """A worker process or backend stub reruns the main script (as ``__mp_main__``) for a callable
    defined there, and not for one imported from a module (docs/architecture.md)."""
    marker = tmp_path / "ran"
    ports = triton_ports()
    env = dict(os.environ, PYTRITON_TEST_MAIN_MARKER=str(marker), PYTHONPATH=str(REPO))
    child = subprocess.run(
        [sys.executable, str(CHILD.with_name("main_script_child.py")), *map(str, ports.values())],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["answers"]["Square"] == result["answers"]["SquareBackend"] == [[1.0, 4.0, 9.0]]
    assert result["answers"]["Module"] == [[1.0, 2.0, 3.0]]
    ran = [int(line) for line in marker.read_text().split()]
    (square_worker,) = result["workers"]["Square"]
    (module_worker,) = result["workers"]["Module"]
    assert result["pid"] in ran and square_worker in ran  # the script, and again where its callable runs
    assert len(ran) == 3  # ... and in the backend model's stub: nowhere else
    assert module_worker not in ran  # pid_echo comes from a module: the script did not run there


@pytest.mark.parametrize("kind", ["process", "backend"])
def test_a_main_script_without_a_main_guard_gets_a_clear_error_and_no_second_server(tmp_path, kind):
    """The script starts Triton at module level and its callable lives in it: the worker process or
    the backend stub that imports it must refuse to start Triton again (no server inside the stub),
    and the script's ``run()`` fails naming the fix."""
    marker = tmp_path / "ran"
    ports = ",".join(map(str, triton_ports().values()))
    env = dict(
        os.environ,
        PYTRITON_TEST_MAIN_MARKER=str(marker),
        PYTHONPATH=str(REPO),
        PYTRITON_TEST_KIND=kind,
        PYTRITON_TEST_PORTS=ports,
    )
    child = subprocess.run(
        [sys.executable, str(CHILD.with_name("unguarded_child.py"))],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert child.returncode != 0 and "served" not in child.stdout, child.stdout
    # the fix, named (a stub's error reaches the script through Triton's log, its quotes escaped)
    assert "if __name__ ==" in child.stderr and "starts Triton again" in child.stderr, child.stderr[-3000:]
    # The script ran in the test's child and where the callable is loaded (a worker process, which
    # is restarted up to its limit, or the one stub), and nowhere else: a server started from there
    # would load the callable again and rerun the script once more.
    ran = marker.read_text().split()
    assert 2 <= len(ran) <= (1 + 5 if kind == "process" else 2), ran
