"""The legacy client layer's argument mapping, result shaping, messages and errors, and ``InferContext``
over a fake transport, without a server."""

from __future__ import annotations

import os
import struct
import threading

import numpy as np
import pytest

import tensorrtserver.shared_memory as tshm
from pytriton.client.legacy import (
    DataType,
    InferContext,
    InferenceServerException,
    InferRequestHeader,
    ModelConfig,
    ModelReadyState,
    ProtocolType,
    ResultFormat,
    serialize_string_tensor,
)
from pytriton.client.legacy._errors import translated
from pytriton.client.legacy._messages import version_status
from pytriton.client.legacy._requests import ModelSpec, parse_class_entry, plan_request, shape_results
from pytriton.client.legacy._transport import _HttpWorkers, normalize_url, parse_headers
from pytriton.client.legacy.shared_memory import SharedMemoryHandle
from tests.conftest import shm_entries

# A model configuration as gRPC-as-JSON delivers it: int64 as strings, zero fields left out.
GRPC_CONFIG = {
    "name": "simple",
    "max_batch_size": 8,
    "input": [
        {"name": "A", "data_type": "TYPE_INT32", "dims": ["4"]},
        {"name": "S", "data_type": "TYPE_STRING", "dims": ["-1"]},
        {"name": "OPT", "data_type": "TYPE_FP32", "dims": ["1"], "optional": True},
    ],
    "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": ["3"], "label_filename": "labels.txt"}],
    "sequence_batching": {"max_sequence_idle_microseconds": "1000"},
}
NOBATCH = {
    "name": "nb",
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [3]}],
    "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [3]}],
}


def _strings(n):
    return np.array([f"s{i}" for i in range(n)], dtype=object)


def test_exception_api():
    error = InferenceServerException("boom", server_id="h:1", request_id=7)
    assert (error.message(), error.server_id(), error.request_id(), str(error)) == ("boom", "h:1", 7, "boom")
    bare = InferenceServerException()
    assert (bare.message(), bare.server_id(), bare.request_id()) == (None, None, 0)


def test_translated_wraps_everything_but_itself():
    with pytest.raises(InferenceServerException) as info, translated("h:1", 3, "load of model 'm'"):
        raise ConnectionRefusedError(111, "Connection refused")
    assert type(info.value) is InferenceServerException
    assert info.value.message().startswith("load of model 'm': cannot reach the server")
    assert (info.value.server_id(), info.value.request_id()) == ("h:1", 3)
    assert isinstance(info.value.__cause__, ConnectionRefusedError)
    from tritonclient.utils import InferenceServerException as TritonError

    with pytest.raises(InferenceServerException, match="^unknown model$"), translated("h:1"):
        raise TritonError("unknown model")
    original = InferenceServerException("mine")
    with pytest.raises(InferenceServerException) as info, translated("h:1"):
        raise original
    assert info.value is original


def test_protocol_headers_url():
    assert ProtocolType.from_str("gRPC") is ProtocolType.GRPC and ProtocolType.from_str("http") is ProtocolType.HTTP
    with pytest.raises(InferenceServerException, match="'udp'"):
        ProtocolType.from_str("udp")
    assert parse_headers(["A:1", " B : x:y "]) == {"A": "1", "B": "x:y"}
    assert parse_headers([]) == {} and parse_headers(None) == {}
    for bad in (["novalue"], [":v"], "A:1"):
        with pytest.raises(InferenceServerException):
            parse_headers(bad)
    assert normalize_url("http://localhost:8000/") == "localhost:8000"
    with pytest.raises(InferenceServerException, match="host:port"):
        normalize_url("")


def test_serialize_string_tensor():
    out = serialize_string_tensor(np.array([["ab", b"c"], ["", "ü"]], dtype=object))
    assert out.dtype == np.uint8 and out.ndim == 1
    expected = b"".join(struct.pack("<I", len(s)) + s for s in [b"ab", b"c", b"", "ü".encode()])
    assert out.tobytes() == expected
    assert serialize_string_tensor(np.array([b"xy"], dtype=np.bytes_)).tobytes() == b"\x02\x00\x00\x00xy"
    with pytest.raises(InferenceServerException, match="float32"):
        serialize_string_tensor(np.zeros(2, np.float32))


