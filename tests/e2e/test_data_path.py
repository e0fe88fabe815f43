"""End to end: bound callables served by a real tritonserver, called with raw tritonclient."""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from pytriton.exceptions import PyTritonUnrecoverableError
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import DTYPES, triton_ports, wait_for
from tests.e2e._kinds import bind_kinds
from tests.e2e._kinds import model as _m
from tests.e2e.data_path_models import (
    Scaler,
    add_sub,
    async_double,
    echo_parameters,
    failing,
    identity,
    identity_renamed,
    in_place,
    large_layouts,
    numeric_layouts,
    streamer,
    strict_bad_dtype,
    wrong_count,
    wrong_type,
)

BIG_BYTES = 256 * 1024 * 1024
RETAINED: list = []


def optional_probe(requests):
    results = []
    for r in requests:
        b = r.get("b")
        total = r["a"] + (b if b is not None else 0)
        results.append({"out": total, "has_b": np.array([[b is not None]] * len(r["a"]))})
    return results


INTERVALS: list = []


def make_instance(index):
    def infer(requests):
        started = time.monotonic()
        time.sleep(0.02)
        INTERVALS.append((index, started, time.monotonic()))
        return [{"who": np.full((len(r["x"]), 1), index, dtype=np.int32), "y": r["x"]} for r in requests]

    return infer


def big_streamer(requests):
    # Chunks of 400 kB: each goes through the worker's arena, which is reused for the next one.
    for step in range(int(requests[0]["n"].flat[0])):
        yield [{"chunk": np.full((1, 100_000), step, dtype=np.float32)} for _ in requests]


CANCELLABLE = {"steps": 0, "closed": False}


def cancellable_stream(requests):
    CANCELLABLE.update(steps=0, closed=False)
    try:
        for step in range(int(requests[0]["n"].flat[0])):
            time.sleep(0.005)
            CANCELLABLE["steps"] = step + 1
            yield [{"step": np.array([[step]], dtype=np.int32)} for _ in requests]
    finally:
        CANCELLABLE["closed"] = True


def retaining(requests):
    RETAINED.extend(r["x"] for r in requests)
    return [{"y": r["x"]} for r in requests]


RETAINED_LARGE: list = []


def retaining_large(requests):
    RETAINED_LARGE.extend(r["x"][::2] for r in requests)  # a view of the input is enough to retain it
    return [{"y": r["x"]} for r in requests]


SLOW_CALLS: list = []  # the delay of every slow() call still inside its sleep


def slow(requests):
    delay = float(requests[0]["x"].flat[0])
    SLOW_CALLS.append(delay)
    try:
        time.sleep(delay)
    finally:
        SLOW_CALLS.remove(delay)
    return [{"y": r["x"]} for r in requests]


def unrecoverable(requests):
    raise PyTritonUnrecoverableError("the GPU caught fire")


F32 = np.float32


def _t(name, shape=(-1,), dtype=F32, optional=False):
    return Tensor(name=name, shape=shape, dtype=dtype, optional=optional)


# Models bound a second time as ``<name>_backend`` with instance_kind="backend"; the tests taking
# the ``kind`` fixture (tests/e2e/_kinds.py) run on both (tests/e2e/test_backend_instances.py covers that kind on its own).
BACKEND_TWINS = {
    "AllTypes", "AddSub", "NoBatch", "Dynamic", "Params", "Object", "Async", "Stream", "Fails", "Strict",
    "Layouts", "NumericLayouts", "WrongType", "WrongCount", "InPlace",
}  # fmt: skip


