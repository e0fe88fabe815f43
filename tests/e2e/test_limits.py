"""End to end: output checks without strict mode and the request-size limit, on a real tritonserver.

Clients are raw tritonclient (HTTP and gRPC) and plain ``http.client`` / gRPC stubs for requests
tritonclient refuses to build. The tests of a model's output checks and of its request limit run on
thread and on backend instances (tests/e2e/_kinds.py).
"""

from __future__ import annotations

import http.client
import json
import queue
import threading

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports
from tests.e2e._kinds import bind_kinds, model
from tests.e2e.kind_models import extra_dims, float64_out, identity, object_out, only_first, stream_identity, widened

LIMIT = 1 << 20  # 1 MiB of inputs per request
F32 = np.float32


def _t(name, shape=(-1,), dtype=F32):
    return Tensor(name=name, shape=shape, dtype=dtype)


@pytest.fixture(scope="module")
def server():
    ports = triton_ports()
    triton = Triton(config=TritonConfig(max_request_bytes=LIMIT, **ports))
    triton.bind("Plain", identity, [_t("x")], [_t("x")])
    # The models the tests taking ``kind`` call, on each instance kind (tests/e2e/_kinds.py).
    bind_kinds(triton, "Float64Out", float64_out, [_t("x")], [_t("y")])
    bind_kinds(triton, "ObjectOut", object_out, [_t("x")], [_t("y")])
    bind_kinds(triton, "ExtraDims", extra_dims, [_t("x")], [_t("y")])
    bind_kinds(triton, "Widened", widened, [_t("x", dtype=np.int16)], [_t("y")])
    bind_kinds(triton, "Pair", only_first, [_t("x")], [_t("a"), _t("b")])
    bind_kinds(
        triton,
        "Echo",
        identity,
        [_t("x"), _t("s", dtype=bytes)],
        [_t("x"), _t("s", dtype=bytes)],
        config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=200_000)),
    )
    bind_kinds(
        triton,
        "StreamEcho",
        stream_identity,
        [_t("x")],
        [_t("x")],
        config=ModelConfig(max_batch_size=1, decoupled=True),
    )
    triton.run()
    yield triton, ports
    triton.stop()


@pytest.fixture(params=["http", "grpc"])
def client(request, server):
    _, ports = server
    if request.param == "http":
        c = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}", concurrency=4)
        c.module = httpclient
    else:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
        c.module = grpcclient
    yield c
    c.close()


def infer(client, model, arrays, outputs=None):
    module = client.module
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    requested = [module.InferRequestedOutput(name) for name in outputs] if outputs else None
    return client.infer(model, inputs, outputs=requested)


def _echo_inputs(floats: int, text: bytes = b"t"):
    return {"x": np.ones((1, floats), F32), "s": np.array([[text]], dtype=object)}


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("Float64Out", "output 'y' of result 0 has dtype float64, declared float32"),
        ("ObjectOut", "output 'y' of result 0 has dtype object, declared float32"),
        ("ExtraDims", "output 'y' of result 0 has shape (1, 3, 1), declared (-1,) after the batch axis"),
    ],
)
def test_incompatible_outputs_are_clean_errors_without_strict(client, name, fragment, kind):
    with pytest.raises(InferenceServerException) as info:
        infer(client, model(name, kind), {"x": np.ones((1, 3), F32)})
    assert f"Model '{model(name, kind)}'" in info.value.message() and fragment in info.value.message()


def test_lossless_conversion_reaches_the_client_as_the_declared_dtype(client, kind):
    x = np.array([[-32768, 0, 32767]], dtype=np.int16)
    y = infer(client, model("Widened", kind), {"x": x}).as_numpy("y")
    assert y.dtype == F32 and y.tolist() == [[-32768.0, 0.0, 32767.0]]


def test_a_missing_output_is_a_clean_error_not_a_client_crash(client, kind):
    x = np.ones((1, 2), F32)
    pair = model("Pair", kind)
    with pytest.raises(InferenceServerException, match=rf"Model '{pair}': result 0 lacks output\(s\) \['b'\]"):
        infer(client, pair, {"x": x})
    # Asking for one output only is fine when the callable returns that one.
    result = infer(client, pair, {"x": x}, outputs=["b"])
    np.testing.assert_array_equal(result.as_numpy("b"), x)


