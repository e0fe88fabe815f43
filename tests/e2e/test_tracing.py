"""OpenTelemetry tracing through a live server: Triton's spans continue in the user's process.

One server in OpenTelemetry trace mode, exporting to a small OTLP/HTTP receiver started here
(Triton 2.51 posts OTLP as JSON to ``/v1/traces``), with tracing off server-wide (``level=OFF``)
and switched on for one model by ``bind(..., trace_config=...)`` (sent through the restricted
``trace`` endpoint with pytriton's access token). The user's process exports its spans to an
in-memory exporter; a backend instance's stub (tests/e2e/_kinds.py) to a file (``Traced`` in
tests/e2e/kind_models.py). For each instance kind the tests check the chain client ->
``InferRequest`` -> model span (Triton's) -> ``proxy_inference_callable`` -> ``batch`` and the
user's own span (pytriton's), that a server restarted after a crash traces the model again, and
that a model bound again under the same name without ``trace_config`` is no longer traced.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import pathlib
import signal
import threading
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest

from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy import _tracing
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports, wait_for
from tests.e2e._kinds import KINDS, model
from tests.e2e.kind_models import SPANS_FILE, Traced, span_record, untraced
from tests.otel_memory import memory_exporter

CLIENT_TRACE_IDS = {"thread": "0af7651916cd43dd8448eb211c80319c", "backend": "0af7651916cd43dd8448eb211c80319d"}
CLIENT_SPAN_ID = "b7ad6b7169203331"
EXPORTED = {"StubExported": "backend", "WorkerExported": "process"}  # model name -> instance kind
EXPORTED_TRACE_IDS = {
    "StubExported": "0af7651916cd43dd8448eb211c80319e",
    "WorkerExported": "0af7651916cd43dd8448eb211c80319f",
}


def _protobuf_spans(body: bytes) -> List[Dict[str, Any]]:
    """OTLP/HTTP protobuf spans in the JSON shape Triton posts (hex ids), with the service name."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(body)
    found = []
    for resource in request.resource_spans:
        service = {a.key: a.value.string_value for a in resource.resource.attributes}.get("service.name")
        for scope in resource.scope_spans:
            for span in scope.spans:
                found.append(
                    {"name": span.name, "traceId": span.trace_id.hex(), "spanId": span.span_id.hex(),
                     "parentSpanId": span.parent_span_id.hex(), "service": service}
                )  # fmt: skip
    return found


class _Receiver(http.server.BaseHTTPRequestHandler):
    """Collects the spans Triton exports (OTLP/HTTP with a JSON body)."""

    spans: List[Dict[str, Any]] = []
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Type") == "application/x-protobuf":  # the OTLP exporter of a stub
            found = _protobuf_spans(body)
        else:
            try:
                document = json.loads(body)
            except ValueError:
                document = {}
            found = [
                span
                for resource in document.get("resourceSpans", [])
                for scope in resource.get("scopeSpans", [])
                for span in scope.get("spans", [])
            ]
        with self.lock:
            type(self).spans.extend(found)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


TENSORS = ([Tensor(name="k", shape=(1,), dtype=np.int32)], [Tensor(name="y", shape=(1,), dtype=np.int32)])


class Server:
    """The module's server and where the spans of each instance kind's callables end up."""

    def __init__(self, port: int, triton: Triton, exporter: Any, notes: Dict[str, pathlib.Path]):
        self.port, self.triton, self.exporter, self.notes = port, triton, exporter, notes

    def spans(self, kind: str) -> List[Dict[str, Any]]:
        """The finished spans (``span_record``) of the process where instances of ``kind`` run."""
        if kind == "thread":
            return [span_record(span) for span in self.exporter.get_finished_spans()]
        path = self.notes[kind] / SPANS_FILE
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def clear(self, kind: str) -> None:
        if kind == "thread":
            self.exporter.clear()
        else:
            (self.notes[kind] / SPANS_FILE).write_text("")