@pytest.fixture(scope="module")
def server():
    ports = triton_ports()
    triton = Triton(config=TritonConfig(**ports))

    def bind(name, *args, **kwargs):
        if name in BACKEND_TWINS:  # the same model again, run inside its stub (see _m)
            bind_kinds(triton, name, *args, **kwargs)
        else:
            triton.bind(name, *args, **kwargs)

    type_inputs = [_t(f"in_{np.dtype(d).name}", (-1,), d) for d in DTYPES] + [_t("in_bytes", (-1,), bytes)]
    bind(
        "AllTypes",
        identity_renamed,
        type_inputs,
        [_t(f"out_{np.dtype(d).name}", (-1,), d) for d in DTYPES] + [_t("out_bytes", (-1,), bytes)],
    )
    bind("AddSub", add_sub, [_t("a"), _t("b")], [_t("add"), _t("sub")])
    bind(
        "NoBatch",
        add_sub,
        [_t("a", (2, 3)), _t("b", (2, 3))],
        [_t("add", (2, 3)), _t("sub", (2, 3))],
        config=ModelConfig(batching=False),
    )
    bind("Dynamic", identity, [_t("x", (-1, -1))], [_t("x", (-1, -1))])
    bind("Optional", optional_probe, [_t("a"), _t("b", optional=True)], [_t("out"), _t("has_b", (1,), bool)])
    bind("Params", echo_parameters, [_t("x")], [_t("params", (1,), bytes)])
    bind("Big", identity, [_t("x", (-1,), np.uint8)], [_t("x", (-1,), np.uint8)], config=ModelConfig(max_batch_size=1))
    bind(
        "Instances",
        [make_instance(i) for i in range(3)],
        [_t("x")],
        [_t("who", (1,), np.int32), _t("y")],
        config=ModelConfig(max_batch_size=8),
    )
    bind("Object", Scaler(3.0), [_t("x")], [_t("y")])
    bind("Async", async_double, [_t("x")], [_t("y")])
    bind(
        "Stream",
        streamer,
        [_t("n", (1,), np.int32), _t("fail", (1,), np.int32)],
        [_t("step", (1,), np.int32)],
        config=ModelConfig(decoupled=True),
    )
    bind(
        "BigStream",
        big_streamer,
        [_t("n", (1,), np.int32)],
        [_t("chunk", (-1,), np.float32)],
        config=ModelConfig(decoupled=True),
    )
    bind(
        "Cancellable",
        cancellable_stream,
        [_t("n", (1,), np.int32)],
        [_t("step", (1,), np.int32)],
        config=ModelConfig(max_batch_size=1, decoupled=True),
    )
    bind(
        "Layouts",
        large_layouts,
        [_t("x")],
        [_t("same"), _t("tail"), _t("fortran"), _t("strided"), _t("text", (-1,), bytes)],
        config=ModelConfig(max_batch_size=1),
    )
    bind("NumericLayouts", numeric_layouts, [_t("x")], [_t("same"), _t("strided"), _t("fortran")])
    bind("Fails", failing, [_t("x")], [_t("y")])
    bind("WrongType", wrong_type, [_t("x")], [_t("y")])
    bind("WrongCount", wrong_count, [_t("x")], [_t("y")])
    bind("Retain", retaining, [_t("x")], [_t("y")])
    bind("RetainLarge", retaining_large, [_t("x")], [_t("y")])
    bind("InPlace", in_place, [_t("x")], [_t("y")])
    bind("Slow", [slow, slow], [_t("x")], [_t("y")], config=ModelConfig(max_batch_size=1))
    bind("Strict", strict_bad_dtype, [_t("x")], [_t("y")], strict=True)
    bind(
        "Batched",
        identity,
        [_t("x", (4,))],
        [_t("x", (4,))],
        config=ModelConfig(max_batch_size=32, batcher=DynamicBatcher(max_queue_delay_microseconds=20000)),
    )
    triton.run()
    yield triton, ports
    triton.stop()


@pytest.fixture(params=["http", "grpc"])
def client(request, server):
    _, ports = server
    if request.param == "http":
        c = httpclient.InferenceServerClient(
            f"127.0.0.1:{ports['http_port']}", concurrency=8, network_timeout=600, connection_timeout=600
        )
        c.module = httpclient
    else:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
        c.module = grpcclient
    yield c
    c.close()


