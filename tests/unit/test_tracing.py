"""Tracing without a server: the stub's trace field, the worker's spans, ``@batch``'s span, settings.

Spans go to an in-memory exporter on the global tracer provider (tests/otel_memory.py). The stub
runs against the fake ``triton_python_backend_utils`` of test_stub.py, with requests that carry a
trace context as Triton's ``request.trace().get_context()`` gives it; the worker is driven over its
real Unix socket. The no-op path is checked with ``opentelemetry`` made unimportable.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import os
import secrets
import socket
import sys
import threading
import types

import numpy as np
import pytest

from pytriton.decorators import batch
from pytriton.exceptions import PyTritonBadParameterError, PyTritonServerError, PyTritonValidationError
from pytriton.model_config.tensor import Tensor
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy import _tracing
from pytriton.proxy._binding import _resolve_tensors
from pytriton.proxy._worker import InstanceWorker
from pytriton.proxy.stubside import _messages, _stub_trace, _tensors, _wire
from pytriton.proxy.types import Request
from tests.conftest import shm_entries
from tests.otel_memory import by_name, memory_exporter
from tests.unit.test_stub import TIMEOUT_S, FakeRequest, setup, stub  # noqa: F401  (fixtures)

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
TRITON_SPAN_ID = 0xB7AD6B7169203331  # Triton's model span, the parent of the proxy's span
TRACEPARENT = f"00-{TRACE_ID:032x}-{TRITON_SPAN_ID:016x}-01"
CONTEXT = json.dumps({"traceparent": TRACEPARENT})  # what get_context() returns
OTHER_TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
OTHER_CONTEXT = json.dumps({"traceparent": f"00-{OTHER_TRACE_ID:032x}-00f067aa0ba902b7-01", "tracestate": "k=v"})


@pytest.fixture(scope="module")
def exporter():
    exporter = memory_exporter()
    yield exporter
    exporter.shutdown()


@pytest.fixture()
def spans(exporter):
    exporter.clear()
    _tracing._reset()
    yield exporter
    exporter.clear()


class FakeTrace:
    def __init__(self, context):
        self._context = context

    def get_context(self):
        return self._context


class TracedRequest(FakeRequest):
    """A request as the Python backend hands it over when Triton traces it (context None: not sampled)."""

    def __init__(self, inputs, context, **kwargs):
        super().__init__(inputs, **kwargs)
        self._context = context
        self.trace_calls = 0

    def trace(self):
        self.trace_calls += 1
        return FakeTrace(self._context)


# -- the wire field -------------------------------------------------------------------------------


def test_infer_messages_carry_the_trace_field_only_when_given():
    assert _messages.Infer(None, []).trace is None
    assert _messages.Infer(None, []).encode() == (_messages.INFER, None, [], None)
    traced = _messages.Infer(None, [], (123, [CONTEXT, None]))
    assert traced.trace == (123, [CONTEXT, None])
    assert _messages.decode(traced.encode()) == traced


# -- the stub side --------------------------------------------------------------------------------


def test_collect_returns_none_unless_a_request_is_traced():
    assert _stub_trace.collect([TracedRequest({}, None), TracedRequest({}, "")]) is None

    class NoTraces(FakeRequest):
        def trace(self):
            raise AttributeError("an old backend")

    started, contexts = _stub_trace.collect([NoTraces({}), TracedRequest({}, CONTEXT)])
    assert contexts == [None, CONTEXT] and started > 0


def _run_batch(setup, pool, requests, **private):  # noqa: F811
    worker = setup.worker()
    model = setup.model(**private)
    channel = worker.channel()
    future = pool.submit(model.execute, requests)
    message = channel.recv()
    segment, results = _tensors.write_tensors(None, [[("y", np.array([[1]], np.int32))]] * len(requests))
    channel.send(_messages.Ok(segment, results))
    assert all(response.error is None for response in future.result(TIMEOUT_S))
    return message


def test_the_stub_forwards_trace_contexts_when_the_server_traces(setup, pool):  # noqa: F811
    requests = [
        TracedRequest({"x": np.array([[1]], np.int32)}, CONTEXT),
        TracedRequest({"x": np.array([[2]], np.int32)}, None),
    ]
    message = _run_batch(setup, pool, requests, trace=True)
    started, contexts = message.trace
    assert contexts == [CONTEXT, None]
    assert abs(started / 1e9 - __import__("time").time()) < 60


def test_the_stub_sends_no_field_for_an_untraced_batch(setup, pool):  # noqa: F811
    requests = [TracedRequest({"x": np.array([[1]], np.int32)}, None)]
    assert _run_batch(setup, pool, requests, trace=True).trace is None


def test_the_stub_never_asks_for_traces_when_the_server_does_not_trace(setup, pool):  # noqa: F811
    requests = [TracedRequest({"x": np.array([[1]], np.int32)}, CONTEXT)]
    message = _run_batch(setup, pool, requests)  # no "trace" in the private file: an older binding too
    assert message.trace is None and requests[0].trace_calls == 0


@pytest.fixture()
def pool():
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as executor:
        yield executor


# -- the worker's spans ---------------------------------------------------------------------------


def _config(decoupled=False):
    return TritonModelConfig(
        model_name="Traced",
        model_version=2,
        batching=True,
        max_batch_size=4,
        decoupled=decoupled,
        inputs=_resolve_tensors([Tensor(name="k", shape=(1,), dtype=np.int32)], "INPUT", "Traced"),
        outputs=_resolve_tensors([Tensor(name="y", shape=(1,), dtype=np.int32)], "OUTPUT", "Traced"),
    )


@pytest.fixture()
def make_worker(tmp_path):
    workers = []
    prefix = f"pytriton-{os.getpid()}-trace{secrets.token_hex(3)}"

    def make(func, decoupled=False):
        worker = InstanceWorker(
            path=str(tmp_path / f"slot-{len(workers)}.sock"),
            infer_func=func,
            config=_config(decoupled),
            strict=False,
            shm_prefix=prefix,
            on_unrecoverable=lambda exc: None,
            name=f"Traced-{len(workers)}",
        )
        worker.start()
        workers.append(worker)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT_S)
        sock.connect(worker._path)
        channel = _wire.SocketChannel(sock)
        channel.send(_messages.Hello(os.getpid(), 0))
        assert type(channel.recv()) is _messages.Welcome
        workers.append(sock)
        return channel

    yield make
    for item in workers:
        if isinstance(item, socket.socket):
            item.close()
        else:
            item.stop()
    assert not shm_entries(prefix)


def _infer(channel, values, trace=None):
    segment, metas = _tensors.write_tensors(None, [[("k", np.array([[value]], np.int32))] for value in values])
    channel.send(_messages.Infer(segment, [_messages.Entry(meta) for meta in metas], trace))
    return channel.recv()


def _identity(requests):
    return [{"y": request["k"]} for request in requests]


def test_a_traced_request_gets_a_span_that_is_a_child_of_tritons(spans, make_worker):
    seen = []

    def infer(requests):
        seen.extend(request.span for request in requests)
        with requests[0].traced_span("inner") as inner:
            assert inner is not None and inner.is_recording()
        with requests[1].traced_span("nothing") as nothing:  # untraced request: a no-op
            assert nothing is None
        return _identity(requests)

    channel = make_worker(infer)
    started_ns = __import__("time").time_ns() - 5_000_000  # the stub received the batch 5 ms ago
    reply = _infer(channel, [1, 2, 3], (started_ns, [CONTEXT, None, OTHER_CONTEXT]))
    assert type(reply) is _messages.Ok
    assert seen[1] is None and seen[0] is not None and seen[2] is not None
    named = by_name(spans.get_finished_spans())
    assert sorted(named) == ["inner", _tracing.REQUEST_SPAN]
    first, second = sorted(named[_tracing.REQUEST_SPAN], key=lambda span: span.context.trace_id != TRACE_ID)
    # Triton's span -> the proxy's span -> the user's span.
    assert first.context.trace_id == TRACE_ID and first.parent.span_id == TRITON_SPAN_ID and first.parent.is_remote
    assert second.context.trace_id == OTHER_TRACE_ID and second.parent.span_id == 0x00F067AA0BA902B7
    assert second.context.trace_state.get("k") == "v"  # tracestate travels too
    (inner,) = named["inner"]
    assert inner.parent.span_id == first.context.span_id and inner.context.trace_id == TRACE_ID
    assert first.start_time == started_ns and first.end_time >= inner.end_time
    assert [event.name for event in first.events] == ["inputs_ready"]
    assert first.attributes["pytriton.model_name"] == "Traced" and first.attributes["pytriton.model_version"] == 2
    assert first.attributes["pytriton.batch.requests"] == 3
    assert first.status.is_unset


def test_a_failed_batch_marks_its_spans_as_errors(spans, make_worker):
    def infer(requests):
        raise ValueError("broken input")

    channel = make_worker(infer)
    reply = _infer(channel, [1], (1, [CONTEXT]))
    assert type(reply) is _messages.Error
    (span,) = spans.get_finished_spans()
    assert not span.status.is_ok and span.status.description == "ValueError: broken input"


def test_a_streamed_batch_ends_its_spans_after_the_last_chunk(spans, make_worker):
    def infer(requests):
        for step in range(3):
            assert not spans.get_finished_spans()  # still open while the stream runs
            yield [{"y": np.array([[step]], np.int32)} for _ in requests]

    channel = make_worker(infer, decoupled=True)
    reply = _infer(channel, [1], (1, [CONTEXT]))
    kinds = [reply.KIND]
    for _ in range(10):
        if kinds[-1] != _messages.CHUNK:
            break
        kinds.append(channel.recv().KIND)
    assert kinds == [_messages.CHUNK] * 3 + [_messages.END]
    assert [span.name for span in spans.get_finished_spans()] == [_tracing.REQUEST_SPAN]


def test_an_untraced_batch_opens_no_span(spans, make_worker):
    seen = []

    def infer(requests):
        seen.extend(request.span for request in requests)
        return _identity(requests)

    channel = make_worker(infer)
    assert type(_infer(channel, [1, 2])) is _messages.Ok
    assert seen == [None, None] and not spans.get_finished_spans()


# -- @batch ---------------------------------------------------------------------------------------


def _traced_requests(spans, contexts):
    """Requests as the worker hands them over, with their spans opened by ``_tracing.start_spans``."""
    requests = [Request({"k": np.array([[index]], np.int32)}) for index in range(len(contexts))]
    opened = _tracing.start_spans((1, contexts), requests, "Traced", 1)
    return requests, opened


def test_batch_opens_a_child_span_of_every_traced_request(spans):
    from opentelemetry import trace

    current = []

    @batch
    def infer(k):
        current.append(trace.get_current_span())
        return {"y": k}

    requests, opened = _traced_requests(spans, [CONTEXT, None, OTHER_CONTEXT])
    assert [len(out["y"]) for out in infer(requests)] == [1, 1, 1]
    _tracing.end_spans(opened, _messages.Ok(None, []))
    named = by_name(spans.get_finished_spans())
    batch_spans = named[_tracing.BATCH_SPAN]
    assert sorted(span.parent.span_id for span in batch_spans) == sorted(
        request.span.get_span_context().span_id for request in requests if request.span is not None
    )
    assert all(span.attributes["pytriton.batch.requests"] == 3 for span in batch_spans)
    # While the function runs, the first request's batch span is the current one.
    assert current[0].get_span_context().span_id in {span.context.span_id for span in batch_spans}
    assert current[0].get_span_context().trace_id == TRACE_ID


def test_batch_spans_cover_a_generator_until_it_ends_and_record_errors(spans):
    @batch
    def stream(k):
        yield {"y": k}
        yield {"y": k + 1}

    requests, opened = _traced_requests(spans, [CONTEXT])
    generator = stream(requests)
    next(generator)
    assert not by_name(spans.get_finished_spans()).get(_tracing.BATCH_SPAN)
    assert len(list(generator)) == 1
    assert len(by_name(spans.get_finished_spans())[_tracing.BATCH_SPAN]) == 1

    @batch
    def failing(k):
        raise RuntimeError("boom")

    spans.clear()
    with pytest.raises(RuntimeError):
        failing(requests)
    (failed,) = by_name(spans.get_finished_spans())[_tracing.BATCH_SPAN]
    assert failed.status.description == "RuntimeError: boom" and failed.events[0].name == "exception"

    @batch
    async def coroutine(k):
        assert not by_name(spans.get_finished_spans()).get(_tracing.BATCH_SPAN)
        return {"y": k}

    spans.clear()
    assert asyncio.run(coroutine(requests))[0]["y"].tolist() == [[0]]
    assert len(by_name(spans.get_finished_spans())[_tracing.BATCH_SPAN]) == 1
    _tracing.end_spans(opened, None)


def test_batch_spans_of_a_stream_that_fails_or_is_closed_early(spans):
    @batch
    def failing_stream(k):
        yield {"y": k}
        raise RuntimeError("mid-stream")

    @batch
    def endless(k):
        while True:
            yield {"y": k}

    @batch
    async def async_failing(k):
        yield {"y": k}
        raise ValueError("async mid-stream")

    requests, opened = _traced_requests(spans, [CONTEXT])
    generator = failing_stream(requests)
    next(generator)
    with pytest.raises(RuntimeError):
        next(generator)
    (failed,) = by_name(spans.get_finished_spans())[_tracing.BATCH_SPAN]
    assert failed.status.description == "RuntimeError: mid-stream"

    spans.clear()
    generator = endless(requests)
    next(generator)
    generator.close()  # a cancelled stream: the span ends, not as an error
    (closed,) = by_name(spans.get_finished_spans())[_tracing.BATCH_SPAN]
    assert closed.status.description is None and not closed.events

    async def drain_async():
        chunks = []
        with pytest.raises(ValueError):
            async for chunk in async_failing(requests):
                chunks.append(chunk)
        return chunks

    spans.clear()
    assert len(asyncio.run(drain_async())) == 1
    (failed_async,) = by_name(spans.get_finished_spans())[_tracing.BATCH_SPAN]
    assert failed_async.status.description == "ValueError: async mid-stream"
    _tracing.end_spans(opened, None)


def test_batch_with_plain_dict_requests_and_no_spans_is_unchanged(spans):
    @batch
    def infer(k):
        return {"y": k * 2}

    _tracing.State.seen = True  # even once traced batches were seen
    assert infer([{"k": np.array([[3]])}])[0]["y"].tolist() == [[6]]
    assert not spans.get_finished_spans()


# -- without OpenTelemetry ------------------------------------------------------------------------


@pytest.fixture()
def no_opentelemetry(monkeypatch):
    """``import opentelemetry`` fails, as where the extra is not installed."""
    for name in list(sys.modules):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    _tracing._reset()
    yield
    _tracing._reset()


def test_without_opentelemetry_everything_is_a_no_op(no_opentelemetry, caplog):
    with pytest.raises(ImportError):
        import opentelemetry.trace  # noqa: F401
    requests = [Request({"k": np.array([[1]], np.int32)})]
    with caplog.at_level(logging.WARNING, logger="pytriton.proxy._tracing"):
        assert _tracing.start_spans((1, [CONTEXT]), requests, "Traced", 1) is None
        assert _tracing.start_spans((1, [CONTEXT]), requests, "Traced", 1) is None
    assert len([r for r in caplog.records if "pytriton[tracing]" in r.getMessage()]) == 1  # said once
    assert requests[0].span is None
    with requests[0].traced_span("anything") as span:
        assert span is None

    @batch
    def infer(k):
        return {"y": k}

    assert infer(requests)[0]["y"].tolist() == [[1]]
    _tracing.end_spans(None, None)


def test_a_worker_serves_traced_batches_without_opentelemetry(no_opentelemetry, make_worker):
    seen = []

    def infer(requests):
        seen.append(requests[0].span)
        with requests[0].traced_span("x"):
            return _identity(requests)

    channel = make_worker(infer)
    assert _infer(channel, [4], (1, [CONTEXT])).KIND == _messages.OK
    assert seen == [None]


# -- settings -------------------------------------------------------------------------------------


def test_enabled_reads_the_mode_from_the_server_trace_config():
    assert _tracing.enabled(["rate=1", "mode=opentelemetry"]) and _tracing.enabled([" mode = OpenTelemetry"])
    assert not _tracing.enabled(None) and not _tracing.enabled(["mode=triton", "opentelemetry,url=x"])


def test_model_settings_become_tritons_per_model_body():
    body = _tracing.model_settings(["level=TIMESTAMPS", "level=tensors", "rate=1", "count=-1"], "m")
    assert body == {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1", "trace_count": "-1"}
    for bad, match in [
        ("rate=1", "list of"),
        (["mode=opentelemetry"], "server-wide"),
        (["opentelemetry,url=http://x"], "server-wide"),
        (["file=/tmp/x"], "unknown setting"),
        (["level=LOUD"], "level must be"),
        (["rate=0"], "rate must be"),
        (["count=-2"], "count must be"),
        (["rate"], "setting=value"),
        ([], "empty"),
    ]:
        with pytest.raises(PyTritonBadParameterError, match=match):
            _tracing.model_settings(bad, "m")


def test_bind_trace_config_needs_a_server_in_opentelemetry_mode(tmp_path):
    from pytriton.triton import Triton, TritonConfig, TritonLifecyclePolicy

    # No server: the context must not start one (a unit test), so the policy leaves that to run().
    offline = TritonLifecyclePolicy(launch_triton_on_startup=False)
    inputs, outputs = [Tensor(name="k", shape=(1,), dtype=np.int32)], [Tensor(name="y", shape=(1,), dtype=np.int32)]
    with Triton(workspace=tmp_path / "a", triton_lifecycle_policy=offline) as triton:
        with pytest.raises(PyTritonValidationError, match="mode=opentelemetry"):
            triton.bind("m", _identity, inputs, outputs, trace_config=["rate=1"])
    config = TritonConfig(trace_config=["mode=opentelemetry"])
    with Triton(config=config, workspace=tmp_path / "b", triton_lifecycle_policy=offline) as triton:
        triton.bind("m", _identity, inputs, outputs, trace_config=["rate=1"])
        triton.bind("plain", _identity, inputs, outputs)
        with pytest.raises(PyTritonValidationError, match="same trace_config"):
            triton.bind("m", _identity, inputs, outputs, model_version=2, trace_config=["rate=2"])
        assert triton._traces.by_name == {"m": {"trace_rate": "1"}}
        # The stubs of a tracing server forward trace contexts.
        assert all(model._private["trace"] for model in triton._models.values())
    with Triton(workspace=tmp_path / "c", triton_lifecycle_policy=offline) as triton:
        triton.bind("plain", _identity, inputs, outputs)
        assert not triton._models[("plain", 1)]._private["trace"]


class _FakeTritonTraceApi(http.server.BaseHTTPRequestHandler):
    calls: list = []
    status = 200

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).calls.append((self.path, self.headers.get("triton-access-token"), json.loads(body)))
        payload = b'{"error":"refused"}' if self.status != 200 else b"{}"
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_model_settings_are_posted_with_the_access_token():
    from pytriton.server.security import AccessPolicy, TritonSecurityConfig
    from pytriton.server.triton_config import TritonConfig

    access = AccessPolicy(TritonConfig(), TritonSecurityConfig(access_token="secret"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeTritonTraceApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = ("127.0.0.1", server.server_address[1])
    try:
        _tracing.send_model_settings(endpoint, ("127.0.0.1", 1), access, "m", {"trace_rate": "1"}, TIMEOUT_S)
        assert _FakeTritonTraceApi.calls == [("/v2/models/m/trace/setting", "secret", {"trace_rate": "1"})]
        _FakeTritonTraceApi.status = 400
        with pytest.raises(PyTritonServerError, match="refused"):
            _tracing.send_model_settings(endpoint, ("127.0.0.1", 1), access, "m", {"trace_rate": "1"}, TIMEOUT_S)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT_S)


def test_model_settings_go_over_grpc_when_http_is_off(monkeypatch):
    from pytriton.server.security import AccessPolicy, TritonSecurityConfig
    from pytriton.server.triton_config import TritonConfig

    calls = []

    class FakeClient:
        def __init__(self, url):
            calls.append(url)

        def update_trace_settings(self, model_name, settings, headers):
            calls.append((model_name, settings, headers))

        def close(self):
            calls.append("closed")

    import tritonclient.grpc

    monkeypatch.setattr(tritonclient.grpc, "InferenceServerClient", FakeClient)
    access = AccessPolicy(TritonConfig(), TritonSecurityConfig(access_token="secret"))
    _tracing.send_model_settings(None, ("127.0.0.1", 8001), access, "m", {"trace_rate": "1"}, TIMEOUT_S)
    assert calls[0] == "127.0.0.1:8001" and calls[-1] == "closed"
    assert calls[1][:2] == ("m", {"trace_rate": "1"}) and "secret" in calls[1][2].values()


# -- exporting like NVIDIA PyTriton when the process configured nothing -------------------------


def test_configure_export_reads_the_collector_and_resources():
    _tracing.configure_export(
        ["mode=opentelemetry", "opentelemetry,resource=service.name=svc", "opentelemetry, url=http://c:1/v1/traces"]
    )
    assert _tracing.State.export_url == "http://c:1/v1/traces"
    assert _tracing.State.export_resource == {"service.name": "svc"}
    _tracing.configure_export(["mode=opentelemetry"])
    assert _tracing.State.export_url == _tracing.DEFAULT_COLLECTOR_URL and _tracing.State.export_resource == {}


def test_an_unconfigured_process_gets_an_exporting_provider_once(monkeypatch, caplog):
    from opentelemetry import trace

    built, installed = [], []
    fake_api = types.SimpleNamespace(
        ProxyTracerProvider=trace.ProxyTracerProvider,
        get_tracer_provider=lambda: trace.ProxyTracerProvider(),
        set_tracer_provider=installed.append,
    )
    monkeypatch.setattr(_tracing, "export_provider", lambda url, resource: built.append((url, resource)) or "provider")
    monkeypatch.setattr(_tracing.State, "export_url", "http://c:1/v1/traces")
    monkeypatch.setattr(_tracing.State, "export_resource", {"a": "b"})
    monkeypatch.setattr(_tracing.State, "export_checked", False)
    _tracing._ensure_export(fake_api)
    _tracing._ensure_export(fake_api)
    assert built == [("http://c:1/v1/traces", {"a": "b"})] and installed == ["provider"]

    # A process that set up its own provider keeps it.
    monkeypatch.setattr(_tracing.State, "export_checked", False)
    fake_api.get_tracer_provider = lambda: object()
    _tracing._ensure_export(fake_api)
    assert installed == ["provider"]

    # Without the OTLP exporter package: nothing is installed, and the log says how to export.
    monkeypatch.setattr(_tracing.State, "export_checked", False)
    fake_api.get_tracer_provider = lambda: trace.ProxyTracerProvider()
    monkeypatch.setattr(_tracing, "export_provider", lambda url, resource: None)
    with caplog.at_level(logging.INFO, logger="pytriton.proxy._tracing"):
        _tracing._ensure_export(fake_api)
    assert installed == ["provider"] and "opentelemetry-exporter-otlp-proto-http" in caplog.text


def test_export_provider_sends_to_the_collector_with_the_resources(monkeypatch):
    exported = []

    class FakeOTLPSpanExporter:
        def __init__(self, endpoint):
            self.endpoint = endpoint

        def export(self, spans):
            exported.append((self.endpoint, [span.name for span in spans]))
            return 0

        def shutdown(self):
            pass

        def force_flush(self, timeout_millis=None):
            return True

    leaf = types.ModuleType("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    leaf.OTLPSpanExporter = FakeOTLPSpanExporter
    for name in [
        "opentelemetry.exporter",
        "opentelemetry.exporter.otlp",
        "opentelemetry.exporter.otlp.proto",
        "opentelemetry.exporter.otlp.proto.http",
    ]:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, leaf.__name__, leaf)
    provider = _tracing.export_provider("http://c:1/v1/traces", {"service.name": "svc"})
    try:
        assert provider.resource.attributes["service.name"] == "svc"
        provider.get_tracer("t").start_span("s").end()
        provider.force_flush()
        assert exported == [("http://c:1/v1/traces", ["s"])]
    finally:
        provider.shutdown()
    monkeypatch.setitem(sys.modules, leaf.__name__, None)
    assert _tracing.export_provider("http://c:1/v1/traces", {}) is None
