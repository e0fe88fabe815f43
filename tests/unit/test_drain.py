"""pytriton/server/_drain.py: the drain's phases, the admission budget, metrics parsing, the exit-timeout flag."""

from __future__ import annotations

import http.server
import threading
import time
import types

from pytriton._serving import supervisor as _supervisor
from pytriton.proxy.stubside import _messages
from pytriton.server import _drain


class FakeModel:
    def __init__(self, name, version=1):
        self.name, self.version, self.admission = name, version, None

    def refuse_new(self, admission):
        self.admission = admission


def test_admission_admits_the_queued_requests_then_refuses():
    admission = _drain.Admission(3)
    assert admission.admit(2) and admission.admit(2)  # a batch straddling the end runs whole
    assert not admission.admit(1)
    assert not _drain.Admission(0).admit(1)


def test_drain_waits_the_delay_then_arms_refusal_with_the_queue_then_waits_for_in_flight():
    models = [FakeModel("A"), FakeModel("B", 2)]
    calls = []

    def wait_detached(deadline):
        calls.append(("wait", [model.admission is not None for model in models]))
        return True

    started = time.monotonic()
    result = _drain.drain(
        started + 5, 0.2, lambda: models, wait_detached, alive=lambda: True, pending=lambda: {("A", "1"): 2}
    )
    assert result is True and time.monotonic() - started >= 0.2
    assert calls == [("wait", [True, True])]
    assert models[0].admission.admit(2) and not models[0].admission.admit(1)
    assert not models[1].admission.admit(1)  # nothing queued for B: refused at once


def test_drain_delay_is_cut_short_by_a_dead_server_and_by_the_deadline():
    started = time.monotonic()
    _drain.drain(started + 5, 5.0, list, lambda deadline: False, alive=lambda: False)
    _drain.drain(started + 0.1, 5.0, list, lambda deadline: False, alive=lambda: True)
    assert time.monotonic() - started < 2.0


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = b""

    def do_GET(self):
        body = _Handler.body if self.path == "/metrics" else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_pending_requests_and_held_connection_against_a_local_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        _Handler.body = (
            b"# HELP nv_inference_pending_request_count x\n"
            b'nv_inference_pending_request_count{model="Gate",version="1"} 30\n'
            b'nv_inference_pending_request_count{model="Echo",version="2"} 0\n'
        )
        assert _drain.pending_requests("127.0.0.1", port) == {("Gate", "1"): 30, ("Echo", "2"): 0}
        held = _drain.HeldConnection.open("127.0.0.1", port)
        assert held is not None
        held.close()
        held.close()  # idempotent
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert _drain.pending_requests("127.0.0.1", port) == {}  # unreadable: nothing known to be queued
    assert _drain.HeldConnection.open("127.0.0.1", port) is None


def test_refusal_text_is_not_a_callable_error_text():
    assert _messages.Error(_messages.UNAVAILABLE_TEXT) == _messages.UNAVAILABLE_MESSAGE
    # A callable's error reads "Type: message"; no exception type is named "pytriton".
    assert _messages.UNAVAILABLE_TEXT.startswith("pytriton: ")


class _Clock:
    """A fake ``time`` for pytriton._serving.supervisor: ``sleep`` advances ``monotonic``."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class _IdleModel:
    busy, connected, max_queue_delay_s, execution_timeout_s = False, True, 0.0, None

    def __init__(self, last_active):
        self.last_active = last_active


class _Registry:
    def __init__(self, models):
        self._models = models

    def models(self):
        return list(self._models)


class _ServingBackend:
    def is_serving(self):
        return True


def _detached_after(monkeypatch, ended_s_before_stop):
    """How long the stop waits for an idle instance whose last batch ended that long before it began."""
    clock = _Clock()
    monkeypatch.setattr(_supervisor, "time", clock)
    supervisor = types.SimpleNamespace(
        _registry=_Registry([_IdleModel(clock.now - ended_s_before_stop)]), _backend=_ServingBackend()
    )
    started = clock.now
    assert _supervisor.Supervisor.wait_detached(supervisor, started + 30)
    return clock.now - started


def test_a_batch_that_ended_just_before_the_stop_gets_time_for_its_response(monkeypatch):
    # The batch whose unrecoverable error starts the stop ends right before it: its response is still
    # on its way through the stub and Triton (test_data_path.py lost it under load before).
    assert _detached_after(monkeypatch, 0.05) >= _supervisor.RESPONSE_SETTLE_S
    # An instance that has been idle for long does not make the stop wait.
    assert _detached_after(monkeypatch, 5.0) < _supervisor.RESPONSE_SETTLE_S