def infer(client, model, arrays, outputs=None, **kwargs):
    module = client.module
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    requested = [module.InferRequestedOutput(name) for name in outputs] if outputs else None
    return client.infer(model, inputs, outputs=requested, **kwargs)


def test_every_dtype_round_trips_exactly(client, kind):
    rng = np.random.default_rng(1)
    arrays = {f"in_{np.dtype(d).name}": (rng.random((2, 5)) * 120).astype(d) for d in DTYPES}
    arrays["in_int64"][0, 0] = np.iinfo(np.int64).max
    arrays["in_uint64"][0, 0] = np.iinfo(np.uint64).max
    arrays["in_float64"][0, 0] = np.pi
    arrays["in_bytes"] = np.array([[b"a", b"", b"\x00\xff", "z\u00e9".encode(), b"x" * 1000]] * 2, dtype=object)
    result = infer(client, _m("AllTypes", kind), arrays)
    for name, sent in arrays.items():
        received = result.as_numpy("out_" + name[3:])
        assert received.shape == sent.shape, name
        if name == "in_bytes":
            assert received.tolist() == sent.tolist()
        else:
            assert received.dtype == sent.dtype, name
            np.testing.assert_array_equal(received, sent, err_msg=name)


def test_add_sub_two_inputs(client, kind):
    a = np.array([[1, 2, 3]], dtype=F32)
    b = np.array([[10, 20, 30]], dtype=F32)
    result = infer(client, _m("AddSub", kind), {"a": a, "b": b})
    np.testing.assert_array_equal(result.as_numpy("add"), a + b)
    np.testing.assert_array_equal(result.as_numpy("sub"), a - b)


def test_requested_output_subset(client, kind):
    a = np.ones((1, 2), F32)
    result = infer(client, _m("AddSub", kind), {"a": a, "b": a}, outputs=["sub"])
    assert result.as_numpy("add") is None
    np.testing.assert_array_equal(result.as_numpy("sub"), a * 0)


def test_non_batching_model(client, kind):
    a = np.arange(6, dtype=F32).reshape(2, 3)
    result = infer(client, _m("NoBatch", kind), {"a": a, "b": a})
    np.testing.assert_array_equal(result.as_numpy("add"), a * 2)


def test_dynamic_dims(client, kind):
    for shape in [(1, 1, 1), (2, 7, 3), (1, 100, 2)]:
        x = np.random.default_rng(0).random(shape).astype(F32)
        np.testing.assert_array_equal(infer(client, _m("Dynamic", kind), {"x": x}).as_numpy("x"), x)


def test_zero_size_tensor(client, kind):
    x = np.zeros((1, 0, 4), dtype=F32)
    assert infer(client, _m("Dynamic", kind), {"x": x}).as_numpy("x").shape == (1, 0, 4)


def test_optional_input_absent_and_present(client):
    a = np.ones((1, 2), F32)
    absent = infer(client, "Optional", {"a": a})
    assert not absent.as_numpy("has_b").any()
    np.testing.assert_array_equal(absent.as_numpy("out"), a)
    present = infer(client, "Optional", {"a": a, "b": a * 5})
    assert present.as_numpy("has_b").all()
    np.testing.assert_array_equal(present.as_numpy("out"), a * 6)


def test_parameters_reach_the_callable(client, kind):
    x = np.ones((1, 1), F32)
    result = infer(client, _m("Params", kind), {"x": x}, parameters={"temperature": "0.5", "top_k": 3, "flag": True})
    received = json.loads(result.as_numpy("params")[0, 0])
    assert received == {"flag": True, "temperature": "0.5", "top_k": 3}