def test_model_spec_from_grpc_json():
    spec = ModelSpec.from_config(GRPC_CONFIG)
    assert spec.max_batch_size == 8 and spec.sequence
    assert spec.inputs["A"].datatype == "INT32" and spec.inputs["A"].dims == (4,)
    assert spec.inputs["S"].datatype == "BYTES" and spec.inputs["OPT"].optional
    nb = ModelSpec.from_config(NOBATCH)
    assert nb.max_batch_size == 0 and not nb.sequence


def test_plan_stacks_samples_and_maps_flags():
    spec = ModelSpec.from_config(GRPC_CONFIG)
    a = [np.arange(4, dtype=np.int16).reshape(2, 2), np.arange(4, 8, dtype=np.int32)]  # safe cast, flat reshape
    start_end = InferRequestHeader.FLAG_SEQUENCE_START | InferRequestHeader.FLAG_SEQUENCE_END
    plan = plan_request(
        spec, {"A": a, "S": [_strings(3), _strings(3)]}, {"Y": (ResultFormat.CLASS, 2)}, 2, start_end, 9
    )
    inputs = {entry.name: entry for entry in plan.inputs}
    assert inputs["A"].shape == [2, 4] and inputs["A"].data.dtype == np.int32
    np.testing.assert_array_equal(inputs["A"].data, np.arange(8).reshape(2, 4))
    assert inputs["S"].datatype == "BYTES" and inputs["S"].shape == [2, 3] and inputs["S"].data.dtype == object
    assert (plan.sequence_id, plan.sequence_start, plan.sequence_end) == (9, True, True)
    assert plan.outputs[0].fmt is ResultFormat.CLASS and plan.outputs[0].class_count == 2


@pytest.mark.parametrize(
    "inputs, outputs, batch_size, flags, corr, message",
    [
        ({"A": [np.zeros(4, np.int32)]}, {}, 1, 0, 1, "missing ['S']"),
        ({"A": [np.zeros(4, np.float64)], "S": [_strings(1)]}, {}, 1, 0, 1, "expected INT32"),
        ({"A": [np.zeros(5, np.int32)], "S": [_strings(1)]}, {}, 1, 0, 1, "expected 4 elements"),
        ({"A": [np.zeros(4, np.int32)], "S": [np.zeros(1)]}, {}, 1, 0, 1, "expected strings"),
        ({"A": [np.zeros(4, np.int32)] * 2, "S": [_strings(1), _strings(2)]}, {}, 2, 0, 1, "same shape"),
        ({"A": [np.zeros(4, np.int32)], "S": [_strings(1)]}, {"Y": ResultFormat.CLASS}, 1, 0, 1, "format must be"),
        (
            {"A": [np.zeros(4, np.int32)], "S": [_strings(1)]},
            {"Y": (ResultFormat.RAW, 5)},
            1,
            0,
            1,
            "shared memory handle",
        ),
        ({"A": [np.zeros(4, np.int32)], "S": [_strings(1)]}, {}, 0, 0, 1, "positive integer"),
        ({"A": [np.zeros(4, np.int32)], "S": [_strings(1)]}, {}, 1, 4, 1, "unknown flag bits"),
        ({"A": [np.zeros(4, np.int32)], "S": [_strings(1)]}, {}, 1, 0, 0, "sequence model"),
        ([], {}, 1, 0, 1, "inputs must be a dict"),
    ],
)
def test_plan_errors(inputs, outputs, batch_size, flags, corr, message):
    with pytest.raises(InferenceServerException) as info:
        plan_request(ModelSpec.from_config(GRPC_CONFIG), inputs, outputs, batch_size, flags, corr)
    assert message in info.value.message()


