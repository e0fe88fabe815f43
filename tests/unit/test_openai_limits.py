"""The OpenAI frontend's input and connection limits (issue 42): body size, JSON nesting and surrogates,
echoed values, parsing off the event loop, a non-stream client's disconnect, and held connections.

The app-level tests run through Starlette's TestClient or straight ASGI calls on a fake backend; the
connection tests serve a real frontend (uvicorn on its thread) on the same fake backend over loopback.
Every defence is tested with a healthy request beside it.
"""

import asyncio
import json
import logging
import socket
import threading
import time

import httpx
import pytest

from pytriton.exceptions import PyTritonBadParameterError
from pytriton.openai import ChatModel, OpenAIFrontend
from pytriton.openai import _app as app_module
from pytriton.openai._app import AppState, create_app
from tests.conftest import wait_for
from tests.unit.test_openai_app import (
    MESSAGES,
    PLAIN,
    STREAMING,
    TEXT_CONFIG,
    FakeBackend,
    assert_error,
    make_client,
    text,
)

CHAT = {"model": "tiny", "messages": MESSAGES}


@pytest.fixture()
def backend():
    return FakeBackend()


def _ok(response):
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "whole answer"


def test_a_body_over_the_limit_is_413_with_openais_error_body(backend):
    client, state = make_client(backend)
    state.max_body_bytes = 2000
    fits = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 1500}]}).encode()
    over = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 2500}]}).encode()
    _ok(client.post("/v1/chat/completions", content=fits))
    refused = client.post("/v1/chat/completions", content=over)
    assert_error(refused, 413, "invalid_request_error", "request_too_large")
    assert "2000 bytes" in refused.json()["error"]["message"]
    assert refused.headers["connection"] == "close"  # the unread rest of the body ends the connection

    def chunked(body):  # no Content-Length: refused once the body read so far passes the limit
        for start in range(0, len(body), 500):
            yield body[start : start + 500]

    assert_error(client.post("/v1/chat/completions", content=chunked(over)), 413, "invalid_request_error",
                 "request_too_large")  # fmt: skip
    assert_error(client.post("/v1/embeddings", content=over), 413, "invalid_request_error", "request_too_large")
    _ok(client.post("/v1/chat/completions", content=chunked(fits)))
    assert state.in_flight == 0 and len(backend.calls) == 2  # the refused bodies reached no model


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}',
        b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\uDFFFb"}]}',
        b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "user": {"\\udc00": 1}}',
        '{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}'.encode("utf-16"),
        b'{"model": "tiny", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',  # a surrogate as UTF-8
        b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "x": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "x", "deep": ' + b"[" * 900 + b"]" * 900 + b"}]}",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "x": ' + b"[" * 64 + b"]" * 64 + b"}",
    ],
    ids=[
        "lone-high",
        "lone-low",
        "lone-in-a-key",
        "lone-utf16",
        "utf8-encoded-surrogate",
        "nesting-100000",
        "nesting-900",
        "nesting-65",
    ],
)
def test_lone_surrogates_and_deep_nesting_are_400_and_log_nothing(backend, body, caplog):
    client, state = make_client(backend)
    with caplog.at_level(logging.DEBUG, logger="pytriton.openai"):
        error = assert_error(client.post("/v1/chat/completions", content=body), 400, "invalid_request_error",
                             "invalid_json")  # fmt: skip
        assert any(word in error["message"] for word in ("surrogate", "deeper than 64 levels", "not valid UTF-8"))
        assert len(error["message"]) < 300
        # The same with a large body (parsed off the loop), and a healthy request beside them.
        padded = body[:-1] + b', "pad": "' + b"p" * (300 << 10) + b'"}' if body.startswith(b"{") else None
        if padded is not None:
            assert_error(client.post("/v1/chat/completions", content=padded), 400, "invalid_request_error",
                         "invalid_json")  # fmt: skip
        _ok(client.post("/v1/chat/completions", json=CHAT))
    assert not caplog.records  # no traceback, no log line per request
    assert len(backend.calls) == 1


def test_valid_unicode_and_nesting_within_the_bound_pass(backend):
    client, _ = make_client(backend)
    pair = b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud83d\\ude00 \\u00e9"}]}'
    _ok(client.post("/v1/chat/completions", content=pair))
    assert json.loads(backend.calls[-1][1].inputs["messages"][0])[0]["content"] == "\U0001f600 \u00e9"
    nested = b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "x": ' + b"[" * 63 + b"]" * 63 + b"}"
    _ok(client.post("/v1/chat/completions", content=nested))
    many = {**CHAT, "messages": [{"role": "user", "content": "m"}] * 100}  # more brackets than the bound, shallow
    _ok(client.post("/v1/chat/completions", json=many))