def test_callable_object_and_async_callable(client, kind):
    x = np.array([[1.5, 2.0]], F32)
    np.testing.assert_array_equal(infer(client, _m("Object", kind), {"x": x}).as_numpy("y"), x * 3)
    np.testing.assert_array_equal(infer(client, _m("Async", kind), {"x": x}).as_numpy("y"), x * 2)


def test_user_error_reaches_client_without_traceback(client, kind):
    with pytest.raises(InferenceServerException) as info:
        infer(client, _m("Fails", kind), {"x": np.ones((1, 1), F32)})
    message = info.value.message()
    assert "ValueError: bad thing happened" in message
    assert "Traceback" not in message and ".py" not in message
    # The server keeps serving.
    np.testing.assert_array_equal(infer(client, _m("Object", kind), {"x": np.ones((1, 1), F32)}).as_numpy("y"), [[3.0]])


@pytest.mark.parametrize("model, fragment", [("WrongType", "must return a list"), ("WrongCount", "2 results for 1")])
def test_bad_callable_results_are_explained(client, model, fragment, kind):
    with pytest.raises(InferenceServerException, match=fragment):
        infer(client, _m(model, kind), {"x": np.ones((1, 1), F32)})


def test_strict_mode_checks_output_dtype(client, kind):
    with pytest.raises(InferenceServerException, match="dtype float64"):
        infer(client, _m("Strict", kind), {"x": np.ones((1, 1), F32)})


def test_single_output_model_rejects_an_unknown_requested_output(client):
    # The proxy does not filter the outputs of a single-output model; this holds because Triton
    # rejects an unknown requested name before the model runs.
    x = np.ones((1, 2, 1), F32)
    with pytest.raises(InferenceServerException, match="nope"):
        infer(client, "Dynamic", {"x": x}, outputs=["nope"])
    np.testing.assert_array_equal(infer(client, "Dynamic", {"x": x}, outputs=["x"]).as_numpy("x"), x)


def test_bad_inputs_get_clean_errors(client):
    with pytest.raises(InferenceServerException):
        infer(client, "AddSub", {"a": np.ones((1, 2), F32)})  # missing required input
    with pytest.raises(InferenceServerException):
        infer(client, "AddSub", {"a": np.ones((1, 2), np.int32), "b": np.ones((1, 2), np.int32)})  # wrong dtype
    with pytest.raises(InferenceServerException):
        infer(client, "NoSuchModel", {"x": np.ones((1, 2), F32)})
    with pytest.raises(InferenceServerException):
        infer(client, "AddSub", {"a": np.ones((1, 2), F32), "b": np.ones((1, 2), F32)}, model_version="7")
    with pytest.raises(InferenceServerException):
        infer(client, "Big", {"x": np.ones((2, 4), np.uint8)})  # batch 2 > max_batch_size 1


def test_retained_inputs_keep_their_values(client):
    RETAINED.clear()
    for value in range(5):
        infer(client, "Retain", {"x": np.full((1, 64), value, F32)})
    assert [float(array[0, 0]) for array in RETAINED] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert all((array == array[0, 0]).all() for array in RETAINED)


def test_retained_large_inputs_keep_their_values(client):
    # Large inputs reach the callable without a copy; keeping them must still be safe.
    RETAINED_LARGE.clear()
    size = 300_000  # 1.2 MB per request: through shared memory
    for value in range(4):
        x = np.full((1, size), value, F32)
        np.testing.assert_array_equal(infer(client, "RetainLarge", {"x": x}).as_numpy("y"), x)
    assert [float(array[0, 0]) for array in RETAINED_LARGE] == [0.0, 1.0, 2.0, 3.0]
    assert all((array == array[0, 0]).all() for array in RETAINED_LARGE)


def test_large_inputs_modified_in_place(client, kind):
    for value in range(3):
        x = np.full((2, 200_000), value, F32)
        np.testing.assert_array_equal(infer(client, _m("InPlace", kind), {"x": x}).as_numpy("y"), x + 1)


