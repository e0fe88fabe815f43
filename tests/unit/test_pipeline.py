"""``pytriton.pipeline`` through its seams: the registry, what the inner request inherits from the
outer batch (deadline, trace context, cancellation), input preparation and error mapping.

End to end (real server, gRPC and in-process paths): tests/e2e/test_pipeline.py.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from pytriton import pipeline
from pytriton.client.exceptions import PyTritonClientInferenceServerError, PyTritonClientValueError
from pytriton.exceptions import PyTritonInvalidOperationError
from pytriton.model_config import Tensor
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy._binding import _resolve_tensors
from pytriton.proxy.types import CURRENT_BATCH, Request


class FakeTriton:
    """What pipeline.model reads of a running Triton."""

    def __init__(self, names, embedded=False, client=None):
        self._names = names
        self.embedded = embedded
        self._client = client
        self.grpc_url = "grpc://127.0.0.1:1"

    def _model_names(self):
        return self._names

    def _versions(self, name):
        config = TritonModelConfig(
            model_name=name,
            max_batch_size=4,
            inputs=_resolve_tensors([Tensor(name="x", shape=(1,), dtype=np.float32)], "INPUT", name),
            outputs=_resolve_tensors([Tensor(name="y", shape=(1,), dtype=np.float32)], "OUTPUT", name),
        )
        return [type("Bound", (), {"version": 1, "config": config})()]

    def client(self, name, version):
        return self._client


class FakeInprocessClient:
    def __init__(self, error=None):
        self.calls = []
        self.error = error

    def infer_sample(self, *inputs, **named):
        self.calls.append(("sample", inputs, named))
        if self.error is not None:
            raise self.error
        return {"y": np.asarray(inputs[0]) * 2}

    def infer_batch(self, *inputs, **named):
        self.calls.append(("batch", inputs, named))
        return {"y": np.asarray(inputs[0]) * 3}


@pytest.fixture()
def registered():
    tritons = []

    def register(triton):
        pipeline.register(triton)
        tritons.append(triton)
        return triton

    yield register
    for triton in tritons:
        pipeline.unregister(triton)


def test_a_model_nobody_bound_is_refused_with_the_way_out():
    with pytest.raises(PyTritonInvalidOperationError, match="url='grpc://host:port'"):
        pipeline.model("Nowhere")


def test_handles_are_cached_and_dropped_at_stop(registered):
    triton = registered(FakeTriton(["A"], embedded=True, client=FakeInprocessClient()))
    handle = pipeline.model("A")
    assert pipeline.model("A") is handle and handle.path == "inprocess"
    pipeline.unregister(triton)
    with pytest.raises(PyTritonInvalidOperationError):
        pipeline.model("A")


def test_the_inprocess_path_calls_the_server_and_keeps_the_inner_message(registered):
    client = FakeInprocessClient()
    registered(FakeTriton(["A"], embedded=True, client=client))
    handle = pipeline.model("A")
    assert handle.infer_sample(np.array([1.0]))["y"].tolist() == [2.0]
    assert handle.infer_batch(np.array([[1.0]]))["y"].tolist() == [[3.0]]
    client.error = RuntimeError("ValueError: inner says no")
    with pytest.raises(PyTritonClientInferenceServerError, match="inner says no"):
        handle.infer_sample(np.array([1.0]))


def test_a_cancelled_outer_batch_skips_the_inprocess_call(registered):
    client = FakeInprocessClient()
    registered(FakeTriton(["A"], embedded=True, client=client))
    request = Request({}, timeout_s=0.001)
    time.sleep(0.01)
    token = CURRENT_BATCH.set([request])
    try:
        with pytest.raises(pipeline.PipelineCancelledError):
            pipeline.model("A").infer_sample(np.array([1.0]))
    finally:
        CURRENT_BATCH.reset(token)
    assert client.calls == []


def test_the_inner_request_inherits_the_latest_outer_deadline():
    outer = pipeline._Outer([Request({}, timeout_s=0.5), Request({}, timeout_s=2.0)])
    assert 1.5 < outer.remaining_s() <= 2.0
    assert pipeline._Outer([Request({}, timeout_s=0.5), Request({})]).remaining_s() is None  # one waits forever
    assert pipeline._Outer(None).remaining_s() is None and not pipeline._Outer(None).cancelled()


def test_the_grpc_path_builds_the_request_from_the_bound_config(registered):
    import tritonclient.grpc as grpcclient

    registered(FakeTriton(["B"]))
    handle = pipeline.model("B")
    assert handle.path == "grpc"
    arrays, add_axis = handle._arrays([np.array([1.5], np.float32)], {}, False, None)
    assert add_axis and arrays["x"].shape == (1, 1)
    outer = pipeline._Outer([Request({}, timeout_s=1.0)])
    request = handle._request(grpcclient, arrays, outer)
    assert 0 < request["client_timeout"] <= 1.0 and 0 < request["timeout"] <= 1_000_000
    assert [tensor.name() for tensor in request["inputs"]] == ["x"]
    with pytest.raises(PyTritonClientValueError, match="takes 1 inputs, got 2"):
        handle._arrays([np.array([1.0]), np.array([2.0])], {}, False, None)
    with pytest.raises(PyTritonClientValueError, match="either positionally or by name"):
        handle._arrays([np.array([1.0])], {"x": np.array([1.0])}, False, None)


def test_trace_headers_carry_the_outer_span():
    from opentelemetry import trace  # the test extra

    context = trace.SpanContext(
        trace_id=0x1AF7651916CD43DD8448EB211C80319D, span_id=0xB7AD6B7169203333, is_remote=False,
        trace_flags=trace.TraceFlags(1),
    )  # fmt: skip
    headers = pipeline._trace_headers(trace.NonRecordingSpan(context))
    assert headers == {"traceparent": "00-1af7651916cd43dd8448eb211c80319d-b7ad6b7169203333-01"}


def test_triton_registers_without_importing_the_clients():
    """``import pytriton.triton`` stays free of tritonclient: the registry is a module of its own."""
    code = "import sys, pytriton.triton; print('tritonclient' in sys.modules, 'pytriton.pipeline' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert completed.stdout.split() == ["False", "False"], completed.stderr[-2000:]


def _chained(chain):
    return Request({}, {pipeline.CHAIN_PARAMETER: chain})


def test_a_call_back_into_a_model_on_the_chain_is_refused_before_anything_is_sent(registered):
    """Issue 42 item 6: A -> A and A -> B -> A would wait forever for a request queued behind themselves."""
    from pytriton.proxy.types import CURRENT_MODEL

    client = FakeInprocessClient()
    registered(FakeTriton(["A", "B", "C"], embedded=True, client=client))
    token = CURRENT_MODEL.set("A")
    try:
        with pytest.raises(pipeline.PipelineCycleError, match="A -> A"):
            pipeline.model("A").infer_sample(np.array([1.0], np.float32))  # outside any batch: the caller alone
        batch = CURRENT_BATCH.set([Request({}), _chained("B")])  # a batch mixing a fresh and a chained request
        try:
            with pytest.raises(pipeline.PipelineCycleError, match="B -> A -> B"):
                pipeline.model("B").infer_sample(np.array([1.0], np.float32))
            pipeline.model("C").infer_sample(np.array([1.0], np.float32))  # not on the chain: sent, chain extended
        finally:
            CURRENT_BATCH.reset(batch)
    finally:
        CURRENT_MODEL.reset(token)
    assert client.calls == [("sample", (np.array([1.0], np.float32),), {"parameters": {"pytriton_pipeline": "B/A"}})]


def test_a_chain_past_max_hops_is_refused_and_outside_a_callable_nothing_is_added():
    deep = pipeline._Outer([_chained("/".join(f"m{index}" for index in range(pipeline.MAX_HOPS)))])
    with pytest.raises(pipeline.PipelineCycleError, match="MAX_HOPS"):
        deep.check("other")
    shallow = pipeline._Outer([_chained("m0/m1")])
    shallow.check("other")
    assert shallow.parameters() == {pipeline.CHAIN_PARAMETER: "m0/m1"}
    assert pipeline._Outer(None).parameters() is None  # a plain client call carries no chain


def test_the_grpc_request_carries_the_chain(registered):
    import tritonclient.grpc as grpcclient

    from pytriton.proxy.types import CURRENT_MODEL

    registered(FakeTriton(["B"]))
    handle = pipeline.model("B")
    arrays, _ = handle._arrays([np.array([1.5], np.float32)], {}, False, None)
    token = CURRENT_MODEL.set("A")
    try:
        request = handle._request(grpcclient, arrays, pipeline._Outer([Request({})]))
    finally:
        CURRENT_MODEL.reset(token)
    assert request["parameters"] == {pipeline.CHAIN_PARAMETER: "A"}