def test_echoed_values_are_cut_short(backend):
    client, _ = make_client(backend)
    name = "m" * 100_000
    error = assert_error(client.post("/v1/chat/completions", json={**CHAT, "model": name}), 404,
                         "invalid_request_error", "model_not_found", "model")  # fmt: skip
    assert len(error["message"]) < 300 and "mmmm" in error["message"]
    assert len(client.get("/v1/models/" + "n" * 20_000).content) < 400
    unknown_route = client.get("/v1/" + "z" * 50_000)
    assert unknown_route.status_code == 404 and len(unknown_route.content) < 400
    for field, value in (("temperature", "t" * 50_000), ("stream", ["s"] * 50_000), ("n", {"k" * 9: 1})):
        error = assert_error(client.post("/v1/chat/completions", json={**CHAT, field: value}), 400,
                             "invalid_request_error", None, field)  # fmt: skip
        assert len(error["message"]) < 300
    role = [{"role": "r" * 100_000, "content": "x"}]
    error = assert_error(client.post("/v1/chat/completions", json={**CHAT, "messages": role}), 400,
                         "invalid_request_error", None, "messages[0].role")  # fmt: skip
    assert len(error["message"]) < 300
    _ok(client.post("/v1/chat/completions", json=CHAT))


def _asgi_scope(path="/v1/chat/completions"):
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
        "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
    }  # fmt: skip


def test_a_non_stream_request_to_a_decoupled_model_is_cancelled_when_its_client_leaves(backend):
    """The answer of a decoupled model is assembled from its stream; a disconnect cancels that stream."""
    state = AppState(backend, {"gen": (ChatModel("gen", "chat_stream"), STREAMING, STREAMING)}, {})
    backend.stream_plan = [[text("a"), "hang", text("never")]]
    app = create_app(state)
    body = json.dumps({"model": "gen", "messages": MESSAGES}).encode()
    sent = []

    async def main():
        requested = []

        async def receive():
            if not requested:
                requested.append(True)
                return {"type": "http.request", "body": body, "more_body": False}
            while not backend.streams:  # the model is generating: now the client leaves
                await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        await asyncio.wait_for(app(_asgi_scope(), receive, send), 10)  # not the 30 s the model would take

    asyncio.run(main())
    assert backend.streams[0].cancelled and backend.streams[0].closed and state.in_flight == 0
    # Healthy beside it: the same model answers a client that stays.
    backend.stream_items = [text("a "), text("b", finish_reason=b"stop")]
    from starlette.testclient import TestClient

    answer = TestClient(app).post("/v1/chat/completions", json={"model": "gen", "messages": MESSAGES})
    assert answer.json()["choices"][0]["message"]["content"] == "a b" and state.in_flight == 0


# --- A real frontend (uvicorn on its thread) on the fake backend. ---


class ServedBackend(FakeBackend):
    """FakeBackend with the configuration the frontend reads at start, and an optional gate on infer."""

    gate = None  # a threading.Event: infer waits for it (polled, the backend runs on the frontend's loop)

    async def config(self, model, version):
        return TEXT_CONFIG

    async def infer(self, model, version, call, batching):
        for _ in range(2000):
            if self.gate is None or self.gate.is_set():
                break
            await asyncio.sleep(0.01)
        return await super().infer(model, version, call, batching)


@pytest.fixture()
def serve(monkeypatch):
    monkeypatch.setattr(OpenAIFrontend, "_backend_factory", lambda self: ServedBackend)
    started = []

    def start(**limits):
        frontend = OpenAIFrontend("grpc://unused:1", [ChatModel("tiny", "chat")], port=0, **limits)
        frontend.start()
        started.append(frontend)
        return frontend

    yield start
    ServedBackend.gate = None
    for frontend in started:
        frontend.stop()


def _chat(frontend, timeout=20):
    return httpx.post(frontend.url + "/chat/completions", json=CHAT, timeout=timeout)


def _closed_by_server(sock, timeout_s=10.0):
    """True once the server closed ``sock`` (EOF or reset) within ``timeout_s``; answers read meanwhile are skipped."""
    sock.settimeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if sock.recv(65536) == b"":
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    return False


def _connect(frontend, send=b""):
    sock = socket.create_connection(("127.0.0.1", frontend.port), timeout=10)
    if send:
        sock.sendall(send)
    return sock


PARTIAL = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def test_idle_and_partial_header_connections_are_closed_after_the_header_timeout(serve):
    frontend = serve(header_timeout_s=0.5, keep_alive_timeout_s=30)
    request = json.dumps(CHAT).encode()
    whole = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: " + str(len(request)).encode() + b"\r\n\r\n" + request)  # fmt: skip
    silent = _connect(frontend)
    partial = _connect(frontend, PARTIAL)
    after_answer = _connect(frontend, whole)
    try:
        answered = after_answer.recv(65536)
        assert answered.startswith(b"HTTP/1.1 200") and b"whole answer" in answered
        after_answer.sendall(PARTIAL)  # the next request's headers, never finished
        for sock in (silent, partial, after_answer):
            assert _closed_by_server(sock), "a connection without whole headers was held open"
        _ok(_chat(frontend))  # healthy traffic is served throughout
    finally:
        for sock in (silent, partial, after_answer):
            sock.close()


