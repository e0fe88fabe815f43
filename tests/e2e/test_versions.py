"""Several versions of one model name (issue 15, item 1), with the management endpoints restricted.

Each test of the versions runs on thread and on backend instances (tests/e2e/_kinds.py).
"""

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
from tests.e2e._kinds import KINDS, model
from tests.e2e.kind_models import Constant

IO = {
    "inputs": [Tensor(name="x", shape=(1,), dtype=np.float32)],
    "outputs": [Tensor(name="y", shape=(1,), dtype=np.float32)],
}


def _constant(value):
    return batch(Constant(value))


@pytest.fixture(scope="module")
def triton():
    with Triton(config=TritonConfig(**triton_ports())) as triton:
        for kind in KINDS:  # each instance kind (tests/e2e/_kinds.py)
            triton.bind(model("Versioned", kind), _constant(1.0), **IO, model_version=1, instance_kind=kind)
            triton.bind(model("Versioned", kind), _constant(2.0), **IO, model_version=2, instance_kind=kind)
        triton.run()
        yield triton


@pytest.fixture
def name(kind):
    return model("Versioned", kind)


def _http_infer(triton, name, version=""):
    client = httpclient.InferenceServerClient(triton.http_url[len("http://") :])
    try:
        tensor = httpclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
        return float(client.infer(name, [tensor], model_version=version).as_numpy("y")[0, 0])
    finally:
        client.close()


def _grpc_infer(triton, name, version=""):
    client = grpcclient.InferenceServerClient(triton.grpc_url[len("grpc://") :])
    try:
        tensor = grpcclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
        return float(client.infer(name, [tensor], model_version=version).as_numpy("y")[0, 0])
    finally:
        client.close()


def test_restriction_is_on(triton):
    assert triton.get_access_token()
    host, port = triton.http_url[len("http://") :].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("POST", "/v2/repository/index", body=b"{}")
    assert connection.getresponse().status == 403
    connection.close()


def test_raw_clients_select_a_version_or_get_the_latest(triton, name):
    assert [_http_infer(triton, name, v) for v in ("1", "2", "")] == [1.0, 2.0, 2.0]
    assert [_grpc_infer(triton, name, v) for v in ("1", "2", "")] == [1.0, 2.0, 2.0]
    client = httpclient.InferenceServerClient(triton.http_url[len("http://") :])
    assert client.is_model_ready(name, "1") and client.is_model_ready(name, "2")
    assert sorted(client.get_model_metadata(name)["versions"]) == ["1", "2"]
    client.close()


def test_pytriton_clients_select_a_version(triton, name):
    x = np.zeros((1, 1), np.float32)
    with ModelClient(triton.http_url, name, model_version="1") as client:
        assert client.infer_batch(x=x)["y"][0, 0] == 1.0
    with ModelClient(triton.grpc_url, name) as client:
        assert client.infer_batch(x=x)["y"][0, 0] == 2.0


def test_duplicate_and_incompatible_versions_are_refused(triton, name, kind):
    with pytest.raises(PyTritonModelAlreadyBoundError, match="version 1 is already bound"):
        triton.bind(name, _constant(9.0), **IO, model_version=1, instance_kind=kind)
    with pytest.raises(PyTritonInvalidOperationError):  # NVIDIA PyTriton's type for a duplicate
        triton.bind(name, _constant(9.0), **IO, model_version=2, instance_kind=kind)
    other_outputs = {"inputs": IO["inputs"], "outputs": [Tensor(name="z", shape=(1,), dtype=np.float32)]}
    with pytest.raises(PyTritonValidationError, match="output"):
        triton.bind(name, _constant(9.0), **other_outputs, model_version=7, instance_kind=kind)
    with pytest.raises(PyTritonValidationError, match="max_batch_size"):
        triton.bind(
            name, _constant(9.0), **IO, model_version=7, config=ModelConfig(max_batch_size=16), instance_kind=kind
        )
    assert [_http_infer(triton, name, v) for v in ("1", "2", "")] == [1.0, 2.0, 2.0]


def test_live_bind_adds_a_version_and_unbind_removes_only_it(triton, name, kind):
    triton.bind(name, _constant(3.0), **IO, model_version=3, instance_kind=kind)
    assert triton.is_alive()
    assert [_http_infer(triton, name, v) for v in ("1", "2", "3", "")] == [1.0, 2.0, 3.0, 3.0]
    assert _grpc_infer(triton, name, "3") == 3.0

    triton.unbind(name, 3)
    assert [_http_infer(triton, name, v) for v in ("1", "2", "")] == [1.0, 2.0, 2.0]
    with pytest.raises(InferenceServerException):
        _http_infer(triton, name, "3")
    triton.unbind(name, 2)
    assert [_grpc_infer(triton, name, v) for v in ("1", "")] == [1.0, 1.0]
    assert triton.is_alive()
    with pytest.raises(PyTritonInvalidOperationError, match="version 2"):
        triton.unbind(name, 2)
    triton.bind(name, _constant(2.0), **IO, model_version=2, instance_kind=kind)  # bound again: served again
    assert [_http_infer(triton, name, v) for v in ("1", "2", "")] == [1.0, 2.0, 2.0]


def test_unbinding_every_version_unloads_the_model(triton, name, kind):
    triton.bind(model("Short", kind), _constant(5.0), **IO, instance_kind=kind)
    client = httpclient.InferenceServerClient(triton.http_url[len("http://") :])
    try:
        assert client.is_model_ready(model("Short", kind))
        triton.unbind(model("Short", kind))
        assert not client.is_model_ready(model("Short", kind))
        assert triton.is_alive()
    finally:
        client.close()
