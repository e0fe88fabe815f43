"""Backend instances (``bind(..., instance_kind="backend")``) against a real server.

One module-scoped server serves every kind of callable from inside its stub processes (the
callables of tests/e2e/process_models.py, which the stubs import by name): raw tritonclient over
HTTP and gRPC, ``ModelClient`` and ``DecoupledModelClient``. Checked too: the callable really runs
in the stub (its pid is a ``triton_python_backend_stub`` child of the server), an error reaches the
client without a traceback, a callable that cannot be pickled fails ``bind``, and a stub that dies
(killed, or ending itself from the callable) is replaced by a new generation.
"""

from __future__ import annotations

import functools
import os
import signal
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pytriton.client import DecoupledModelClient, ModelClient
from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.model_config.common import ModelWarmup, WarmupInput
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports, wait_for
from tests.e2e import kind_models, process_models
from tests.e2e.test_healing import _stubs
from tests.e2e.test_metrics import parse
from tests.unit.test_backend_kind import Unpicklable

KIND = {"instance_kind": "backend"}


def _t(name, shape=(-1,), dtype=np.float32):
    return Tensor(name=name, shape=shape, dtype=dtype)


@pytest.fixture(scope="module")
def served():
    ports = triton_ports()
    with Triton(config=TritonConfig(**ports)) as triton:
        bind = triton.bind
        bind("Pid", [process_models.pid_echo] * 2, [_t("x")], [_t("x"), _t("pid", (1,), np.int64)], **KIND)
        bind("Doubled", process_models.doubled, [_t("x")], [_t("y")], **KIND)
        bind("Scaler", process_models.Scaler(3.0), [_t("x")], [_t("y")], **KIND)
        bind("Async", process_models.async_echo, [_t("x")], [_t("y")], **KIND)
        bind(
            "Tokens",
            process_models.tokens,
            [_t("n", (1,), np.int32)],
            [_t("token", (1,), np.int32)],
            config=ModelConfig(decoupled=True),
            **KIND,
        )
        bind("Faulty", process_models.fails_or_crashes, [_t("x")], [_t("y")], **KIND)
        for version in (1, 2):
            scaled = functools.partial(process_models.scaled, float(version * 10))
            bind("Versioned", scaled, [_t("x")], [_t("y")], model_version=version, **KIND)
        warmup = [ModelWarmup(name="zeros", batch_size=2, inputs={"x": WarmupInput(np.float32, (3,), zero_data=True)})]
        bind(
            "Warm",
            process_models.call_count,
            [_t("x")],
            [_t("y"), _t("calls", (1,), np.int64)],
            config=ModelConfig(max_batch_size=4, model_warmup=warmup),
            **KIND,
        )
        bind("Keep", process_models.keep_inputs, [_t("x")], [_t("sums", (3,))], **KIND)
        bind("Weighted", kind_models.Weighted(), [_t("x", (3,))], [_t("y", (3,))], **KIND)
        triton.run()
        yield triton, ports


MODELS = ("Pid", "Doubled", "Scaler", "Async", "Tokens", "Faulty", "Versioned", "Warm", "Keep", "Weighted")


def _stub_pids(server_pid):
    """Pids of the server's ``triton_python_backend_stub`` children, for every model of this module."""
    return [pid for model in MODELS for pid in _stubs(server_pid, model)]


