"""Output checks (pytriton/proxy/_outputs.py), driven directly: no server, no sockets."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pytriton.exceptions import PyTritonRuntimeError
from pytriton.model_config import Tensor
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy._binding import _resolve_tensors
from pytriton.proxy._outputs import OutputChecker


def _checker(outputs, *, batching=True, decoupled=False, strict=False, name="M"):
    config = TritonModelConfig(
        model_name=name,
        batching=batching,
        max_batch_size=8 if batching else 0,
        decoupled=decoupled,
        outputs=_resolve_tensors(outputs, "OUTPUT", name),
    )
    return OutputChecker(config, strict)


F32 = [Tensor(name="y", shape=(-1,), dtype=np.float32)]


def test_an_exact_array_passes_untouched():
    y = np.ones((2, 3), np.float32)
    [[(name, out)]] = _checker(F32).check([{"y": y}], 1)
    assert name == "y" and out is y


@pytest.mark.parametrize(
    "value, fragment",
    [
        (np.ones((1, 3), np.float64), "dtype float64, declared float32"),
        (np.ones((1, 3), np.int64), "dtype int64, declared float32"),
        (np.ones((1, 3), np.complex64), "dtype complex64"),
        (np.array([[1.0, 2.0]], dtype=object), "dtype object"),
        (np.array([["a", "b"]]), "dtype <U1"),
        (np.array([[b"a"]]), "dtype |S1"),
        ([[1.0, 2.0]], "is list, expected numpy.ndarray"),
        (np.ones((1, 3, 1), np.float32), "has shape (1, 3, 1), declared (-1,) after the batch axis"),
        (np.ones(3, np.float32), "has shape (3,)"),
        (np.float32(1.0), "has shape ()"),
    ],
)
def test_incompatible_outputs_are_explained(value, fragment):
    with pytest.raises(PyTritonRuntimeError) as info:
        _checker(F32, name="Scorer").check([{"y": value}], 1)
    message = str(info.value)
    assert "Model 'Scorer'" in message and "output 'y' of result 0" in message
    assert fragment in message


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint8, np.uint16, np.float16, np.bool_])
def test_lossless_conversions_are_applied(dtype):
    value = np.array([[0, 1, 1]], dtype=dtype)
    [[(_, out)]] = _checker(F32).check([{"y": value}], 1)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, value.astype(np.float32))


def test_int32_widens_to_a_declared_float64_and_int64():
    outputs = [Tensor(name="f", shape=(-1,), dtype=np.float64), Tensor(name="i", shape=(-1,), dtype=np.int64)]
    big = np.array([[np.iinfo(np.int32).max, -7]], dtype=np.int32)
    [[(_, f), (_, i)]] = _checker(outputs).check([{"f": big, "i": big}], 1)
    assert f.dtype == np.float64 and i.dtype == np.int64
    assert f.tolist() == [[2147483647.0, -7.0]] and i.tolist() == [[2147483647, -7]]


def test_uint64_into_int64_is_refused_as_lossy():
    outputs = [Tensor(name="i", shape=(-1,), dtype=np.int64)]
    with pytest.raises(PyTritonRuntimeError, match="dtype uint64, declared int64"):
        _checker(outputs).check([{"i": np.ones((1, 2), np.uint64)}], 1)


def test_byte_swapped_arrays_are_converted_even_when_strict():
    value = np.arange(4, dtype=">f4").reshape(1, 4)
    for strict in (False, True):
        [[(_, out)]] = _checker(F32, strict=strict).check([{"y": value}], 1)
        assert out.dtype == np.dtype("<f4") and out.tolist() == value.tolist()


def test_strict_applies_no_conversion():
    with pytest.raises(PyTritonRuntimeError, match="dtype int16, declared float32"):
        _checker(F32, strict=True).check([{"y": np.ones((1, 2), np.int16)}], 1)


def test_bytes_outputs_take_text_arrays_only():
    outputs = [Tensor(name="s", shape=(1,), dtype=bytes)]
    checker = _checker(outputs)
    for value in (np.array([[b"a"]], dtype=object), np.array([["x"]]), np.array([[b"xy"]])):
        [[(_, out)]] = checker.check([{"s": value}], 1)
        assert out is value
    with pytest.raises(PyTritonRuntimeError, match="dtype int32, declared bytes"):
        checker.check([{"s": np.ones((1, 1), np.int32)}], 1)


def test_fixed_dimensions_must_match():
    outputs = [Tensor(name="y", shape=(2, -1), dtype=np.float32), Tensor(name="z", shape=(3,), dtype=np.float32)]
    checker = _checker(outputs)
    ok = {"y": np.ones((1, 2, 5), np.float32), "z": np.ones((4, 3), np.float32)}
    assert len(checker.check([ok], 1)[0]) == 2
    with pytest.raises(PyTritonRuntimeError, match=r"output 'y' of result 0 has shape \(1, 3, 5\), declared \(2, -1\)"):
        checker.check([{**ok, "y": np.ones((1, 3, 5), np.float32)}], 1)
    with pytest.raises(PyTritonRuntimeError, match=r"output 'z' of result 0 has shape \(4, 2\), declared \(3,\)"):
        checker.check([{**ok, "z": np.ones((4, 2), np.float32)}], 1)


def test_non_batching_model_has_no_batch_axis():
    checker = _checker([Tensor(name="y", shape=(2, 3), dtype=np.float32)], batching=False)
    checker.check([{"y": np.ones((2, 3), np.float32)}], 1)
    with pytest.raises(PyTritonRuntimeError, match=r"has shape \(1, 2, 3\), declared \(2, 3\) \(-1"):
        checker.check([{"y": np.ones((1, 2, 3), np.float32)}], 1)


def test_missing_outputs_are_named():
    outputs = [Tensor(name="a", shape=(-1,), dtype=np.float32), Tensor(name="b", shape=(-1,), dtype=np.float32)]
    checker = _checker(outputs, name="Pair")
    a = np.ones((1, 2), np.float32)
    with pytest.raises(PyTritonRuntimeError, match=r"Model 'Pair': result 1 lacks output\(s\) \['b'\]"):
        checker.check([{"a": a, "b": a}, {"a": a}], 2)
    with pytest.raises(PyTritonRuntimeError, match=r"lacks output\(s\) \['a', 'b'\]"):
        checker.check([{}], 1)


def test_only_the_requested_outputs_are_required():
    outputs = [Tensor(name="a", shape=(-1,), dtype=np.float32), Tensor(name="b", shape=(-1,), dtype=np.float32)]
    checker = _checker(outputs)
    a = np.ones((1, 2), np.float32)
    assert checker.check([{"a": a}, {"a": a, "b": a}], 2, [["a"], None])[0] == [("a", a)]
    with pytest.raises(PyTritonRuntimeError, match=r"result 0 lacks output\(s\) \['b'\] \(the client asked for"):
        checker.check([{"a": a}], 1, [["b"]])


def test_streamed_chunks_may_carry_any_subset():
    outputs = [Tensor(name="a", shape=(-1,), dtype=np.float32), Tensor(name="b", shape=(-1,), dtype=np.int32)]
    checker = _checker(outputs, decoupled=True)
    assert checker.check([{}], 1) == [[]]
    assert checker.check([{"b": np.ones((1, 1), np.int32)}], 1)[0][0][0] == "b"
    with pytest.raises(PyTritonRuntimeError, match="dtype float64, declared float32"):
        checker.check([{"a": np.ones((1, 1), np.float64)}], 1)


def test_unknown_outputs_and_bad_containers_are_explained():
    checker = _checker(F32)
    with pytest.raises(PyTritonRuntimeError, match=r"has output 'z', which is not among the declared outputs \['y'\]"):
        checker.check([{"z": np.ones((1, 1), np.float32)}], 1)
    with pytest.raises(PyTritonRuntimeError, match="must return a list.*add @batch") as info:
        checker.check({"y": np.ones((1, 1), np.float32)}, 1)  # a dict: the shape of a @batch result
    assert "from pytriton.decorators import batch" in str(info.value)
    with pytest.raises(PyTritonRuntimeError, match="must return a list") as info:
        checker.check(np.ones((1, 1), np.float32), 1)
    assert "@batch" not in str(info.value)  # only a dict hints at the missing decorator
    with pytest.raises(PyTritonRuntimeError, match="2 results for 1 requests"):
        checker.check([{}, {}], 1)
    with pytest.raises(PyTritonRuntimeError, match="result 0 is tuple, expected a dict"):
        checker.check([()], 1)


# -- OutputChecker.responses: check() and the building of responses in one pass (backend kind) ----


TWO = [Tensor(name="y", shape=(-1,), dtype=np.float32), Tensor(name="z", shape=(2,), dtype=np.int64)]


def _build(checker, result, n_requests, requested):
    """``responses`` with plain Python stand-ins for Triton's Tensor and InferenceResponse."""
    return checker.responses(lambda name, array: (name, array), list, result, n_requests, requested)


