"""NVIDIA PyTriton 0.7 names and behaviours that code written for it relies on (issue 15, item 6)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest

from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonInvalidOperationError,
    PyTritonModelAlreadyBoundError,
    PyTritonValidationError,
)
from pytriton.model_config import ModelConfig, Tensor
from pytriton.model_config.common import ModelWarmup, WarmupInput
from pytriton.model_config.generator import to_dict, to_pbtxt
from pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig
from pytriton.model_config.warmup import resolve_warmup
from pytriton.proxy.types import Request


def test_submodules_are_attributes_of_the_package():
    code = (
        "import sys, pytriton; assert 'pytriton.triton' not in sys.modules; "
        "print(pytriton.triton.Triton.__name__, pytriton.model_config.Tensor.__name__, "
        "pytriton.decorators.batch.__name__, pytriton.client.ModelClient.__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["Triton", "Tensor", "batch", "ModelClient"]
    import pytriton

    with pytest.raises(AttributeError):
        pytriton.no_such_module  # noqa: B018


def test_constants_and_workspace_module_paths():
    from pytriton import constants
    from pytriton.server.workspace import Workspace as ServerWorkspace
    from pytriton.utils.workspace import Workspace

    assert (constants.DEFAULT_HTTP_PORT, constants.DEFAULT_GRPC_PORT, constants.DEFAULT_METRICS_PORT) == (
        8000,
        8001,
        8002,
    )
    assert constants.TRITON_LOCAL_IP == "127.0.0.1"
    assert constants.TRITON_CONTEXT_FIELD_NAME == "triton_context"
    assert constants.DEFAULT_TRITON_STARTUP_TIMEOUT_S == 120
    assert isinstance(constants.PYTRITON_HOME, pathlib.Path) and constants.PYTRITON_HOME.is_absolute()
    assert Workspace is ServerWorkspace


def test_workspace_contract(tmp_path):
    from pytriton.utils.workspace import Workspace

    workspace = Workspace(tmp_path / "ws")
    assert workspace.exists() and workspace.path == (tmp_path / "ws").resolve()
    workspace.clean()
    assert not workspace.exists()  # created by pytriton, so removed


def test_duplicate_bind_exception_is_the_references_and_the_old_one():
    assert issubclass(PyTritonModelAlreadyBoundError, PyTritonInvalidOperationError)
    assert issubclass(PyTritonModelAlreadyBoundError, PyTritonValidationError)


def test_request_positional_order_and_span():
    data = {"x": np.ones(2)}
    request = Request(data, {"p": 1}, None, ["y"])
    assert (request.parameters, request.span, request.requested_output_names) == ({"p": 1}, None, ["y"])
    assert Request(data, None, span="a-span").span == "a-span"
    # pytriton's earlier 3-argument order still works: a span is never a list.
    old = Request(data, None, ["y"])
    assert old.span is None and old.requested_output_names == ["y"]
    with request.traced_span("step") as span:
        assert span is None
    assert Request(data).span is None


@pytest.mark.parametrize("timeout_s", [None, 30.0])
def test_the_proxy_builds_the_request_init_builds(timeout_s):
    """``types._wire_request`` sets every slot as ``__init__`` does (a slot added to Request must be set there too)."""
    from pytriton.proxy.types import _wire_request

    data = {"x": np.ones(2)}

    def probe(index):  # the batch's cancellation probe: nothing is cancelled
        return False

    fast = _wire_request(data, {"p": 1}, ["y"], timeout_s, probe, 3)
    slow = Request(data, {"p": 1}, None, ["y"], timeout_s=timeout_s)
    slow._probe, slow._index = probe, 3
    for slot in Request.__slots__:
        if slot == "_deadline":
            assert (getattr(fast, slot) is None) == (getattr(slow, slot) is None), slot
            if timeout_s:
                assert abs(fast._deadline - slow._deadline) < 5.0
        else:
            assert getattr(fast, slot) == getattr(slow, slot), slot
    assert not fast.is_cancelled() and fast["x"] is data["x"]


@pytest.mark.parametrize("sequence", [None, (7, True, False), ("s-1", False, True)])
def test_every_path_builds_requests_in_one_place(sequence):
    """Issue 43 item 5: the worker, backend instances and ``__init__`` share one builder (``types._fill``)."""
    from pytriton.proxy import _backend_kind, _worker, types

    assert not hasattr(_worker, "wire_request")  # the second builder the worker had is gone
    data = {"x": np.ones(2)}
    built = _backend_kind.InlineRunner.request(data, None, ["y"], sequence, 2.0)
    fields = {} if sequence is None else dict(zip(("sequence_id", "sequence_start", "sequence_end"), sequence))
    expected = Request(data, None, None, ["y"], timeout_s=2.0, **fields)
    for slot in Request.__slots__:
        if slot != "_deadline":
            assert getattr(built, slot) == getattr(expected, slot), slot
    wire = types._wire_request(data, None, ["y"], None, None, 0, sequence)
    assert (wire.sequence_id, wire.sequence_start, wire.sequence_end) == (
        (None, False, False) if sequence is None else sequence
    )


def test_tensor_dtype_object_and_bytes_are_kept_as_given():
    assert Tensor(shape=(1,), dtype=object).dtype is object
    assert Tensor(shape=(1,), dtype=bytes).dtype is bytes
    assert Tensor(shape=(1,), dtype=np.bytes_).dtype is np.bytes_
    assert Tensor(shape=(1,), dtype=np.dtype("O")).dtype is np.object_
    assert Tensor(shape=(1,), dtype=np.dtype("float32")).dtype is np.float32


def test_tensor_accepts_zero_sizes_bind_refuses_them():
    assert Tensor(shape=(0, 2), dtype=np.float32).shape == (0, 2)
    with pytest.raises(PyTritonBadParameterError):
        Tensor(shape=(-2,), dtype=np.float32)


def test_model_config_fields_match_the_reference():
    config = ModelConfig(True, 8, ModelConfig().batcher, True, False, None)
    assert (config.response_cache, config.model_warmup) == (True, None)


def _warmup_inputs():
    return [TensorSpec("x", (-1,), np.float32), TensorSpec("s", (1,), np.bytes_), TensorSpec("o", (1,), np.int32, True)]


def test_warmup_generates_the_triton_section(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(3, dtype=np.float64))
    np.save(tmp_path / "s.npy", np.array([b"hello"]))
    warmups = [
        ModelWarmup(
            name="zeros",
            batch_size=2,
            inputs={
                "x": WarmupInput(np.float32, (3,), zero_data=True),
                "s": WarmupInput(bytes, (1,), random_data=True),
            },
            count=3,
        ),
        ModelWarmup(
            "file",
            1,
            {
                "x": WarmupInput(np.float32, (3,), input_data_file=str(tmp_path / "x.npy")),
                "s": WarmupInput(object, [1], input_data_file=tmp_path / "s.npy"),
            },
        ),
    ]
    resolved = resolve_warmup(warmups, _warmup_inputs(), 4, "M")
    assert resolved is not None
    first, second = resolved.entries
    assert first == {
        "name": "zeros",
        "batch_size": 2,
        "count": 3,
        "inputs": {
            "x": {"data_type": "TYPE_FP32", "dims": [3], "zero_data": True},
            "s": {"data_type": "TYPE_STRING", "dims": [1], "random_data": True},
        },
    }
    assert second["count"] == 1
    x_file, s_file = second["inputs"]["x"]["input_data_file"], second["inputs"]["s"]["input_data_file"]
    assert np.frombuffer(resolved.files[x_file], "<f4").tolist() == [0.0, 1.0, 2.0]
    assert resolved.files[s_file] == b"\x05\x00\x00\x00hello"  # Triton's serialized BYTES layout
    config = TritonModelConfig("M", inputs=_warmup_inputs(), model_warmup=resolved.entries)
    assert to_dict(config)["model_warmup"] == resolved.entries
    text = to_pbtxt(config)
    assert 'inputs {\n    key: "x"\n    value {\n      data_type: TYPE_FP32' in text
    assert resolve_warmup(None, _warmup_inputs(), 4, "M") is None


@pytest.mark.parametrize(
    "warmup, problem",
    [
        (ModelWarmup("w", 1, {"x": WarmupInput(np.float32, (3,))}), "exactly one"),
        (ModelWarmup("w", 1, {"x": WarmupInput(np.float32, (3,), zero_data=True, random_data=True)}), "exactly one"),
        (ModelWarmup("w", 1, {}), "inputs is empty"),
        (ModelWarmup("w", 1, {"nope": WarmupInput(np.float32, (3,), zero_data=True)}), "not inputs"),
        (ModelWarmup("w", 9, {"x": WarmupInput(np.float32, (3,), zero_data=True)}), "max_batch_size"),
        (ModelWarmup("w", 1, {"x": WarmupInput(np.float32, (3,), zero_data=True)}, count=0), "count"),
        (ModelWarmup("w", 1, {"x": WarmupInput(np.int8, (3,), zero_data=True)}), "dtype"),
        (ModelWarmup("w", 1, {"x": WarmupInput(np.float32, (-1,), zero_data=True)}), "shape"),
        (ModelWarmup("w", 1, {"x": WarmupInput(np.float32, (3,), input_data_file="/no/such.npy")}), "exist"),
    ],
)
def test_bad_warmups_are_refused_at_bind(warmup, problem):
    inputs = _warmup_inputs()[:1]
    with pytest.raises(PyTritonBadParameterError, match=problem):
        resolve_warmup([warmup], inputs, 4, "M")


def test_warmup_for_some_inputs_becomes_batches_pytriton_sends(tmp_path):
    # NVIDIA PyTriton 0.7 accepts data for only some inputs; Triton refuses such a request, so every
    # warmup of the model becomes a ready batch, in order and count times, and Triton gets none.
    warmups = [
        ModelWarmup("zeros", 2, {"x": WarmupInput(np.float32, (3,), zero_data=True)}, count=2),
        ModelWarmup("strings", 1, {"s": WarmupInput(bytes, (1,), random_data=True)}),
        ModelWarmup(
            "all",
            3,
            {"x": WarmupInput(np.float32, (2,), random_data=True), "s": WarmupInput(bytes, (1,), zero_data=True)},
        ),
    ]
    resolved = resolve_warmup(warmups, _warmup_inputs(), 4, "M")
    assert resolved is not None and resolved.entries == [] and resolved.files == {}
    assert [(name, sorted(batch)) for name, batch in resolved.direct] == [
        ("zeros", ["x"]),
        ("zeros", ["x"]),
        ("strings", ["s"]),
        ("all", ["s", "x"]),
    ]
    zeros = resolved.direct[0][1]["x"]
    assert zeros.shape == (2, 3) and zeros.dtype == np.float32 and not zeros.any()
    strings = resolved.direct[2][1]["s"]
    assert strings.shape == (1, 1) and isinstance(strings[0, 0], bytes) and len(strings[0, 0]) >= 8
    last = resolved.direct[3][1]
    assert last["x"].shape == (3, 2) and last["s"].tolist() == [[b""]] * 3


def test_warmup_file_with_a_whole_batch_is_sent_as_that_batch(tmp_path):
    positions = np.arange(15, dtype=np.int64).reshape(3, 5)
    np.save(tmp_path / "batch.npy", positions)
    np.save(tmp_path / "one.npy", np.arange(5, dtype=np.int64))
    inputs = [TensorSpec("p", (-1,), np.int64)]
    whole = ModelWarmup("batch", 3, {"p": WarmupInput(np.int64, (5,), input_data_file=tmp_path / "batch.npy")})
    resolved = resolve_warmup([whole], inputs, 4, "M")
    assert resolved is not None and resolved.entries == []
    np.testing.assert_array_equal(resolved.direct[0][1]["p"], positions)
    # One sample and every input: Triton's own warmup, as before.
    one = ModelWarmup("one", 3, {"p": WarmupInput(np.int64, (5,), input_data_file=tmp_path / "one.npy")})
    native = resolve_warmup([one], inputs, 4, "M")
    assert native is not None and native.direct == [] and native.entries[0]["batch_size"] == 3
    # Mixed with a whole batch: the one-sample file is repeated over its batch.
    mixed = resolve_warmup([whole, one], inputs, 4, "M")
    assert mixed is not None and mixed.entries == []
    np.testing.assert_array_equal(mixed.direct[1][1]["p"], np.tile(np.arange(5), (3, 1)))
    with pytest.raises(PyTritonBadParameterError, match="a batch of 2 needs 10"):
        resolve_warmup([ModelWarmup("w", 2, whole.inputs)], inputs, 4, "M")


def test_direct_warmup_of_a_model_without_batching_has_no_batch_axis(tmp_path):
    (tmp_path / "raw.bin").write_bytes(np.zeros(3, "<f4").tobytes())
    inputs = [TensorSpec("x", (3,), np.float32), TensorSpec("y", (3,), np.float32)]
    resolved = resolve_warmup(
        [ModelWarmup("w", 1, {"x": WarmupInput(np.float32, (3,), zero_data=True)})], inputs, 0, "M"
    )
    assert resolved is not None and resolved.direct[0][1]["x"].shape == (3,)
    raw = ModelWarmup("w", 1, {"x": WarmupInput(np.float32, (3,), input_data_file=tmp_path / "raw.bin")})
    with pytest.raises(PyTritonBadParameterError, match=r"\.npy files"):
        resolve_warmup([raw], inputs, 0, "M")


def test_version_policy_only_for_several_versions():
    assert "version_policy" not in to_dict(TritonModelConfig("M"))
    assert to_dict(TritonModelConfig("M", versions=[1, 3]))["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert "version_policy {\n  specific {\n    versions: [1, 3]" in to_pbtxt(TritonModelConfig("M", versions=[1, 3]))


def test_lifecycle_policy_defaults_and_validation():
    from pytriton.triton import TritonLifecyclePolicy

    policy = TritonLifecyclePolicy()
    assert (policy.launch_triton_on_startup, policy.local_model_store) == (True, False)
    with pytest.raises(PyTritonBadParameterError):
        TritonLifecyclePolicy(launch_triton_on_startup="yes")  # type: ignore[arg-type]
