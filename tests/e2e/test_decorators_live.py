"""Decorators through a live server, called with raw tritonclient.

Every model is served by each instance kind whose callable sees the decorators' work, in one
server (tests/e2e/_kinds.py): ``thread`` (in this process) and ``backend`` (in the server's stub,
which imports ``tests/e2e/decorator_models.py`` by name).
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports
from tests.e2e._kinds import bind_kinds, model
from tests.e2e.decorator_models import linear, padded, ragged, reads_config, scaled, with_default


def _t(name, shape=(1,), dtype=np.float32, optional=False):
    return Tensor(name=name, shape=shape, dtype=dtype, optional=optional)


@pytest.fixture(scope="module")
def url():
    ports = triton_ports()
    with Triton(config=TritonConfig(**ports)) as triton:
        # Each model twice, as "<name>" and "<name>_backend" (tests/e2e/_kinds.py).
        bind_kinds(triton, "Linear", linear, [_t("x"), _t("w")], [_t("y")])
        bind_kinds(
            triton,
            "Ragged",
            ragged,
            [_t("width", dtype=np.int32)],
            [_t("y", (-1,), np.int32)],
            config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=200000)),
        )
        bind_kinds(triton, "Default", with_default, [_t("x"), _t("bias", optional=True)], [_t("y")])
        bind_kinds(triton, "Scaled", scaled, [_t("x"), _t("scale")], [_t("y")])
        bind_kinds(
            triton,
            "Padded",
            padded,
            [_t("x")],
            [_t("y"), _t("seen", dtype=np.int32)],
            config=ModelConfig(max_batch_size=16, batcher=DynamicBatcher(preferred_batch_size=[4, 8])),
        )
        # One callable under both names: the thread model's decorators must read its own config,
        # not the one the backend bind gives the same callable (pytriton/triton.py, _attach_context).
        bind_kinds(
            triton, "Context", reads_config, [_t("x")], [_t("info", dtype=bytes)], config=ModelConfig(max_batch_size=2)
        )
        triton.run()
        yield f"127.0.0.1:{ports['http_port']}"


def call(url, model, **arrays):
    client = httpclient.InferenceServerClient(url)
    inputs = []
    for name, array in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = client.infer(model, inputs)
    client.close()
    return result


def test_batch(url, kind):
    x = np.array([[1.0], [2.0]], np.float32)
    assert call(url, model("Linear", kind), x=x, w=np.full((2, 1), 3.0, np.float32)).as_numpy("y").tolist() == [
        [3.0],
        [6.0],
    ]


def test_group_by_values_with_padding(url, kind):
    width = np.array([[1], [3], [1]], dtype=np.int32)
    y = call(url, model("Ragged", kind), width=width).as_numpy("y")
    assert y.tolist() == [[0, -1, -1], [0, 1, 2], [1, -1, -1]]


def test_fill_optionals_with_absent_input(url, kind):
    x = np.array([[1.0]], np.float32)
    assert call(url, model("Default", kind), x=x).as_numpy("y").tolist() == [[101.0]]
    assert call(url, model("Default", kind), x=x, bias=np.array([[1.0]], np.float32)).as_numpy("y").tolist() == [[2.0]]


def test_first_value(url, kind):
    x = np.array([[1.0], [2.0]], np.float32)
    assert call(url, model("Scaled", kind), x=x, scale=np.full((2, 1), 0.5, np.float32)).as_numpy("y").tolist() == [
        [0.5],
        [1.0],
    ]


def test_pad_batch_model_sees_padded_size(url, kind):
    x = np.arange(3, dtype=np.float32).reshape(3, 1)
    result = call(url, model("Padded", kind), x=x)
    assert result.as_numpy("y").tolist() == [[0.0], [1.0], [2.0]]
    assert result.as_numpy("seen").tolist() == [[4], [4], [4]]  # padded to the preferred batch size


def test_triton_context_reads_model_config(url, kind):
    info = call(url, model("Context", kind), x=np.ones((1, 1), np.float32)).as_numpy("info")
    assert info[0, 0] == f"{model('Context', kind)}:2:['info']".encode()