def _raw_identity(lib, url):
    client = lib.InferenceServerClient(url)
    try:
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        tensor = lib.InferInput("x", [1, 16], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("Pid", [tensor])
        np.testing.assert_array_equal(result.as_numpy("x"), x)
        return int(result.as_numpy("pid")[0, 0])
    finally:
        client.close()


def test_the_callable_runs_in_a_stub_of_the_server_over_http_and_grpc(served):
    triton, ports = served
    stubs = _stub_pids(triton._backend.server.pid)
    pids = {_raw_identity(httpclient, f"127.0.0.1:{ports['http_port']}") for _ in range(4)}
    pids |= {_raw_identity(grpcclient, f"127.0.0.1:{ports['grpc_port']}") for _ in range(4)}
    assert os.getpid() not in pids
    assert pids <= set(stubs), (pids, stubs)


def test_decorators_objects_and_async_callables(served):
    _, ports = served
    url = f"http://127.0.0.1:{ports['http_port']}"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with ModelClient(url, "Doubled") as client:
        np.testing.assert_array_equal(client.infer_batch(x=x)["y"], x * 2)
    with ModelClient(url, "Scaler") as client:
        np.testing.assert_array_equal(client.infer_batch(x=x)["y"], x * 3)
    with ModelClient(url, "Async") as client:
        np.testing.assert_array_equal(client.infer_batch(x=x)["y"], x + 1)


def test_an_object_holding_numpy_weights_made_in_init_serves(served):
    """Its arrays, scalar and dtype cross to the stub's numpy (1.x beside numpy 2 on Python 3.9-3.12)."""
    _, ports = served
    model = kind_models.Weighted()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with ModelClient(f"http://127.0.0.1:{ports['http_port']}", "Weighted") as client:
        y = client.infer_batch(x=x)["y"]
    np.testing.assert_allclose(y, ((x @ model.weights) * model.layers["scale"] + model.bias).astype(np.float32))


def test_a_generator_streams_through_the_decoupled_model(served):
    _, ports = served
    with DecoupledModelClient(f"grpc://127.0.0.1:{ports['grpc_port']}", "Tokens") as client:
        tokens = [int(result["token"][0]) for result in client.infer_sample(n=np.array([5], np.int32))]
    assert tokens == [0, 1, 2, 3, 4]


def test_an_error_of_the_callable_reaches_the_client_without_a_traceback(served):
    _, ports = served
    client = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}")
    tensor = httpclient.InferInput("x", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("Faulty", [tensor])
    finally:
        client.close()
    assert "ValueError: bad value 1" in str(caught.value)
    assert "Traceback" not in str(caught.value) and ".py" not in str(caught.value)


def test_versions_warmup_and_metrics(served):
    _, ports = served
    url = f"http://127.0.0.1:{ports['http_port']}"
    x = np.ones((1, 3), np.float32)
    for version in (1, 2):
        with ModelClient(url, "Versioned", model_version=str(version)) as client:
            np.testing.assert_array_equal(client.infer_batch(x=x)["y"], x * version * 10)
    with ModelClient(url, "Warm") as client:
        calls = int(client.infer_batch(x=x)["calls"][0, 0])
    assert calls >= 2, "Triton's warmup batch should have run in the stub before the first request"
    # The callables' metrics come from the stub as for the other kinds (docs/metrics.md).
    labels = (("generation", "0"), ("instance", "0"), ("model", "Doubled"), ("version", "1"))

    def batches():
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics_port']}/metrics", timeout=10) as response:
            return parse(response.read().decode()).get(("pytriton_batch_size_count", labels), -1.0)

    time.sleep(1.5)  # the stub pushes its counts once per second: let earlier tests' batches show first
    before = batches()
    with ModelClient(url, "Doubled") as client:
        for _ in range(3):
            client.infer_batch(x=x)
    assert wait_for(lambda: batches() == before + 3, 10), (before, batches())


def test_inputs_the_callable_keeps_stay_valid(served):
    """Large inputs (Triton's own tensors in the stub) kept past the call are not overwritten by later requests."""
    _, ports = served
    with ModelClient(f"http://127.0.0.1:{ports['http_port']}", "Keep") as client:
        for step in range(6):
            sums = client.infer_sample(x=np.full(1 << 18, step + 1, np.float32))["sums"]  # 1 MiB each
    np.testing.assert_array_equal(sums, [1 << 18, 2 << 18, 3 << 18])


def test_a_callable_that_cannot_be_pickled_fails_bind(served):
    triton, _ = served
    with pytest.raises(PyTritonBadParameterError, match="instance_kind='backend'.*cannot be pickled"):
        triton.bind("Bad", Unpicklable(), [_t("x")], [_t("y")], instance_kind="backend")
    with pytest.raises(PyTritonBadParameterError, match="execution_timeout_s"):
        triton.bind(
            "Bad", process_models.doubled, [_t("x")], [_t("y")], config=ModelConfig(execution_timeout_s=1), **KIND
        )


def _serves(url, model, value=0.0):
    try:
        with ModelClient(url, model, init_timeout_s=5, inference_timeout_s=5) as client:
            result = client.infer_sample(x=np.array([value], np.float32))
        return result
    except Exception:  # noqa: BLE001 - failing while the stub is replaced
        return None


def test_a_dead_stub_is_replaced(served):
    triton, ports = served
    url = f"http://127.0.0.1:{ports['http_port']}"
    # Killed from outside: the Pid model's stub.
    before = _stub_pids(triton._backend.server.pid)
    victim = int(_serves(url, "Pid")["pid"][0])
    os.kill(victim, signal.SIGKILL)
    started = time.monotonic()
    assert wait_for(lambda: all(_serves(url, "Pid") is not None for _ in range(5)), 60)
    assert wait_for(lambda: victim not in _stub_pids(triton._backend.server.pid), 20)
    print(f"Pid serving again {time.monotonic() - started:.2f} s after the kill")
    # Ended from inside, by the callable (x == 2: os._exit in the stub): that batch fails, then it heals.
    assert _serves(url, "Faulty", 2.0) is None
    assert wait_for(lambda: _serves(url, "Faulty", 5.0) is not None, 60)
    assert triton.is_alive() and len(_stub_pids(triton._backend.server.pid)) == len(before)


def test_stop_waits_for_a_batch_running_in_a_stub():
    """The stub marks its batches in the model's status page, so the drain waits for them."""
    import threading

    ports = triton_ports()
    url = f"http://127.0.0.1:{ports['http_port']}"
    triton = Triton(config=TritonConfig(**ports))
    try:
        triton.bind("Slow", process_models.slower_echo, [_t("x")], [_t("y")], **KIND)
        triton.run()
        results = []

        def call():
            with ModelClient(url, "Slow", inference_timeout_s=30) as client:
                results.append(client.infer_sample(x=np.array([7.0], np.float32)))

        thread = threading.Thread(target=call)
        thread.start()
        assert wait_for(lambda: any(model.busy for model in triton._models.values()), 10)
        started = time.monotonic()
        triton.stop()
        thread.join(30)
        assert results and results[0]["y"][0] == 7.0, "the batch in the stub was cut off by stop()"
        assert time.monotonic() - started < 10
    finally:
        triton.stop()


def test_a_slow_load_in_a_stub_says_where_it_is_in_the_server_log(monkeypatch):
    """A stub whose initialize runs long writes one line per period naming where it is (stubside/_stub_slow.py)."""
    monkeypatch.setenv("PYTRITON_STUB_SLOW_INITIALIZE_S", "0.3")  # the stub inherits the server's environment
    ports = triton_ports()
    with Triton(config=TritonConfig(**ports)) as triton:
        triton.bind("SlowToLoad", process_models.SlowToLoad(1.5), [_t("x")], [_t("y")], **KIND)
        triton.run()
        with ModelClient(f"127.0.0.1:{ports['http_port']}", "SlowToLoad") as client:
            assert client.infer_sample(x=np.array([3.0], np.float32))["y"].tolist() == [3.0]
        reports = [line for line in triton.server_log if "initialize has run for" in line]
    assert reports, triton.server_log[-20:]
    assert "pytriton: model 'SlowToLoad', instance 'SlowToLoad_0_0': initialize has run for" in reports[0]
    assert "now at: " in reports[0]
    # A report comes every 0.3 s: under load the first may still find the stub importing the user's
    # modules, but one falls in the 1.5 s that unpickling the callable takes.
    assert any("__setstate__ (" in line and "process_models.py:" in line for line in reports), reports


def test_an_unrecoverable_error_in_a_stub_stops_the_server():
    import threading

    ports = triton_ports()
    triton = Triton(config=TritonConfig(**ports))
    try:
        triton.bind("Doomed", process_models.doomed, [_t("x")], [_t("y")], **KIND)
        triton.run()
        done = threading.Event()
        threading.Thread(target=lambda: (triton.serve(monitoring_period_sec=0.1), done.set()), daemon=True).start()
        client = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}")
        tensor = httpclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
        with pytest.raises(InferenceServerException, match="the GPU caught fire"):
            client.infer("Doomed", [tensor])
        client.close()
        assert done.wait(20), "serve() should return after an unrecoverable error in a backend instance"
        assert not triton.is_alive()
    finally:
        triton.stop()