def test_a_request_over_the_limit_gets_a_clean_error(client, kind):
    floats = LIMIT // 4  # plus the string input: just over the limit
    with pytest.raises(InferenceServerException) as info:
        infer(client, model("Echo", kind), _echo_inputs(floats))
    message = info.value.message()
    assert f"model '{model('Echo', kind)}' holds 1.0 MiB (1048581 bytes) of inputs" in message
    assert "limit of 1.0 MiB (1048576 bytes)" in message and "max_request_bytes" in message
    # Exactly at the limit passes, bit-exact.
    inputs = _echo_inputs(floats - 2, b"x" * 3)  # 1048568 + 4 + 3 bytes
    result = infer(client, model("Echo", kind), inputs)
    np.testing.assert_array_equal(result.as_numpy("x"), inputs["x"])


def test_strings_count_towards_the_limit(client, kind):
    with pytest.raises(InferenceServerException, match="holds 1.0 MiB"):
        infer(client, model("Echo", kind), _echo_inputs(1, b"s" * LIMIT))


def test_only_the_oversized_request_of_a_batch_fails(server, kind):
    # The batcher waits up to 200 ms, so these two usually share a batch; either way only the
    # oversized one may fail.
    _, ports = server
    c = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}", concurrency=2)
    c.module = httpclient
    outcome = {}

    def send(key, floats):
        try:
            outcome[key] = infer(c, model("Echo", kind), _echo_inputs(floats)).as_numpy("x").shape
        except InferenceServerException as exc:
            outcome[key] = exc.message()

    threads = [threading.Thread(target=send, args=(key, n)) for key, n in (("big", LIMIT), ("small", 10))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    c.close()
    assert outcome["small"] == (1, 10)
    assert "more than the server's limit" in outcome["big"]


def test_a_streamed_request_over_the_limit_ends_with_an_error(server, kind):
    _, ports = server
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for floats in (LIMIT, 4):
            tensor = grpcclient.InferInput("x", [1, floats], "FP32")
            tensor.set_data_from_numpy(np.full((1, floats), 2.0, F32))
            c.async_stream_infer(model("StreamEcho", kind), [tensor])
        _, error = results.get(timeout=30)
        assert error is not None and "more than the server's limit" in str(error)
        steps = [results.get(timeout=30) for _ in range(2)]
        assert [result.as_numpy("x").tolist() for result, error in steps] == [[[2.0] * 4], [[3.0] * 4]]
    finally:
        c.stop_stream()
        c.close()


def _assert_serving(ports):
    c = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http_port']}")
    c.module = httpclient
    try:
        assert c.is_server_ready()
        np.testing.assert_array_equal(infer(c, "Echo", _echo_inputs(3)).as_numpy("x"), np.ones((1, 3), F32))
    finally:
        c.close()


@pytest.mark.parametrize("shape", [[1, 2**33], [1, 2**62]])
def test_grpc_request_declaring_a_huge_shape_is_refused_cleanly(server, shape):
    # Over HTTP JSON the same declaration aborts tritonserver 2.51 (docs/configuration.md,
    # "Request size"); over gRPC Triton compares the declared and the sent byte sizes first.
    _, ports = server
    with grpc.insecure_channel(f"127.0.0.1:{ports['grpc_port']}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="Plain")
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = "x", "FP32"
        tensor.shape.extend(shape)
        request.raw_input_contents.append(np.ones(1, F32).tobytes())
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "byte size mismatch" in info.value.details()
    _assert_serving(ports)


def test_http_binary_request_declaring_a_huge_shape_is_refused_cleanly(server):
    _, ports = server
    header = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 2**33], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}
    ).encode()
    connection = http.client.HTTPConnection("127.0.0.1", ports["http_port"], timeout=30)
    try:
        connection.request(
            "POST",
            "/v2/models/Plain/infer",
            body=header + np.ones(1, F32).tobytes(),
            headers={"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))},
        )
        response = connection.getresponse()
        status, body = response.status, response.read()
    finally:
        connection.close()
    assert status == 400 and b"byte size mismatch" in body
    _assert_serving(ports)