def test_plan_shared_memory_inputs():
    spec = ModelSpec.from_config(NOBATCH)
    handle = SharedMemoryHandle("r", "/k", 12, region=None)
    plan = plan_request(spec, {"X": handle}, {"Y": (ResultFormat.RAW, handle)}, 1, 0, 0)
    assert plan.inputs[0].shape == [3] and plan.inputs[0].shm_byte_size == 12 and plan.outputs[0].shm is handle
    batched = ModelSpec.from_config(dict(NOBATCH, max_batch_size=4))
    with pytest.raises(InferenceServerException, match="needs 24 bytes"):
        plan_request(batched, {"X": handle}, {}, 2, 0, 0)
    variable = ModelSpec.from_config(dict(NOBATCH, input=[{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}]))
    with pytest.raises(InferenceServerException, match="variable shape"):
        plan_request(variable, {"X": handle}, {}, 1, 0, 0)


class FakeResult:
    def __init__(self, arrays):
        self.arrays = arrays

    def as_numpy(self, name):
        return self.arrays.get(name)


def test_shape_results_raw_and_class():
    spec = ModelSpec.from_config(dict(NOBATCH, max_batch_size=4))
    samples = [np.zeros(3, np.float32), np.ones(3, np.float32)]
    plan = plan_request(spec, {"X": samples}, {"Y": (ResultFormat.CLASS, 2)}, 2, 0, 0)
    classes = np.array([[b"0.9:2:bird", b"0.5:0:a:b"], [b"3:1", b"1:0"]], dtype=object)
    shaped = shape_results(plan, FakeResult({"Y": classes}), grpc=False)
    assert shaped["Y"] == [[(2, 0.9, "bird"), (0, 0.5, "a:b")], [(1, 3.0, ""), (0, 1.0, "")]]
    plan = plan_request(spec, {"X": samples}, {"Y": ResultFormat.RAW}, 2, 0, 0)
    raw = shape_results(plan, FakeResult({"Y": np.stack(samples) * 2}), grpc=False)["Y"]
    assert len(raw) == 2 and raw[1].shape == (3,)
    with pytest.raises(InferenceServerException, match="3 batch entries"):
        shape_results(plan, FakeResult({"Y": np.zeros((3, 3), np.float32)}), grpc=False)
    with pytest.raises(InferenceServerException, match="no output 'Y'"):
        shape_results(plan, FakeResult({}), grpc=False)
    nb_plan = plan_request(ModelSpec.from_config(NOBATCH), {"X": [samples[0]]}, {"Y": ResultFormat.RAW}, 1, 0, 0)
    assert shape_results(nb_plan, FakeResult({"Y": samples[1]}), grpc=True)["Y"][0] is samples[1]
    with pytest.raises(InferenceServerException, match="unexpected classification"):
        parse_class_entry(b"nonsense")


def test_status_messages_from_grpc_json():
    config = ModelConfig.from_v2(GRPC_CONFIG)
    assert config.max_batch_size == 8 and config.input[0].data_type == DataType.TYPE_INT32
    assert config.input[1].data_type == DataType.TYPE_STRING and config.input[0].dims == [4]
    assert config.output[0].label_filename == "labels.txt"
    assert config.sequence_batching.max_sequence_idle_microseconds == "1000" and config.dynamic_batching is None
    stats = {
        "inference_count": "12",
        "execution_count": "3",
        "last_inference": "1700000000000",
        "batch_stats": [
            {
                "batch_size": "4",
                "compute_input": {"count": "3", "ns": "10"},
                "compute_infer": {"count": "3", "ns": "90"},
            }
        ],
    }
    status = version_status(ModelReadyState.MODEL_READY, stats)
    assert (status.model_inference_count, status.model_execution_count) == (12, 3)
    assert status.infer_stats[4].success.count == 3 and status.infer_stats[4].compute.total_time_ns == 100
    assert status.infer_stats[4].queue.count == 0
    assert version_status(ModelReadyState.MODEL_UNAVAILABLE, None).infer_stats == {}


def test_result_format_is_reachable_as_the_legacy_code_spells_it():
    assert InferContext.ResultFormat.RAW is ResultFormat.RAW
    assert InferRequestHeader.Flag.FLAG_SEQUENCE_END == InferRequestHeader.FLAG_SEQUENCE_END == 2


class FakeClient:
    closed: list = []

    def __init__(self):
        self.thread = threading.get_ident()

    def close(self):
        FakeClient.closed.append(self.thread)


