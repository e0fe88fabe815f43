"""inprocess/_client.py: ``InProcessModelClient`` on a fake server and model (no Triton library needed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict, List

import numpy as np
import pytest

from pytriton.inprocess import (
    DataType,
    InProcessModelClient,
    InvalidArgumentError,
    ModelTxnPropertyFlag,
    Tensor,
    UnavailableError,
)

CONFIG = {
    "max_batch_size": 4,
    "input": [{"name": "a"}, {"name": "b"}],
    "output": [{"name": "sum"}, {"name": "text"}],
}


class FakeModel:
    """Answers ``sum`` (``a + b``) and ``text`` (``b"ok"`` per sample), or echoes BYTES ``b``; records each call."""

    name = "AddSub"

    def __init__(self, config: Dict[str, Any], decoupled: bool = False, ready: bool = True):
        self._config = config
        self._decoupled = decoupled
        self._ready = ready
        self.config_reads = 0
        self.properties_reads = 0
        self.calls: List[Dict[str, Any]] = []

    def config(self) -> Dict[str, Any]:
        self.config_reads += 1
        return self._config

    def ready(self) -> bool:
        return self._ready

    def transaction_properties(self) -> int:
        self.properties_reads += 1
        return int(ModelTxnPropertyFlag.DECOUPLED) if self._decoupled else 0

    def infer(self, inputs: Dict[str, Any], parameters: Dict[str, Any]) -> Any:
        self.calls.append({"inputs": inputs, "parameters": parameters})
        if isinstance(inputs["b"], Tensor):  # BYTES: echoed as ``text``
            yield SimpleNamespace(outputs={"text": inputs["b"]})
            return
        total = np.asarray(inputs["a"]) + np.asarray(inputs["b"])
        text = np.array([[b"ok"]] * total.shape[0], dtype=object)
        yield SimpleNamespace(outputs={"sum": Tensor.from_dlpack(total), "text": Tensor.from_bytes_array(text)})


class FakeServer:
    def __init__(self, model: FakeModel):
        self._model = model
        self.asked: List[Any] = []

    def model(self, name: str, version: int = -1) -> FakeModel:
        self.asked.append((name, version))
        return self._model


def test_infer_sample_adds_and_removes_the_batch_axis_and_follows_the_input_order():
    model = FakeModel(CONFIG)
    server = FakeServer(model)
    with InProcessModelClient(server, "AddSub", model_version="2") as client:  # type: ignore[arg-type]
        outputs = client.infer_sample(np.float32([1, 2]), np.float32([10, 20]), parameters={"p": 1})
        np.testing.assert_array_equal(outputs["sum"], [11, 22])
        assert outputs["text"].tolist() == [b"ok"]
        assert model.calls[0]["inputs"]["a"].shape == (1, 2) and model.calls[0]["parameters"] == {"p": 1}
        batch = client.infer_batch(a=np.float32([[1], [2]]), b=np.float32([[3], [4]]))
        np.testing.assert_array_equal(batch["sum"], [[4], [6]])
        assert client.model_config is client.model_config and model.config_reads == 1  # read once
        assert model.properties_reads == 1  # whether it is decoupled: read once too
    assert server.asked == [("AddSub", 2)]


def test_bytes_inputs_travel_as_bytes_tensors():
    model = FakeModel({**CONFIG, "max_batch_size": 0})
    client = InProcessModelClient(FakeServer(model), "AddSub")  # type: ignore[arg-type]
    outputs = client.infer_sample(a=np.array([b"x"], dtype=object), b=np.array([b"y", b"z"], dtype=object))
    sent = model.calls[0]["inputs"]["a"]
    assert isinstance(sent, Tensor) and sent.data_type == DataType.BYTES
    assert sent.to_bytes_array().tolist() == [b"x"]
    assert outputs["text"].tolist() == [b"y", b"z"]  # BYTES outputs come back as object arrays of bytes


@pytest.mark.parametrize(
    "model, call, message",
    [
        (FakeModel({**CONFIG, "max_batch_size": 0}), lambda c: c.infer_batch(np.ones(1), np.ones(1)), "does not batch"),
        (FakeModel(CONFIG, decoupled=True), lambda c: c.infer_sample(np.ones(1), np.ones(1)), "decoupled"),
        (FakeModel(CONFIG), lambda c: c.infer_sample(np.ones(1), b=np.ones(1)), "not both"),
        (FakeModel(CONFIG), lambda c: c.infer_sample(np.ones(1), np.ones(1), np.ones(1)), "takes 2 inputs, got 3"),
    ],
)
def test_bad_calls_raise_invalid_argument_before_inferring(model, call, message):
    client = InProcessModelClient(FakeServer(model), "AddSub")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=message):
        call(client)
    assert model.calls == []


def test_a_closed_client_refuses_calls():
    client = InProcessModelClient(FakeServer(FakeModel(CONFIG)), "AddSub")  # type: ignore[arg-type]
    client.close()
    client.close()  # idempotent
    with pytest.raises(InvalidArgumentError, match="closed"):
        client.infer_sample(np.ones(1), np.ones(1))


def test_wait_for_model():
    InProcessModelClient(FakeServer(FakeModel(CONFIG)), "AddSub").wait_for_model(0)  # type: ignore[arg-type]
    client = InProcessModelClient(FakeServer(FakeModel(CONFIG, ready=False)), "AddSub")  # type: ignore[arg-type]
    with pytest.raises(UnavailableError, match="not ready within 0 s"):
        client.wait_for_model(0)
