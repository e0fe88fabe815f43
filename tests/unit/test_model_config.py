import numpy as np
import pytest

from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config import DeviceKind, DynamicBatcher, ModelConfig, QueuePolicy, Tensor, TimeoutAction
from pytriton.model_config.dtypes import numpy_type, triton_type
from pytriton.model_config.generator import from_dict, to_dict, to_pbtxt
from pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig


@pytest.mark.parametrize(
    "dtype, expected",
    [
        (np.float32, np.float32),
        (np.dtype("float32"), np.float32),
        ("float32", np.float32),
        ("float16", np.float16),
        (bool, np.bool_),
        (np.bool_, np.bool_),
        (int, np.int64),
        (float, np.float64),
        (np.uint64, np.uint64),
        # object, bytes and np.object_ are kept as given, as in NVIDIA PyTriton (all mean BYTES).
        (bytes, bytes),
        (object, object),
        (np.bytes_, np.bytes_),
        (np.object_, np.object_),
        ("bytes", np.bytes_),
        (np.dtype("S5"), np.bytes_),
        (str, np.bytes_),
    ],
)
def test_tensor_accepts_every_dtype_form(dtype, expected):
    assert Tensor(shape=(1,), dtype=dtype).dtype is expected


@pytest.mark.parametrize("dtype", [np.complex64, "datetime64[s]", "not-a-dtype", np.void])
def test_unsupported_dtype_names_the_tensor(dtype):
    with pytest.raises(PyTritonBadParameterError, match="'x'"):
        Tensor(name="x", shape=(1,), dtype=dtype)


def test_shape_validation():
    assert Tensor(shape=[2, -1], dtype=np.int8).shape == (2, -1)
    # A size of 0 is accepted by Tensor, as in NVIDIA PyTriton; bind refuses it (test_api_drift.py).
    assert Tensor(shape=(0,), dtype=np.int8).shape == (0,)
    with pytest.raises(PyTritonBadParameterError):
        Tensor(shape=(-2,), dtype=np.int8)
    with pytest.raises(PyTritonBadParameterError):
        Tensor(shape=("a",), dtype=np.int8)


def test_triton_type_names():
    assert triton_type(np.float32) == "FP32"
    assert triton_type(bytes) == "BYTES"
    assert triton_type(bool) == "BOOL"
    assert numpy_type("TYPE_UINT16") is np.uint16
    assert numpy_type("TYPE_STRING") is np.bytes_


def test_model_config_defaults_match_the_spec():
    config = ModelConfig()
    assert (config.batching, config.max_batch_size, config.response_cache, config.decoupled) == (True, 4, False, False)
    assert config.batcher == DynamicBatcher()
    assert QueuePolicy().timeout_action is TimeoutAction.REJECT


def _full_config():
    return TritonModelConfig(
        model_name="m",
        max_batch_size=16,
        batcher=DynamicBatcher(
            max_queue_delay_microseconds=100,
            preferred_batch_size=[4, 8],
            priority_levels=2,
            default_priority_level=1,
            default_queue_policy=QueuePolicy(max_queue_size=10),
            priority_queue_policy={2: QueuePolicy(timeout_action=TimeoutAction.DELAY, default_timeout_microseconds=5)},
        ),
        instance_group={DeviceKind.KIND_CPU: 2},
        decoupled=True,
        backend_parameters={"k": "v w"},
        inputs=[TensorSpec("a", (-1,), np.float32), TensorSpec("s", (1,), np.bytes_, optional=True)],
        outputs=[TensorSpec("o", (2, 3), np.int64)],
        response_cache=True,
    )


def test_generated_config_is_complete():
    raw = to_dict(_full_config())
    assert raw["backend"] == "python" and raw["max_batch_size"] == 16
    assert raw["input"][1] == {"name": "s", "data_type": "TYPE_STRING", "dims": [1], "optional": True}
    assert raw["instance_group"] == [{"kind": "KIND_CPU", "count": 2}]
    assert raw["dynamic_batching"]["priority_queue_policy"]["2"]["timeout_action"] == "DELAY"
    assert raw["model_transaction_policy"] == {"decoupled": True}
    assert raw["response_cache"] == {"enable": True}
    assert raw["parameters"] == {"k": {"string_value": "v w"}}


def test_round_trip_through_dict():
    original = _full_config()
    parsed = from_dict(to_dict(original))
    assert parsed.inputs == original.inputs and parsed.outputs == original.outputs
    assert parsed.batcher == original.batcher
    assert parsed.instance_group == original.instance_group
    assert parsed.decoupled and parsed.response_cache and parsed.batching
    assert parsed.backend_parameters == {"k": "v w"}


def test_pbtxt_text_format():
    text = to_pbtxt(_full_config())
    assert 'name: "m"' in text
    assert "data_type: TYPE_FP32" in text
    assert "dims: [-1]" in text
    assert "kind: KIND_CPU" in text
    assert 'key: "k"' in text and 'string_value: "v w"' in text
    assert "timeout_action: DELAY" in text
    assert "key: 2" in text


def test_non_batching_model_has_zero_max_batch_size():
    config = TritonModelConfig(
        model_name="m", batching=False, max_batch_size=0, outputs=[TensorSpec("o", (1,), np.int8)]
    )
    assert to_dict(config)["max_batch_size"] == 0
    assert "dynamic_batching" not in to_dict(config)