def test_http_workers_own_their_clients():
    FakeClient.closed = []
    workers = _HttpWorkers(FakeClient, max_workers=2)
    results = []
    finished = threading.Event()
    barrier = threading.Barrier(2, timeout=10)

    def done(result, error):
        results.append((result, error))
        if len(results) == 3:
            finished.set()

    def nested(client):
        barrier.wait()
        # A nested submit from a worker runs inline on that worker's client (no deadlock).
        inner = []
        workers.submit(lambda c: c is client, lambda r, e: inner.append(r))
        return inner[0]

    workers.submit(nested, done)
    workers.submit(nested, done)
    workers.submit(lambda client: client.thread == threading.get_ident(), done)
    assert finished.wait(10)
    assert results == [(True, None)] * 3
    workers.close()
    assert len(FakeClient.closed) == 2  # each worker closed its own client
    with pytest.raises(InferenceServerException, match="closed"):
        workers.submit(lambda client: None, done)


def test_shared_memory_helpers():
    tag = f"legacyunit{os.getpid()}"
    handle = tshm.create_shared_memory_region("r", f"/{tag}", 32)
    try:
        tshm.set_shared_memory_region(handle, [np.arange(4, dtype=np.int32), np.arange(4, 8, dtype=np.int32)])
        np.testing.assert_array_equal(tshm.get_contents_as_numpy(handle, np.int32, [2, 4]), np.arange(8).reshape(2, 4))
        with pytest.raises(tshm.SharedMemoryException, match="do not fit"):
            tshm.set_shared_memory_region(handle, [np.zeros(9, np.int32)])
        with pytest.raises(InferenceServerException, match="36 bytes requested"):
            tshm.get_contents_as_numpy(handle, np.int32, [9])
        tshm.set_shared_memory_region(handle, [serialize_string_tensor(np.array([b"ab", b"cde"], dtype=object))])
        assert list(tshm.get_contents_as_numpy(handle, np.object_, [2])) == [b"ab", b"cde"]
        with pytest.raises(tshm.SharedMemoryException, match="positive"):
            tshm.create_shared_memory_region("z", f"/{tag}z", 0)
        with pytest.raises(tshm.SharedMemoryException, match="expected a handle"):
            tshm.set_shared_memory_region("nope", [])
    finally:
        tshm.destroy_shared_memory_region(handle)
    tshm.destroy_shared_memory_region(handle)  # idempotent
    with pytest.raises(tshm.SharedMemoryException, match="destroyed"):
        tshm.get_contents_as_numpy(handle, np.int32, [1])
    assert shm_entries(tag) == []


class FakeConnection:
    """Refuses the first ``busy`` unregister calls as Triton does while a request still holds a region."""

    def __init__(self, busy, message="Cannot unregister shared memory region 'r', it is currently in use."):
        self.busy, self.message, self.calls = busy, message, []

    def check_open(self):
        pass

    def call(self, method, *args, **kwargs):
        self.calls.append((method, args))
        if len(self.calls) <= self.busy:
            raise InferenceServerException(self.message)


def _shm_context(connection):
    from pytriton.client.legacy import SharedMemoryControlContext

    context = SharedMemoryControlContext.__new__(SharedMemoryControlContext)
    context._conn, context._lock, context._next_id, context._last_id = connection, threading.Lock(), 0, None
    return context


def test_unregister_retries_a_region_still_in_use():
    connection = FakeConnection(busy=2)
    context = _shm_context(connection)
    context.unregister(SharedMemoryHandle("r", "/k", 8, region=None))
    assert connection.calls == [("unregister_system_shared_memory", ("r",))] * 3
    assert context.get_last_request_id() == 1
    context.unregister_all()
    assert connection.calls[-1] == ("unregister_system_shared_memory", ())
    other = FakeConnection(busy=1, message="no such region")
    with pytest.raises(InferenceServerException, match="no such region"):
        _shm_context(other).unregister_all()
    assert len(other.calls) == 1  # other errors are not retried


def test_model_config_constants_module():
    import tensorrtserver.api.model_config_pb2 as model_config

    config = ModelConfig.from_v2(GRPC_CONFIG)
    assert config.input[0].data_type == model_config.TYPE_INT32 == 8
    assert model_config.TYPE_FP32 == DataType.TYPE_FP32 and model_config.ModelInput.FORMAT_NHWC == 1