def test_instances_serve_concurrently(server):
    _, ports = server
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
    c.module = grpcclient

    def call(i):
        x = np.full((1, 3), i, F32)
        result = infer(c, "Instances", {"x": x})
        np.testing.assert_array_equal(result.as_numpy("y"), x)
        return int(result.as_numpy("who")[0, 0])

    INTERVALS.clear()
    with ThreadPoolExecutor(12) as pool:
        seen = list(pool.map(call, range(60)))
    c.close()
    assert set(seen) == {0, 1, 2}
    # Two different instances were inside their callables at the same time.
    overlapping = any(
        a[0] != b[0] and a[1] < b[2] and b[1] < a[2] for i, a in enumerate(INTERVALS) for b in INTERVALS[i + 1 :]
    )
    assert overlapping, "instances never ran concurrently"


def test_several_models_under_concurrent_load(server):
    _, ports = server

    def worker(seed):
        c = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}")
        c.module = httpclient
        rng = np.random.default_rng(seed)
        for _ in range(20):
            a = rng.random((1, 8)).astype(F32)
            np.testing.assert_array_equal(infer(c, "AddSub", {"a": a, "b": a}).as_numpy("add"), a + a)
            x = rng.random((1, 4)).astype(F32)
            np.testing.assert_array_equal(infer(c, "Batched", {"x": x}).as_numpy("x"), x)
        c.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(worker, range(8)))


def test_slow_request_times_out_for_its_client_only(server):
    _, ports = server
    slow_client = httpclient.InferenceServerClient(
        f"127.0.0.1:{ports['http_port']}", network_timeout=0.5, connection_timeout=0.5
    )
    slow_client.module = httpclient
    # tritonclient's HTTP client lets the socket's timeout through (TimeoutError from Python 3.10 on).
    with pytest.raises(socket.timeout, match="timed out"):
        infer(slow_client, "Slow", {"x": np.full((1, 1), 4.0, F32)})
    fast = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
    fast.module = grpcclient
    result = infer(fast, "Slow", {"x": np.zeros((1, 1), F32)})
    # Served by the second instance while the first one is still inside the abandoned 4 s call
    # (had it queued behind that call, the call would be over by now): no clock involved.
    assert 4.0 in SLOW_CALLS
    np.testing.assert_array_equal(result.as_numpy("y"), [[0.0]])
    fast.close()
    slow_client.close()


def test_256_mib_tensor(server):
    _, ports = server
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
    c.module = grpcclient
    x = np.random.default_rng(3).integers(0, 255, size=(1, BIG_BYTES), dtype=np.uint8)
    # gRPC defaults to 2 GiB messages in tritonclient; the result must be bit-exact.
    result = infer(c, "Big", {"x": x})
    assert np.array_equal(result.as_numpy("x"), x)
    c.close()


@pytest.mark.large
def test_1_gib_tensor_over_http(server):
    # The size floor. HTTP with binary data keeps the client's own copies to about three
    # (the array, the request body, the response); peak memory of the whole test is about 7 GiB.
    _, ports = server
    c = httpclient.InferenceServerClient(
        f"127.0.0.1:{ports['http_port']}", network_timeout=300.0, connection_timeout=300.0
    )
    pattern = np.random.default_rng(4).integers(0, 255, size=(1 << 20,), dtype=np.uint8)
    x = np.tile(pattern, 1024)[None, :]  # 1 GiB, non-repeating within each MiB
    x[0, ::4099] ^= 0x5A  # and no two MiB blocks alike
    tensor = httpclient.InferInput("x", list(x.shape), "UINT8")
    tensor.set_data_from_numpy(x, binary_data=True)
    result = c.infer("Big", [tensor])
    del tensor
    assert np.array_equal(result.as_numpy("x"), x)
    c.close()


def _stream(ports, n, fail, kind="thread"):
    return _stream_model(ports, _m("Stream", kind), {"n": n, "fail": fail})


