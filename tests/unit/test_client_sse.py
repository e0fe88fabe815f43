"""The pure parts of HTTP streaming (generate_stream): request encoding, event parsing, output decoding."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pytriton.client._sse import decode_event, encode_request, iter_events
from pytriton.client.exceptions import PyTritonClientInferenceServerError
from pytriton.model_config.generator import from_dict


def _config(batching: bool):
    return from_dict(
        {
            "name": "Gen",
            "max_batch_size": 4 if batching else 0,
            "input": [{"name": "n", "data_type": "TYPE_INT32", "dims": [1]}],
            "output": [
                {"name": "tok", "data_type": "TYPE_INT32", "dims": [1]},
                {"name": "vec", "data_type": "TYPE_FP32", "dims": [-1, 2]},
                {"name": "text", "data_type": "TYPE_STRING", "dims": [1]},
            ],
            "model_transaction_policy": {"decoupled": True},
        }
    )


def test_encode_request_flattens_and_decodes_strings():
    body = json.loads(
        encode_request({"n": np.array([[3]], np.int32), "s": np.array([b"hi"], dtype=object)}, {"temperature": 0.5})
    )
    assert body == {"n": [3], "s": ["hi"], "parameters": {"temperature": 0.5}}


def test_iter_events_joins_data_lines_and_ignores_other_fields():
    lines = [b'data: {"a": 1}\n', b"\n", b": comment\n", b"event: x\n", b'data: {"b":\n', b"data: 2}\n", b"\n"]
    assert list(iter_events(lines)) == [{"a": 1}, {"b": 2}]
    assert list(iter_events([b'data: {"c": 3}'])) == [{"c": 3}]  # no trailing blank line


@pytest.mark.parametrize(
    ("batching", "keep", "shapes"),
    [
        (True, False, {"tok": (1,), "vec": (2, 2)}),
        (True, True, {"tok": (1, 1), "vec": (1, 2, 2)}),
        (False, True, {"tok": (1,), "vec": (2, 2)}),
    ],
)
def test_decode_event_shapes_outputs_by_config(batching, keep, shapes):
    event = {"model_name": "Gen", "tok": 7, "vec": [1.0, 2.0, 3.0, 4.0], "text": "ok"}
    outputs = decode_event(event, _config(batching), keep_batch_axis=keep)
    assert {name: outputs[name].shape for name in shapes} == shapes
    assert outputs["tok"].dtype == np.int32 and outputs["vec"].dtype == np.float32
    assert outputs["text"].reshape(-1)[0] == b"ok"


def test_decode_event_error_and_missing_outputs():
    with pytest.raises(PyTritonClientInferenceServerError, match="RuntimeError: boom"):
        decode_event({"error": "RuntimeError: boom"}, _config(True), keep_batch_axis=False)
    assert decode_event({"model_name": "Gen"}, _config(True), keep_batch_axis=False) == {}
