"""OpenTelemetry tracing through a live server: Triton's spans continue in the user's process.

One server in OpenTelemetry trace mode, exporting to a small OTLP/HTTP receiver started here
(Triton 2.51 posts OTLP as JSON to ``/v1/traces``), with tracing off server-wide (``level=OFF``)
and switched on for one model by ``bind(..., trace_config=...)`` (sent through the restricted
``trace`` endpoint with pytriton's access token). The user's process exports its spans to an
in-memory exporter; the tests check the chain client -> ``InferRequest`` -> model span (Triton's)
-> ``proxy_inference_callable`` -> ``batch`` and the user's own span (pytriton's), and that a
server restarted after a crash traces the model again, and that a model bound again under the
same name without ``trace_config`` is no longer traced.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import signal
import threading
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy import _tracing
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports, wait_for
from tests.otel_memory import by_name, memory_exporter

CLIENT_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN_ID = "b7ad6b7169203331"


class _Receiver(http.server.BaseHTTPRequestHandler):
    """Collects the spans Triton exports (OTLP/HTTP with a JSON body)."""

    spans: List[Dict[str, Any]] = []
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
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


@batch
def _doubled(k):
    return {"y": k * 2}


def traced(requests):
    for request in requests:
        with request.traced_span("user_work"):
            pass
    return _doubled(requests)


def untraced(requests):
    return [{"y": request["k"] * 2} for request in requests]


@pytest.fixture(scope="module")
def server(receiver):
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
    tensors = ([Tensor(name="k", shape=(1,), dtype=np.int32)], [Tensor(name="y", shape=(1,), dtype=np.int32)])
    with Triton(config=config) as triton:
        triton.bind(
            "Traced",
            traced,
            *tensors,
            config=ModelConfig(max_batch_size=4),
            trace_config=["level=TIMESTAMPS", "rate=1"],
        )
        triton.bind("Untraced", untraced, *tensors, config=ModelConfig(max_batch_size=4))
        triton.run()
        yield ports["http_port"], exporter, triton
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


def test_the_users_span_continues_the_clients_trace_through_triton(server):
    port, exporter = server[:2]
    _infer(port, "Traced", {"traceparent": f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"})
    trace_id = int(CLIENT_TRACE_ID, 16)
    assert wait_for(lambda: any(span.context.trace_id == trace_id for span in exporter.get_finished_spans()), 10)
    mine = by_name([span for span in exporter.get_finished_spans() if span.context.trace_id == trace_id])
    (proxy,), (work,), (batched,) = mine[_tracing.REQUEST_SPAN], mine["user_work"], mine[_tracing.BATCH_SPAN]
    assert work.parent.span_id == proxy.context.span_id and batched.parent.span_id == proxy.context.span_id
    # Triton's side of the same trace, as it exported it.
    assert wait_for(lambda: {"InferRequest", "Traced"} <= set(_triton_spans(CLIENT_TRACE_ID)), 10)
    theirs = _triton_spans(CLIENT_TRACE_ID)
    assert theirs["InferRequest"]["parentSpanId"] == CLIENT_SPAN_ID
    assert theirs["Traced"]["parentSpanId"] == theirs["InferRequest"]["spanId"]
    assert f"{proxy.parent.span_id:016x}" == theirs["Traced"]["spanId"]  # the proxy's span hangs off Triton's
    assert proxy.attributes["pytriton.model_name"] == "Traced"


def test_tritons_own_trace_id_reaches_the_user_and_untraced_models_stay_untraced(server):
    port, exporter = server[:2]
    exporter.clear()
    _infer(port, "Untraced", {})
    _infer(port, "Traced", {})
    assert wait_for(lambda: by_name(exporter.get_finished_spans()).get(_tracing.REQUEST_SPAN), 10)
    (proxy,) = by_name(exporter.get_finished_spans())[_tracing.REQUEST_SPAN]  # none for "Untraced"
    assert proxy.attributes["pytriton.model_name"] == "Traced"
    trace_id = f"{proxy.context.trace_id:032x}"
    assert trace_id != CLIENT_TRACE_ID
    assert wait_for(lambda: "Traced" in _triton_spans(trace_id), 10)
    assert _triton_spans(trace_id)["Traced"]["spanId"] == f"{proxy.parent.span_id:016x}"
    with _Receiver.lock:
        assert not [span for span in _Receiver.spans if span["name"] == "Untraced"]


def test_a_restarted_server_gets_the_model_trace_settings_again(server):
    port, exporter, triton = server
    os.kill(triton._backend.server.pid, signal.SIGKILL)
    # The restart counts once the new server is ready, its models loaded and their settings sent.
    assert wait_for(lambda: triton.server_restarts == 1, 60), "the server was not restarted"
    exporter.clear()
    _infer(port, "Traced", {})
    assert [span.name for span in exporter.get_finished_spans()].count(_tracing.REQUEST_SPAN) == 1


def test_a_model_bound_again_without_trace_config_is_not_traced(server):
    port, exporter = server[:2]
    triton = server[2]
    triton.unbind("Traced")
    tensors = ([Tensor(name="k", shape=(1,), dtype=np.int32)], [Tensor(name="y", shape=(1,), dtype=np.int32)])
    triton.bind("Traced", untraced, *tensors, config=ModelConfig(max_batch_size=4))
    exporter.clear()
    _infer(port, "Traced", {})
    # The proxy's span ends before the reply leaves the user's process: none means none was opened
    # (Triton keeps a model's trace settings across an unload; unbind cleared them).
    assert not exporter.get_finished_spans()