def _open_stream(ports, model, values, **kwargs):
    """Open a gRPC stream and send one request of [1, 1] int32 inputs; returns the client and a
    queue of its ``(result, error)`` callbacks. The caller stops the stream and closes the client."""
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    inputs = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(name, [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        inputs.append(tensor)
    c.async_stream_infer(model, inputs, **kwargs)
    return c, results


def _stream_model(ports, model, values):
    """Stream one request of [1, 1] int32 inputs; the ``step`` outputs in order and the errors."""
    c, results = _open_stream(ports, model, values, enable_empty_final_response=True)
    steps, errors = [], []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        result, error = results.get(timeout=30)
        if error is not None:
            errors.append(str(error))
            continue
        response = result.get_response()
        if response.parameters.get("triton_final_response") and response.parameters["triton_final_response"].bool_param:
            break
        steps.append(int(result.as_numpy("step")[0, 0]))
    c.stop_stream()
    c.close()
    return steps, errors


def test_decoupled_streaming(server, kind):
    _, ports = server
    steps, errors = _stream(ports, 5, 0, kind)
    assert steps == [0, 1, 2, 3, 4] and errors == []


def test_long_stream_of_small_responses(server):
    # More chunks than the stream window: the worker pauses for acknowledgements along the way.
    _, ports = server
    steps, errors = _stream(ports, 100, 0)
    assert steps == list(range(100)) and errors == []


def test_cancelled_stream_stops_the_generator(server):
    _, ports = server
    c, results = _open_stream(ports, "Cancellable", {"n": 1000})
    for _ in range(3):
        result, error = results.get(timeout=30)
        assert error is None, error
    c.stop_stream(cancel_requests=True)
    c.close()
    # The generator is stopped at the next acknowledgement and its finally block runs.
    assert wait_for(lambda: CANCELLABLE["closed"], timeout_s=20)
    assert CANCELLABLE["steps"] < 100, CANCELLABLE
    # The model keeps serving: the next stream is complete and in order.
    steps, errors = _stream_model(ports, "Cancellable", {"n": 5})
    assert steps == [0, 1, 2, 3, 4] and errors == []


def test_leaving_a_decoupled_client_loop_stops_the_generator(server):
    from pytriton.client import DecoupledModelClient

    _, ports = server
    with DecoupledModelClient(f"grpc://127.0.0.1:{ports['grpc_port']}", "Cancellable") as client:
        received = []
        for partial in client.infer_sample(n=np.array([1000], dtype=np.int32)):
            received.append(int(partial["step"][0]))
            if len(received) == 3:
                break
    assert received == [0, 1, 2]
    assert wait_for(lambda: CANCELLABLE["closed"], timeout_s=20)
    assert CANCELLABLE["steps"] < 100, CANCELLABLE


@pytest.mark.parametrize("count", [2, 40])
def test_decoupled_error_mid_stream(server, count, kind):
    _, ports = server
    steps, errors = _stream(ports, count, 1, kind)
    assert steps == list(range(count))
    assert len(errors) == 1 and "RuntimeError: stream broke at the end" in errors[0]


def test_large_streamed_chunks_arrive_intact(server):
    _, ports = server
    c, results = _open_stream(ports, "BigStream", {"n": 6}, enable_empty_final_response=True)
    chunks = []
    for _ in range(20):  # 6 chunks and the final flag
        result, error = results.get(timeout=30)
        assert error is None, error
        response = result.get_response()
        if response.outputs:
            chunks.append(result.as_numpy("chunk"))
        if "triton_final_response" in response.parameters and response.parameters["triton_final_response"].bool_param:
            break
    c.stop_stream()
    c.close()
    assert [chunk.shape for chunk in chunks] == [(1, 100_000)] * 6
    for step, chunk in enumerate(chunks):
        assert (chunk == step).all(), f"chunk {step} was overwritten"


def test_small_numeric_outputs_in_every_layout(client, kind):
    """Views and Fortran order as Triton's tensors (for the backend kind: its one-pass output path)."""
    x = np.arange(2 * 6, dtype=F32).reshape(2, 6)
    result = infer(client, _m("NumericLayouts", kind), {"x": x})
    np.testing.assert_array_equal(result.as_numpy("same"), x)
    np.testing.assert_array_equal(result.as_numpy("strided"), x[:, ::2])
    np.testing.assert_array_equal(result.as_numpy("fortran"), x * 2)


def test_numeric_outputs_leave_the_server_log_quiet(server, kind):
    """With numpy 2 in the stub (Python 3.13) outputs go to Triton through DLPack, which once wrote a
    capsule error with its traceback into the server log for every output tensor (_stub_dlpack)."""
    triton, ports = server
    c = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}")
    c.module = httpclient
    a = np.arange(6, dtype=F32).reshape(2, 3)
    for _ in range(3):
        result = infer(c, _m("AddSub", kind), {"a": a, "b": a})
        np.testing.assert_array_equal(result.as_numpy("add"), a * 2)
    c.close()
    noise = [line for line in triton.server_log if "PyCapsule" in line or "Exception ignored" in line]
    assert noise == [], noise[:8]


def test_large_outputs_in_every_layout(client, kind):
    rng = np.random.default_rng(7)
    for _ in range(3):  # repeated: the arenas are reused between requests
        x = rng.integers(0, 1000, size=(1, 120_000)).astype(F32)
        result = infer(client, _m("Layouts", kind), {"x": x})
        np.testing.assert_array_equal(result.as_numpy("same"), x)
        np.testing.assert_array_equal(result.as_numpy("tail"), x[:, 60_000:])
        np.testing.assert_array_equal(result.as_numpy("fortran"), x * 2)
        np.testing.assert_array_equal(result.as_numpy("strided"), x[:, ::2])
        text = result.as_numpy("text")
        assert (
            text.shape == (1, 20_000)
            and text[0, 5] == b"%d" % int(x[0, 5])
            and text[0, -1] == b"%d" % int(x[0, 19_999])
        )
    subset = infer(client, _m("Layouts", kind), {"x": x}, outputs=["tail", "strided"])
    np.testing.assert_array_equal(subset.as_numpy("tail"), x[:, 60_000:])
    assert subset.as_numpy("same") is None


def test_model_ready_endpoints(server):
    _, ports = server
    c = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}")
    assert c.is_server_ready()
    for model in ("AddSub", "Stream", "Instances"):
        assert c.is_model_ready(model)
    config = c.get_model_config("Instances")
    assert config["instance_group"][0]["count"] == 3
    c.close()


def test_live_binding_after_start(server):
    triton, ports = server
    triton.bind("LateModel", Scaler(-1.0), [_t("x")], [_t("y")])
    c = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}")
    c.module = httpclient
    assert c.is_model_ready("LateModel")
    np.testing.assert_array_equal(infer(c, "LateModel", {"x": np.ones((1, 2), F32)}).as_numpy("y"), [[-1.0, -1.0]])
    c.close()


def test_unrecoverable_error_stops_the_server():
    ports = triton_ports()
    triton = Triton(config=TritonConfig(**ports))
    triton.bind("Doomed", unrecoverable, [_t("x")], [_t("y")])
    triton.run()
    done = threading.Event()
    threading.Thread(target=lambda: (triton.serve(monitoring_period_sec=0.1), done.set()), daemon=True).start()
    c = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}")
    c.module = httpclient
    with pytest.raises(InferenceServerException, match="the GPU caught fire"):
        infer(c, "Doomed", {"x": np.ones((1, 1), F32)})
    c.close()
    assert done.wait(60), "serve() should return after an unrecoverable error"  # generous: a loaded machine
    assert not triton.is_alive()
    triton.stop()
