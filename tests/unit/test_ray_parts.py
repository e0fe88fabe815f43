"""pytriton.ray without Ray: the max_ongoing_requests rule, the queue-time policy, KServe v2 JSON parsing."""

from __future__ import annotations

import types

import numpy as np
import pytest

from pytriton.model_config import ModelConfig, Tensor
from pytriton.ray import (
    PyTritonRequestError,
    QueueTimePolicy,
    max_ongoing_requests_for,
    parse_v2_inputs,
    queue_time_autoscaling,
)
from pytriton.ray._replica import _to_v2_output

IO = dict(
    inputs=[Tensor(name="x", shape=(-1,), dtype=np.float32)], outputs=[Tensor(name="y", shape=(-1,), dtype=np.float32)]
)


def test_max_ongoing_requests_follows_batching_and_instances():
    def bind(triton):
        triton.bind("A", lambda x: x, config=ModelConfig(max_batch_size=64), **IO)  # 64 * 1 * 2
        triton.bind("B", [lambda x: x, lambda x: x], **IO)  # default max_batch_size 4, two instances: 4 * 2 * 2
        triton.bind("C", lambda x: x, IO["inputs"], IO["outputs"], 1, ModelConfig(batching=False))  # 1 * 1 * 2

    assert max_ongoing_requests_for(bind) == 128 + 16 + 2


def test_max_ongoing_requests_refuses_what_it_cannot_count():
    with pytest.raises(ValueError, match="bound no model"):
        max_ongoing_requests_for(lambda triton: None)

    def uses_more(triton):
        triton.bind("A", lambda x: x, **IO)
        triton.run()

    with pytest.raises(AttributeError, match="max_ongoing_requests="):
        max_ongoing_requests_for(uses_more)


def _ctx(current, queue_ms, target=None):
    metrics = {"pytriton_queue_ms": dict(enumerate(queue_ms))} if queue_ms is not None else {}
    return types.SimpleNamespace(
        current_num_replicas=current,
        target_num_replicas=target if target is not None else current,
        aggregated_metrics=metrics,
    )


def test_queue_time_policy_scales_with_the_queue():
    policy = QueueTimePolicy(target_queue_ms=10)
    assert policy(_ctx(1, [25.0]))[0] == 3  # 2.5x the target: 3 replicas
    assert policy(_ctx(2, [12.0, 8.0]))[0] == 2  # at the target: stay
    assert policy(_ctx(3, [0.0, 0.5, 0.0]))[0] == 1  # idle: down to one (Ray applies min/delays)
    assert policy(_ctx(2, None, target=2))[0] == 2  # no report yet: keep
    with pytest.raises(ValueError):
        QueueTimePolicy(target_queue_ms=0)
    config = queue_time_autoscaling(max_replicas=4, target_queue_ms=3)
    assert config["policy"]["policy_function"] is QueueTimePolicy
    assert config["policy"]["policy_kwargs"] == {"target_queue_ms": 3}


def test_kserve_v2_inputs_and_outputs():
    inputs = parse_v2_inputs(
        {
            "inputs": [
                {"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]},
                {"name": "s", "shape": [1], "datatype": "BYTES", "data": ["héllo"]},
            ]
        }
    )
    np.testing.assert_array_equal(inputs["x"], np.array([[1, 2], [3, 4]], np.float32))
    assert inputs["x"].dtype == np.float32 and inputs["s"].tolist() == ["héllo".encode()]
    assert _to_v2_output("y", np.arange(3, dtype=np.int64)) == {
        "name": "y",
        "datatype": "INT64",
        "shape": [3],
        "data": [0, 1, 2],
    }
    assert _to_v2_output("s", np.array([b"a"], dtype=object))["data"] == ["a"]
    for bad in (
        {},
        {"inputs": [{"name": "x"}]},
        {"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1]}]},
        {"inputs": [{"name": "x", "shape": [1], "datatype": "FP8", "data": [1]}]},
    ):
        with pytest.raises(PyTritonRequestError):
            parse_v2_inputs(bad)