class FakeInferConnection:
    """``InferContext``'s HTTP transport: the model config, and an answer of two samples of ``Y``."""

    is_grpc = False
    headers: dict = {}
    url = "fake:8000"

    def __init__(self, url, protocol, verbose, http_headers):
        self.requests = []
        self.closed = False

    def call(self, method, *args, what="", **kwargs):
        assert (method, args) == ("get_model_config", ("nb", ""))
        return dict(NOBATCH, max_batch_size=4)

    def submit(self, work, done):
        done(work(self), None)  # ``self`` stands in for the tritonclient client

    def infer(self, **kwargs):
        self.requests.append(kwargs)
        result = FakeResult({"Y": np.full((2, 3), 2.0, np.float32)})
        result.get_response = lambda: {"model_version": "3"}
        return result

    def close(self):
        self.closed = True


def test_infer_context_runs_requests_and_keeps_the_legacy_bookkeeping(monkeypatch):
    from pytriton.client.legacy import _infer

    monkeypatch.setattr(_infer, "Connection", FakeInferConnection)
    samples = [np.zeros(3, np.float32), np.ones(3, np.float32)]
    with InferContext("fake:8000", ProtocolType.HTTP, "nb") as context:
        connection = context._conn
        results = context.run({"X": samples}, {"Y": ResultFormat.RAW}, batch_size=2)
        assert len(results["Y"]) == 2 and results["Y"][0].shape == (3,)
        assert context.get_last_request_id() == 1 and context.get_last_request_model_version() == 3
        assert context.get_last_request_model_name() == "nb"
        request_id = context.async_run(None, {"X": samples}, {"Y": ResultFormat.RAW}, batch_size=2)
        assert context.get_ready_async_request() == request_id == 2
        assert len(context.get_async_run_results(request_id)["Y"]) == 2
        assert context.get_stat()["completed_request_count"] == 2
        assert [request["request_id"] for request in connection.requests] == ["1", "2"]
        with pytest.raises(InferenceServerException, match="bad request|expected"):
            context.run({"X": [np.zeros(4, np.float32)]}, {"Y": ResultFormat.RAW})
        assert context.get_last_request_id() is None  # a failed request clears it
    assert connection.closed
    with pytest.raises(InferenceServerException, match="closed"):
        context.run({"X": samples[:1]}, {"Y": ResultFormat.RAW})


class FakeStreamConnection(FakeInferConnection):
    """A gRPC transport with a stream that never answers (its requests stay in flight)."""

    is_grpc = True

    def __init__(self, url, protocol, verbose, http_headers):
        super().__init__(url, protocol, verbose, http_headers)
        self.stops = []
        self.grpc_client = self
        self._stream = None  # no gRPC call to bound the half-close with: stop_stream returns at once

    def call(self, method, *args, what="", **kwargs):
        if method == "start_stream":
            return None
        return {"config": dict(NOBATCH, max_batch_size=4)}

    def async_stream_infer(self, **kwargs):
        self.requests.append(kwargs)

    def stop_stream(self, cancel_requests=False):
        self.stops.append(cancel_requests)


def test_a_streaming_context_cancels_its_stream_only_with_requests_in_flight(monkeypatch):
    from pytriton.client.legacy import _infer

    monkeypatch.setattr(_infer, "Connection", FakeStreamConnection)
    idle = InferContext("fake:8001", ProtocolType.GRPC, "nb", streaming=True)
    idle.close()
    # Nothing in flight: half-closed, since cancelling a stream whose last response is still being
    # written can keep the model from ever unloading (client/_decoupled.py, end_stream).
    assert idle._conn.stops == [False] and idle._conn.closed
    busy = InferContext("fake:8001", ProtocolType.GRPC, "nb", streaming=True)
    request_id = busy.async_run(None, {"X": [np.zeros(3, np.float32)]}, {"Y": ResultFormat.RAW}, batch_size=1)
    busy.close()
    assert busy._conn.stops == [True]  # abandoned: cancelled
    with pytest.raises(InferenceServerException, match="closed"):
        busy.get_async_run_results(request_id)