def test_a_body_that_does_not_arrive_in_time_gets_408(serve):
    frontend = serve(body_timeout_s=0.5, header_timeout_s=0.5)
    head = PARTIAL + b"Content-Length: 100\r\n\r\n"
    slow = _connect(frontend, head + b'{"model": ')  # 10 of the 100 bytes, then nothing
    try:
        slow.settimeout(10)
        answer = slow.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer, answer[:200]
        assert _closed_by_server(slow)
    finally:
        slow.close()
    # A body sent in pieces, each well within the time, is served; and so is an ordinary request.
    body = json.dumps(CHAT).encode()
    pieces = _connect(frontend, PARTIAL + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    try:
        for start in range(0, len(body), 20):
            pieces.sendall(body[start : start + 20])
        answer = pieces.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200") and b"whole answer" in answer
    finally:
        pieces.close()
    _ok(_chat(frontend))


def test_headers_growing_past_the_bound_get_431(serve):
    frontend = serve()
    sock = _connect(frontend, PARTIAL)
    answer = b""
    try:
        line = b"X-Filler: " + b"f" * 1000 + b"\r\n"
        for _ in range(400):  # 400 KB at most, well past the 64 KiB bound
            try:
                sock.sendall(line * 8)
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.005)
        sock.settimeout(10)
        try:
            answer = sock.recv(65536)
        except ConnectionResetError:
            answer = b""
        # 431 from the frontend's bound; 400 where uvicorn runs h11 (no httptools), whose own bound is 16 KiB.
        assert answer.startswith((b"HTTP/1.1 431", b"HTTP/1.1 400")) or answer == b"", answer[:100]
    finally:
        sock.close()
    _ok(_chat(frontend))


def test_connections_over_the_bound_evict_the_longest_waiting_then_are_refused(serve):
    frontend = serve(max_connections=4, header_timeout_s=60)
    held = [_connect(frontend, PARTIAL) for _ in range(4)]
    try:
        time.sleep(0.2)  # they are accepted (a healthy client's connection comes last)
        _ok(_chat(frontend))  # a fifth connection: the longest waiting one is closed for it
        assert _closed_by_server(held[0]), "the longest-waiting connection was not closed"
        # Every connection in the middle of a request: one more is refused with 503 and closed.
        ServedBackend.gate = threading.Event()
        results = []
        busy = [threading.Thread(target=lambda: results.append(_chat(frontend))) for _ in range(4)]
        for thread in busy:
            thread.start()
        for sock in held[1:]:  # the partial ones make room for the busy ones as they connect
            assert _closed_by_server(sock)
        assert wait_for(lambda: len(frontend_connections(frontend)) >= 4, 10)
        refused = _connect(frontend)
        try:
            refused.settimeout(10)
            try:
                answer = refused.recv(65536)
            except ConnectionResetError:
                answer = b""
            assert answer == b"" or (answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer)
            assert _closed_by_server(refused)
        finally:
            refused.close()
        ServedBackend.gate.set()
        for thread in busy:
            thread.join(30)
        assert len(results) == 4
        for response in results:
            _ok(response)
        _ok(_chat(frontend))
    finally:
        for sock in held:
            sock.close()


def frontend_connections(frontend):
    """The frontend's connections in the middle of a request (uvicorn's server state, read across threads)."""
    for _ in range(100):
        try:  # the set belongs to the frontend's thread: copy it, again if it changed meanwhile
            connections = list(frontend._server.server_state.connections)
        except RuntimeError:
            continue
        return [c for c in connections if getattr(c, "waiting_since", 0) is None]
    return []


def test_health_answers_while_a_large_body_is_parsed(serve, monkeypatch):
    """The parse of a large body blocks until /health has answered: that can happen only off the loop."""
    frontend = serve()
    parsing, health_answered, seen = threading.Event(), threading.Event(), []
    real = app_module.parse_json

    def slow_parse(raw, *args, **kwargs):
        if len(raw) > 1 << 20:
            parsing.set()
            seen.append(health_answered.wait(15))
        return real(raw, *args, **kwargs)

    monkeypatch.setattr(app_module, "parse_json", slow_parse)
    big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * (4 << 20)}]}).encode()
    results = []
    poster = threading.Thread(
        target=lambda: results.append(httpx.post(frontend.url + "/chat/completions", content=big, timeout=60))
    )
    poster.start()
    try:
        assert parsing.wait(30), "the large body was never parsed"
        health = httpx.get(f"http://127.0.0.1:{frontend.port}/health", timeout=10)
        assert health.status_code == 200
        health_answered.set()
        _ok(_chat(frontend))  # and a chat request too
    finally:
        health_answered.set()
        poster.join(60)
    assert seen == [True] and results and results[0].status_code == 200


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_body_bytes": 0},
        {"max_json_depth": True},
        {"max_connections": -1},
        {"header_timeout_s": 0},
        {"keep_alive_timeout_s": "5"},
        {"body_timeout_s": -1.0},
    ],  # fmt: skip
)
def test_limit_arguments_are_checked(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(PyTritonBadParameterError, match=name):
        OpenAIFrontend("grpc://unused:1", [ChatModel("tiny", "chat")], **kwargs)


def test_limits_are_passed_to_the_app(backend):
    _, state = make_client(backend)
    assert state.max_body_bytes == 16 << 20 and state.max_json_depth == 64 and state.body_timeout_s == 60.0
    assert PLAIN is not None
