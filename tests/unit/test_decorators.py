"""Decorators without a server: a fake bind attaches the model config as Triton.bind does."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pytriton.decorators import (
    ConstantPadder,
    ModelConfigDict,
    TritonContext,
    batch,
    convert_output,
    current_requests,
    fill_optionals,
    first_value,
    get_inference_request_batch_size,
    get_model_config,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
    triton_context,
)
from pytriton.exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonValidationError
from pytriton.model_config.common import DynamicBatcher
from pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig
from pytriton.proxy.types import Request


def _config(inputs=(("x", (-1,), np.float32),), outputs=(("y", (-1,), np.float32),), **kwargs):
    return TritonModelConfig(
        model_name="m",
        inputs=[TensorSpec(n, s, d) for n, s, d in inputs],
        outputs=[TensorSpec(n, s, d) for n, s, d in outputs],
        **kwargs,
    )


def bind(func, config=None):
    """What Triton.bind does for decorators: remember the config and attach the context."""
    context = TritonContext()
    context.model_configs[func] = config or _config()
    owner = getattr(func, "__self__", None)
    (owner if owner is not None else func).__triton_context__ = context
    return func


def req(**inputs):
    return Request({k: np.asarray(v) for k, v in inputs.items()})


def test_batch_stacks_and_splits_per_request():
    calls = []

    @batch
    def infer(x):
        calls.append(x.copy())
        return {"y": x * 2}

    bind(infer)
    out = infer([req(x=[[1.0], [2.0]]), req(x=[[3.0]])])
    assert len(calls) == 1 and calls[0].tolist() == [[1.0], [2.0], [3.0]]
    assert [o["y"].tolist() for o in out] == [[[2.0], [4.0]], [[6.0]]]


@pytest.mark.parametrize("traced", [False, True], ids=["one-request-path", "general-path"])
def test_batch_of_one_request_passes_its_arrays_and_trims_extra_rows(monkeypatch, traced):
    """A batch of one request (sequential traffic) takes a shorter path unless something is traced: same answers."""
    from pytriton.proxy import _tracing

    monkeypatch.setattr(_tracing.State, "seen", traced)
    given = []

    @batch
    def infer(x):
        given.append(x)
        assert len(current_requests()) == 1
        return {"y": x, "z": np.concatenate([x, x])}  # z: one row too many, trimmed to the request's

    bind(infer, _config(outputs=(("y", (-1,), np.float32), ("z", (-1,), np.float32))))
    request = req(x=[[1.0, 2.0]])
    (out,) = infer([request])
    assert given[0] is request["x"]  # the request's own array, not a stacked copy
    assert np.shares_memory(out["y"], request["x"]) and out["y"].tolist() == [[1.0, 2.0]]
    assert out["z"].tolist() == [[1.0, 2.0]]
    with pytest.raises(PyTritonValidationError, match="rows along the batch axis"):
        batch(lambda x: {"y": x[:0]})([request])


def test_batch_accepts_list_outputs_in_config_order():
    @batch
    def infer(x):
        return [x + 1, x - 1]

    bind(infer, _config(outputs=(("plus", (-1,), np.float32), ("minus", (-1,), np.float32))))
    out = infer([req(x=[[1.0]])])
    assert out[0]["plus"].tolist() == [[2.0]] and out[0]["minus"].tolist() == [[0.0]]


def test_batch_errors_are_explained():
    @batch
    def short(x):
        return {"y": x[:1]}

    bind(short)
    with pytest.raises(PyTritonValidationError, match="rows along the batch axis"):
        short([req(x=[[1.0], [2.0]])])

    @batch
    def wrong_count(x):
        return [x, x]

    bind(wrong_count)
    with pytest.raises(PyTritonValidationError, match="returned 2 outputs"):
        wrong_count([req(x=[[1.0]])])

    @batch
    def anything(**inputs):
        return {"y": inputs["x"]}

    bind(anything)
    with pytest.raises(PyTritonValidationError, match="different sets of inputs"):
        anything([req(x=[[1.0]]), req(x=[[1.0]], z=[[2.0]])])


def test_batch_on_generator_splits_every_chunk():
    @batch
    def infer(x):
        for step in range(3):
            yield {"y": x + step}

    bind(infer)
    chunks = list(infer([req(x=[[0.0]]), req(x=[[10.0]])]))
    assert [[o["y"].tolist() for o in chunk] for chunk in chunks] == [
        [[[0.0]], [[10.0]]],
        [[[1.0]], [[11.0]]],
        [[[2.0]], [[12.0]]],
    ]


def test_batch_on_async_function_and_async_generator():
    @batch
    async def infer(x):
        await asyncio.sleep(0)
        return {"y": x * 3}

    bind(infer)
    out = asyncio.run(infer([req(x=[[1.0]])]))
    assert out[0]["y"].tolist() == [[3.0]]

    @batch
    async def stream(x):
        for step in range(2):
            yield {"y": x + step}

    bind(stream)

    async def collect():
        return [chunk async for chunk in stream([req(x=[[5.0]])])]

    assert [chunk[0]["y"].tolist() for chunk in asyncio.run(collect())] == [[[5.0]], [[6.0]]]


def test_batch_keeps_request_parameters_reachable():
    seen = []

    @batch
    def infer(x):
        seen.append([r.parameters for r in current_requests()])
        return {"y": x}

    bind(infer)
    infer([Request({"x": np.ones((1, 1))}, {"t": 0.5}), Request({"x": np.ones((1, 1))}, {"t": 0.7})])
    assert seen == [[{"t": 0.5}, {"t": 0.7}]]

    @batch
    async def infer_async(x):
        return {"y": x * len(current_requests())}

    bind(infer_async)
    assert asyncio.run(infer_async([req(x=[[1.0]]), req(x=[[1.0]])]))[0]["y"].tolist() == [[2.0]]
    with pytest.raises(PyTritonRuntimeError):
        current_requests()


def test_sample_passes_kwargs_and_wraps_result():
    @sample
    def infer(x):
        return {"y": x + 1}

    bind(infer, _config(batching=False, max_batch_size=0))
    assert infer([req(x=[1.0, 2.0])])[0]["y"].tolist() == [2.0, 3.0]
    with pytest.raises(PyTritonRuntimeError, match="exactly one request"):
        infer([req(x=[1.0]), req(x=[1.0])])


def test_group_by_keys_calls_per_key_set_and_keeps_order():
    seen = []

    @group_by_keys
    @batch
    def infer(**inputs):
        seen.append(sorted(inputs))
        return {"y": inputs["x"] * (10 if "z" in inputs else 1)}

    bind(infer)
    out = infer([req(x=[[1.0]]), req(x=[[2.0]], z=[[0.0]]), req(x=[[3.0]])])
    assert sorted(seen) == [["x"], ["x", "z"]]
    assert [o["y"].tolist() for o in out] == [[[1.0]], [[20.0]], [[3.0]]]


def test_group_by_values_documented_example():
    calls = []

    @batch
    @group_by_values("param1", "param2")
    def infer(sentences, param1, param2):
        calls.append(sentences.tolist())
        return {"out": np.array([[len(s)] for s in sentences.reshape(-1)], dtype=np.int64) + param1}

    bind(
        infer,
        _config(
            inputs=(("sentences", (1,), bytes), ("param1", (1,), np.int64), ("param2", (1,), np.int64)),
            outputs=(("out", (1,), np.int64),),
        ),
    )
    request = Request(
        {
            "sentences": np.array([[b"Sentence1"], [b"Sentence2"], [b"Sentence3"]], dtype=object),
            "param1": np.array([[1], [1], [2]]),
            "param2": np.array([[1], [1], [1]]),
        }
    )
    out = infer([request])
    assert calls == [[[b"Sentence1"], [b"Sentence2"]], [[b"Sentence3"]]]
    assert out[0]["out"].tolist() == [[10], [10], [11]]


def test_group_by_values_pads_different_shapes_with_constant_padder():
    @batch
    @group_by_values("n", pad_fn=ConstantPadder(0))
    def infer(n):
        width = int(n[0, 0])
        return {"y": np.ones((len(n), width), dtype=np.int32)}

    bind(infer, _config(inputs=(("n", (1,), np.int32),), outputs=(("y", (-1,), np.int32),)))
    out = infer([req(n=[[1], [3], [1]])])
    assert out[0]["y"].tolist() == [[1, 0, 0], [1, 1, 1], [1, 0, 0]]

    @batch
    @group_by_values("n")
    def unpadded(n):
        return {"y": np.ones((len(n), int(n[0, 0])), dtype=np.int32)}

    bind(unpadded, _config(inputs=(("n", (1,), np.int32),), outputs=(("y", (-1,), np.int32),)))
    with pytest.raises(PyTritonRuntimeError, match="pad_fn"):
        unpadded([req(n=[[1], [3]])])


def test_group_by_values_outside_batch_is_rejected():
    @group_by_values("x")
    @batch
    def infer(x):
        return {"y": x}

    bind(infer)
    with pytest.raises(PyTritonRuntimeError, match="below @batch"):
        infer([req(x=[[1.0]])])


def test_constant_padder_bytes_and_dtype_mismatch():
    padded = ConstantPadder(0)([{"s": np.array([[b"a"]], dtype="S1")}, {"s": np.array([[b"abc", b"d"]], dtype="S3")}])
    assert padded[0]["s"].tolist() == [[b"a", b""]] and padded[0]["s"].dtype == np.dtype("S3")
    with pytest.raises(PyTritonRuntimeError, match="dtype kinds"):
        ConstantPadder()([{"v": np.zeros((1, 1), np.int32)}, {"v": np.zeros((1, 1), np.float32)}])


def test_fill_optionals_fills_and_validates():
    @fill_optionals(b=np.array([7.0], dtype=np.float32))
    @group_by_keys
    @batch
    def infer(a, b):
        return {"y": a + b}

    bind(infer, _config(inputs=(("a", (1,), np.float32), ("b", (1,), np.float32))))
    out = infer(
        [req(a=np.ones((2, 1), np.float32)), req(a=np.ones((1, 1), np.float32), b=np.zeros((1, 1), np.float32))]
    )
    assert out[0]["y"].tolist() == [[8.0], [8.0]] and out[1]["y"].tolist() == [[1.0]]

    with pytest.raises(PyTritonBadParameterError, match="b"):
        fill_optionals(b=[1.0])
    for bad, fragment in [
        ({"b": np.array([1], dtype=np.int32)}, "dtype int32"),
        ({"b": np.array([1.0, 2.0], dtype=np.float32)}, "shape"),
        ({"zzz": np.array([1.0], dtype=np.float32)}, "'zzz'"),
    ]:

        @fill_optionals(**bad)
        def wrong(requests):
            return [{"y": r["a"]} for r in requests]

        bind(wrong, _config(inputs=(("a", (1,), np.float32), ("b", (1,), np.float32))))
        with pytest.raises(PyTritonBadParameterError, match=fragment):
            wrong([req(a=np.ones((1, 1), np.float32))])


def test_first_value_with_batch_and_on_requests():
    seen = {}

    @batch
    @first_value("temperature")
    def infer(x, temperature):
        seen["t"] = temperature
        return {"y": x * temperature}

    bind(infer, _config(inputs=(("x", (1,), np.float32), ("temperature", (1,), np.float32))))
    out = infer([req(x=[[1.0], [2.0]], temperature=np.array([[0.5], [0.5]], np.float32))])
    assert np.isscalar(seen["t"]) and seen["t"] == np.float32(0.5)
    assert out[0]["y"].tolist() == [[0.5], [1.0]]
    with pytest.raises(PyTritonRuntimeError, match="differ"):
        infer([req(x=[[1.0], [2.0]], temperature=np.array([[0.5], [0.6]], np.float32))])

    @first_value("t", squeeze_single_values=False, strict=False)
    def on_requests(requests):
        return [{"y": np.atleast_2d(r["t"])} for r in requests]

    bind(on_requests)
    assert on_requests([req(t=[[1.0], [2.0]])])[0]["y"].tolist() == [[1.0]]


def test_first_value_errors():
    with pytest.raises(PyTritonBadParameterError, match="reserved"):
        first_value("triton_context")

    @first_value("x")
    def infer(requests):
        return requests

    bind(infer, _config(batching=False, max_batch_size=0))
    with pytest.raises(PyTritonRuntimeError, match="batching"):
        infer([req(x=[1.0])])


def test_pad_batch_pads_to_preferred_size_and_batch_trims():
    seen = []

    @batch
    @pad_batch
    def infer(x):
        seen.append(len(x))
        return {"y": x}

    bind(infer, _config(max_batch_size=16, batcher=DynamicBatcher(preferred_batch_size=[4, 8])))
    out = infer([req(x=[[1.0], [2.0], [3.0]])])
    assert seen == [4]
    assert out[0]["y"].tolist() == [[1.0], [2.0], [3.0]]
    infer([req(x=np.ones((9, 1)))])
    assert seen[-1] == 16


def test_triton_context_gives_the_model_config():
    @triton_context
    def infer(requests, triton_context):
        return [{"y": np.array([[len(triton_context.model_configs[infer].outputs)]])} for _ in requests]

    bind(infer)
    assert infer([req(x=[[1.0]])])[0]["y"].tolist() == [[1]]


def test_methods_and_callable_objects_keep_their_config():
    class Model:
        def __init__(self):
            self.factor = 2.0

        @batch
        def infer(self, x):
            return [x * self.factor]

    model = Model()
    bind(model.infer)
    assert model.infer([req(x=[[1.0]])])[0]["y"].tolist() == [[2.0]]
    assert get_model_config(model.infer, None).model_name == "m"


def test_helpers():
    assert get_inference_request_batch_size(req(x=np.zeros((3, 2)))) == 3
    assert convert_output({"a": 1}) == {"a": 1}
    assert convert_output((1,), model_config=_config()) == {"y": 1}
    with pytest.raises(PyTritonValidationError):
        convert_output(5, model_config=_config())
    configs = ModelConfigDict()

    def f(requests):
        return requests

    configs[f] = _config()
    assert configs[batch(f)].model_name == "m" and len(configs) == 1 and list(configs) == [f]
    del configs[f]
    assert len(configs) == 0


def test_decorators_keep_identity():
    @batch
    def documented(x):
        """Docstring."""
        return {"y": x}

    assert documented.__name__ == "documented" and documented.__doc__ == "Docstring."


def test_unbound_callable_gets_a_clear_error():
    @batch
    @triton_context
    def infer(x, triton_context):
        return {"y": x}

    with pytest.raises(PyTritonValidationError, match="Triton.bind"):
        infer([req(x=[[1.0]])])
