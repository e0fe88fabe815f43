"""NVIDIA PyTriton 0.7 behaviours against a live server (issue 15, item 6)."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

import pytriton
from pytriton.client import ModelClient
from pytriton.decorators import batch
from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import TritonConfig, TritonLifecyclePolicy
from tests.conftest import triton_ports, wait_for
from tests.e2e.test_healing import _stubs

SEEN = []


@batch
def _echo(x):
    return {"y": x}


def _strings(requests):
    # Request.span is None without OpenTelemetry, and traced_span is a no-op context manager.
    outputs = []
    for request in requests:
        with request.traced_span("echo") as span:
            SEEN.append((request.span, span))
            outputs.append({"s": request["s"]})
    return outputs


F32 = {
    "inputs": [Tensor(name="x", shape=(-1,), dtype=np.float32)],
    "outputs": [Tensor(name="y", shape=(-1,), dtype=np.float32)],
}


def test_stop_returns_whether_it_stopped():
    triton = pytriton.triton.Triton(config=TritonConfig(**triton_ports()))  # lazy submodule attribute
    triton.bind("Echo", _echo, **F32)
    triton.run()
    assert triton.stop() is True
    assert triton.stop() is False


@pytest.mark.parametrize("keyword", ["monitoring_period_s", "monitoring_period_sec"])
def test_serve_takes_monitoring_period_s_and_the_old_name(keyword):
    triton = pytriton.triton.Triton(
        config=TritonConfig(**triton_ports()),
        triton_lifecycle_policy=TritonLifecyclePolicy(launch_triton_on_startup=False, local_model_store=True),
    )
    triton.bind("Echo", _echo, **F32)
    errors = []

    def serve():
        try:
            triton.serve(**{keyword: 0.05})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert wait_for(triton.is_alive, 60)
        with ModelClient(triton.http_url, "Echo") as client:
            assert client.infer_sample(x=np.ones(2, np.float32))["y"].tolist() == [1.0, 1.0]
    finally:
        triton.stop()
        thread.join(30)
    assert not thread.is_alive() and not errors


def test_serve_refuses_a_bad_period():
    with pytriton.triton.Triton(config=TritonConfig(**triton_ports())) as triton:
        with pytest.raises(PyTritonBadParameterError, match="monitoring_period_s"):
            triton.serve(monitoring_period_s=0)


def test_is_alive_needs_every_model_to_serve():
    triton = pytriton.triton.Triton(config=TritonConfig(**triton_ports()))
    with triton:  # the server starts here; each bind below loads its model before returning
        triton.bind("Echo", _echo, **F32)
        assert triton.is_alive()
        triton.bind("Other", _echo, **F32)
        assert triton.is_alive()
        (stub,) = _stubs(triton._backend.server.pid, "Echo")
        os.kill(stub, signal.SIGKILL)
        assert wait_for(lambda: not triton.is_alive(), 10), "a model without its stub counted as serving"
        assert wait_for(triton.is_alive, 60), "not alive again after the stub was replaced"
        with ModelClient(triton.http_url, "Echo") as client:
            assert client.infer_sample(x=np.ones(1, np.float32))["y"].tolist() == [1.0]
    assert not triton.is_alive()


def test_response_cache_and_object_tensors():
    calls = []

    @batch
    def counted(x):
        calls.append(len(x))
        return {"y": x * 2}

    config = TritonConfig(cache_config=[f"local,size={1 << 20}"], **triton_ports())
    with pytriton.triton.Triton(config=config) as triton:
        triton.bind("Cached", counted, **F32, config=ModelConfig(max_batch_size=4, response_cache=True))
        triton.bind(
            "Strings",
            _strings,
            [Tensor(name="s", shape=(-1,), dtype=object)],
            [Tensor(name="s", shape=(-1,), dtype=object)],
            config=ModelConfig(batching=False),
        )
        with pytest.raises(PyTritonBadParameterError, match="sizes >= 1 or -1"):
            triton.bind("Empty", _echo, [Tensor(name="x", shape=(0,), dtype=np.float32)], F32["outputs"])
        triton.run()
        with ModelClient(triton.http_url, "Cached") as client:
            assert client.model_config.response_cache
            for _ in range(3):
                assert client.infer_sample(x=np.full(2, 3, np.float32))["y"].tolist() == [6.0, 6.0]
        assert calls == [1]  # the second and third requests were answered from Triton's cache
        with ModelClient(triton.grpc_url, "Strings") as client:
            assert client.infer_sample(s=np.array([b"a", b"bc"], dtype=object))["s"].tolist() == [b"a", b"bc"]
        assert SEEN == [(None, None)]