def test_responses_are_built_in_one_pass_with_the_outputs_each_request_asked_for():
    y, z = np.ones((1, 3), np.float32), np.zeros((1, 2), np.int64)
    built = _build(_checker(TWO), [{"y": y, "z": z}, {"y": y, "z": z}], 2, [None, ["z"]])
    assert built is not None
    assert [[name for name, _ in response] for response in built] == [["y", "z"], ["z"]]
    assert built[0][0][1] is y  # an exact array goes as it is
    transposed = np.ones((3, 1), np.float32).T  # not C-ordered: Triton's Tensor copies it (tests/e2e/test_data_path.py)
    assert _build(_checker(F32), [{"y": transposed}], 1, itertools.repeat(None)) == [[("y", transposed)]]


@pytest.mark.parametrize(
    "result, n_requests",
    [
        ([{"y": np.ones((1, 3), np.float64), "z": np.zeros((1, 2), np.int64)}], 1),  # a conversion: check() converts it
        ([{"y": np.ones((1, 3), np.float32)}], 1),  # z missing: check() names it
        ([{"y": np.ones((1, 3), np.float32), "z": np.zeros((1, 3), np.int64)}], 1),  # z's fixed size differs
        ([{"y": np.ones((1, 3), np.float32), "z": [[1, 2]]}], 1),  # not an ndarray
        ([{"y": np.ones((1, 3), np.float32), "q": np.zeros((1, 2), np.int64)}], 1),  # an undeclared name
        ({"y": np.ones((1, 3), np.float32)}, 1),  # a @batch-shaped dict, not a list
        ((), 0),  # a tuple: check() accepts it, the one-pass way does not
        ([], 1),  # too few results
        (["text"], 1),
    ],
)
def test_anything_but_the_common_case_is_left_to_check(result, n_requests):
    assert _build(_checker(TWO), result, n_requests, [None] * n_requests) is None


def test_single_gives_the_fast_path_test_of_a_lone_numeric_output_only():
    fixed = [Tensor(name="y", shape=(2, -1), dtype=np.float32)]
    assert _checker(F32).single() == ("y", np.dtype(np.float32), 2, 1, (-1,), True)
    assert _checker(fixed, batching=False).single() == ("y", np.dtype(np.float32), 2, 0, (2, -1), False)
    assert _checker(TWO).single() is None  # several outputs: responses() builds them
    assert _checker([Tensor(name="y", shape=(-1,), dtype=np.bytes_)]).single() is None  # BYTES: check() serializes