def _named(spans: List[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    named: Dict[str, List[Dict[str, Any]]] = {}
    for span in spans:
        named.setdefault(span["name"], []).append(span)
    return named


@pytest.fixture(scope="module")
def server(receiver, tmp_path_factory):
    exporter = memory_exporter()
    ports = triton_ports()
    config = TritonConfig(
        **ports,
        trace_config=[
            "mode=opentelemetry",
            "level=OFF",  # nothing is traced unless a model asks
            f"opentelemetry,url=http://127.0.0.1:{receiver}/v1/traces",
            "opentelemetry,bsp_schedule_delay=50",  # export within 50 ms (default 5 s)
        ],
    )
    notes = {kind: tmp_path_factory.mktemp(f"spans-{kind}") for kind in KINDS}
    # The stubs inherit it: a backend stub that exports pytriton's spans itself does so within 100 ms.
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"
    with Triton(config=config) as triton:
        for kind in KINDS:  # each instance kind (tests/e2e/_kinds.py)
            triton.bind(
                model("Traced", kind),
                Traced(str(notes[kind])),
                *TENSORS,
                config=ModelConfig(max_batch_size=4),
                trace_config=["level=TIMESTAMPS", "rate=1"],
                instance_kind=kind,
            )
            triton.bind(
                model("Untraced", kind), untraced, *TENSORS, config=ModelConfig(max_batch_size=4), instance_kind=kind
            )
        # A callable that sets up no OpenTelemetry of its own, in a process of its own: the stub (a
        # backend instance) or the worker process (a process instance) exports where Triton does.
        for name, kind in EXPORTED.items():
            triton.bind(
                name,
                untraced,
                *TENSORS,
                config=ModelConfig(max_batch_size=4),
                trace_config=["level=TIMESTAMPS", "rate=1"],
                instance_kind=kind,
            )
        triton.run()
        yield Server(ports["http_port"], triton, exporter, notes)
    os.environ.pop("OTEL_BSP_SCHEDULE_DELAY", None)
    exporter.shutdown()


def _infer(port: int, model: str, headers: Dict[str, str]) -> None:
    body = json.dumps({"inputs": [{"name": "k", "shape": [1, 1], "datatype": "INT32", "data": [21]}]})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(
            "POST", f"/v2/models/{model}/infer", body=body, headers={"Content-Type": "application/json", **headers}
        )
        response = connection.getresponse()
        answer = json.loads(response.read())
    finally:
        connection.close()
    assert response.status == 200 and answer["outputs"][0]["data"] == [42], answer


def _triton_spans(trace_id: str) -> Dict[str, Dict[str, Any]]:
    with _Receiver.lock:
        return {span["name"]: span for span in _Receiver.spans if span["traceId"] == trace_id}


def test_the_users_span_continues_the_clients_trace_through_triton(server, kind):
    trace_id = CLIENT_TRACE_IDS[kind]
    traced = model("Traced", kind)
    _infer(server.port, traced, {"traceparent": f"00-{trace_id}-{CLIENT_SPAN_ID}-01"})
    assert wait_for(lambda: any(span["trace_id"] == trace_id for span in server.spans(kind)), 10)
    mine = _named([span for span in server.spans(kind) if span["trace_id"] == trace_id])
    (proxy,), (work,), (batched,) = mine[_tracing.REQUEST_SPAN], mine["user_work"], mine[_tracing.BATCH_SPAN]
    assert work["parent_span_id"] == proxy["span_id"] and batched["parent_span_id"] == proxy["span_id"]
    # Triton's side of the same trace, as it exported it.
    assert wait_for(lambda: {"InferRequest", traced} <= set(_triton_spans(trace_id)), 10)
    theirs = _triton_spans(trace_id)
    assert theirs["InferRequest"]["parentSpanId"] == CLIENT_SPAN_ID
    assert theirs[traced]["parentSpanId"] == theirs["InferRequest"]["spanId"]
    assert proxy["parent_span_id"] == theirs[traced]["spanId"]  # the proxy's span hangs off Triton's
    assert proxy["model_name"] == traced


def test_tritons_own_trace_id_reaches_the_user_and_untraced_models_stay_untraced(server, kind):
    traced = model("Traced", kind)
    server.clear(kind)
    _infer(server.port, model("Untraced", kind), {})
    _infer(server.port, traced, {})
    assert wait_for(lambda: _named(server.spans(kind)).get(_tracing.REQUEST_SPAN), 10)
    (proxy,) = _named(server.spans(kind))[_tracing.REQUEST_SPAN]  # none for "Untraced"
    assert proxy["model_name"] == traced
    trace_id = proxy["trace_id"]
    assert trace_id not in CLIENT_TRACE_IDS.values()
    assert wait_for(lambda: traced in _triton_spans(trace_id), 10)
    assert _triton_spans(trace_id)[traced]["spanId"] == proxy["parent_span_id"]
    with _Receiver.lock:
        assert not [span for span in _Receiver.spans if span["name"] == model("Untraced", kind)]


@pytest.mark.parametrize("name", list(EXPORTED))
def test_a_stub_or_worker_exports_its_spans_where_triton_exports_when_nothing_else_is_configured(server, name):
    """``TritonConfig.trace_config``'s collector reaches the stub with the payload (``_backend_kind.pack``)
    and the worker process with its start message (``_control.Start``)."""
    trace_id = EXPORTED_TRACE_IDS[name]
    _infer(server.port, name, {"traceparent": f"00-{trace_id}-{CLIENT_SPAN_ID}-01"})
    assert wait_for(lambda: {_tracing.REQUEST_SPAN, name} <= set(_triton_spans(trace_id)), 20)
    spans = _triton_spans(trace_id)
    proxy = spans[_tracing.REQUEST_SPAN]
    assert proxy["service"] == "pytriton" and proxy["parentSpanId"] == spans[name]["spanId"]


def test_a_restarted_server_gets_the_model_trace_settings_again(server):
    os.kill(server.triton._backend.server.pid, signal.SIGKILL)
    # The restart counts once the new server is ready, its models loaded and their settings sent.
    assert wait_for(lambda: server.triton.server_restarts == 1, 60), "the server was not restarted"
    for kind in KINDS:
        server.clear(kind)
        _infer(server.port, model("Traced", kind), {})
        assert wait_for(lambda kind=kind: _named(server.spans(kind)).get(_tracing.REQUEST_SPAN), 10), kind
        assert len(_named(server.spans(kind))[_tracing.REQUEST_SPAN]) == 1, kind


def test_a_model_bound_again_without_trace_config_is_not_traced(server, kind):
    traced = model("Traced", kind)
    server.triton.unbind(traced)
    # The same callable (for a backend instance, it sets up its stub's span export again).
    callable_ = Traced(str(server.notes[kind]))
    server.triton.bind(traced, callable_, *TENSORS, config=ModelConfig(max_batch_size=4), instance_kind=kind)
    server.clear(kind)
    _infer(server.port, traced, {})
    # The proxy's span ends before the reply leaves the callable's process: none means none was opened
    # (Triton keeps a model's trace settings across an unload; unbind cleared them).
    assert not server.spans(kind)
