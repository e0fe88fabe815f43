"""Several versions of one model name (issue 15, item 1), with the management endpoints restricted."""

from __future__ import annotations

import http.client

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pytriton.client import ModelClient
from pytriton.decorators import batch
from pytriton.exceptions import PyTritonInvalidOperationError, PyTritonModelAlreadyBoundError, PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports

IO = {
    "inputs": [Tensor(name="x", shape=(1,), dtype=np.float32)],
    "outputs": [Tensor(name="y", shape=(1,), dtype=np.float32)],
}


def _constant(value):
    @batch
    def infer(x):
        return {"y": np.full_like(x, value)}

    return infer


@pytest.fixture(scope="module")
def triton():
    with Triton(config=TritonConfig(**triton_ports())) as triton:
        triton.bind("Versioned", _constant(1.0), **IO, model_version=1)
        triton.bind("Versioned", _constant(2.0), **IO, model_version=2)
        triton.run()
        yield triton


def _http_infer(triton, version=""):
    client = httpclient.InferenceServerClient(triton.http_url[len("http://") :])
    try:
        tensor = httpclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
        return float(client.infer("Versioned", [tensor], model_version=version).as_numpy("y")[0, 0])
    finally:
        client.close()


def _grpc_infer(triton, version=""):
    client = grpcclient.InferenceServerClient(triton.grpc_url[len("grpc://") :])
    try:
        tensor = grpcclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
        return float(client.infer("Versioned", [tensor], model_version=version).as_numpy("y")[0, 0])
    finally:
        client.close()


def test_restriction_is_on(triton):
    assert triton.get_access_token()
    host, port = triton.http_url[len("http://") :].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("POST", "/v2/repository/index", body=b"{}")
    assert connection.getresponse().status == 403
    connection.close()


def test_raw_clients_select_a_version_or_get_the_latest(triton):
    assert [_http_infer(triton, v) for v in ("1", "2", "")] == [1.0, 2.0, 2.0]
    assert [_grpc_infer(triton, v) for v in ("1", "2", "")] == [1.0, 2.0, 2.0]
    client = httpclient.InferenceServerClient(triton.http_url[len("http://") :])
    assert client.is_model_ready("Versioned", "1") and client.is_model_ready("Versioned", "2")
    assert sorted(client.get_model_metadata("Versioned")["versions"]) == ["1", "2"]
    client.close()


def test_pytriton_clients_select_a_version(triton):
    x = np.zeros((1, 1), np.float32)
    with ModelClient(triton.http_url, "Versioned", model_version="1") as client:
        assert client.infer_batch(x=x)["y"][0, 0] == 1.0
    with ModelClient(triton.grpc_url, "Versioned") as client:
        assert client.infer_batch(x=x)["y"][0, 0] == 2.0


def test_duplicate_and_incompatible_versions_are_refused(triton):
    with pytest.raises(PyTritonModelAlreadyBoundError, match="version 1 is already bound"):
        triton.bind("Versioned", _constant(9.0), **IO, model_version=1)
    with pytest.raises(PyTritonInvalidOperationError):  # NVIDIA PyTriton's type for a duplicate
        triton.bind("Versioned", _constant(9.0), **IO, model_version=2)
    other_outputs = {"inputs": IO["inputs"], "outputs": [Tensor(name="z", shape=(1,), dtype=np.float32)]}
    with pytest.raises(PyTritonValidationError, match="output"):
        triton.bind("Versioned", _constant(9.0), **other_outputs, model_version=7)
    with pytest.raises(PyTritonValidationError, match="max_batch_size"):
        triton.bind("Versioned", _constant(9.0), **IO, model_version=7, config=ModelConfig(max_batch_size=16))
    assert [_http_infer(triton, v) for v in ("1", "2", "")] == [1.0, 2.0, 2.0]


def test_live_bind_adds_a_version_and_unbind_removes_only_it(triton):
    triton.bind("Versioned", _constant(3.0), **IO, model_version=3)
    assert triton.is_alive()
    assert [_http_infer(triton, v) for v in ("1", "2", "3", "")] == [1.0, 2.0, 3.0, 3.0]
    assert _grpc_infer(triton, "3") == 3.0

    triton.unbind("Versioned", 3)
    assert [_http_infer(triton, v) for v in ("1", "2", "")] == [1.0, 2.0, 2.0]
    with pytest.raises(InferenceServerException):
        _http_infer(triton, "3")
    triton.unbind("Versioned", 2)
    assert [_grpc_infer(triton, v) for v in ("1", "")] == [1.0, 1.0]
    assert triton.is_alive()
    with pytest.raises(PyTritonInvalidOperationError, match="version 2"):
        triton.unbind("Versioned", 2)
    triton.bind("Versioned", _constant(2.0), **IO, model_version=2)  # bound again: served again
    assert [_http_infer(triton, v) for v in ("1", "2", "")] == [1.0, 2.0, 2.0]


def test_unbinding_every_version_unloads_the_model(triton):
    triton.bind("Short", _constant(5.0), **IO)
    client = httpclient.InferenceServerClient(triton.http_url[len("http://") :])
    try:
        assert client.is_model_ready("Short")
        triton.unbind("Short")
        assert not client.is_model_ready("Short")
        assert triton.is_alive()
    finally:
        client.close()
