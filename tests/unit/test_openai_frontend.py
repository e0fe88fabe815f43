"""OpenAIFrontend's checks before it serves: exposure without a key, arguments, ports, unreachable models."""

import asyncio
import socket

import pytest

from pytriton.exceptions import PyTritonBadParameterError, PyTritonInvalidOperationError
from pytriton.openai import ChatModel, EmbeddingModel, OpenAIFrontend
from pytriton.openai._frontend import API_KEY_ENV, check_exposure, is_loopback
from tests.conftest import free_ports

MODELS = [ChatModel("chat", "bound")]


def test_loopback_detection():
    assert all(is_loopback(host) for host in ("127.0.0.1", "127.1.2.3", "::1", "localhost"))
    assert not any(is_loopback(host) for host in ("0.0.0.0", "::", "10.0.0.1", "example.com"))


def test_no_key_is_refused_beyond_loopback(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(PyTritonBadParameterError, match="api_key"):
        OpenAIFrontend("grpc://127.0.0.1:1", MODELS, host="0.0.0.0")
    OpenAIFrontend("grpc://127.0.0.1:1", MODELS, host="0.0.0.0", api_key="k")
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    frontend = OpenAIFrontend("grpc://127.0.0.1:1", MODELS, host="0.0.0.0")
    assert frontend._api_key == "from-env"
    for bad in ("", " k", "k\n"):
        with pytest.raises(PyTritonBadParameterError, match="non-empty"):
            check_exposure("127.0.0.1", bad)


@pytest.mark.parametrize(
    "models, kwargs, match",
    [
        ([], {}, "each OpenAI model once"),
        ([ChatModel("a", "x"), EmbeddingModel("a", "y")], {}, "each OpenAI model once"),
        (["chat"], {}, "ChatModel and EmbeddingModel"),
        (MODELS, {"max_in_flight": 0}, "max_in_flight"),
    ],
)
def test_bad_arguments(models, kwargs, match):
    with pytest.raises(PyTritonBadParameterError, match=match):
        OpenAIFrontend("grpc://127.0.0.1:1", models, **kwargs)


def test_start_needs_a_running_triton_or_a_grpc_url():
    class Stopped:
        def is_alive(self):
            return False

    with pytest.raises(PyTritonInvalidOperationError, match="run"):
        OpenAIFrontend(Stopped(), MODELS, port=0).start()
    with pytest.raises(PyTritonBadParameterError, match="grpc://"):
        OpenAIFrontend("http://127.0.0.1:1", MODELS, port=0).start()


def test_a_taken_port_fails_at_start():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        frontend = OpenAIFrontend("grpc://127.0.0.1:1", MODELS, port=taken.getsockname()[1])
        with pytest.raises(PyTritonBadParameterError, match="cannot listen"):
            frontend.start()


def test_a_model_that_cannot_be_reached_fails_start_and_leaves_nothing_listening():
    (grpc_port,) = free_ports(1)  # nothing listens there
    frontend = OpenAIFrontend(f"grpc://127.0.0.1:{grpc_port}", MODELS, port=0)
    with pytest.raises(PyTritonBadParameterError, match="Bind it before starting"):
        frontend.start()
    assert frontend._thread is None and frontend._socket is None
    assert frontend.url.startswith("http://127.0.0.1:") and frontend.url.endswith("/v1")


def test_start_serve_stop_on_a_fake_backend(monkeypatch):
    """The whole lifecycle without Triton: the socket is TCP (so asyncio sets TCP_NODELAY), requests are
    served with the key, stop() ends the thread and frees the port."""
    import httpx

    from tests.unit.test_openai_app import TEXT_CONFIG, FakeBackend

    class Backend(FakeBackend):
        async def config(self, model, version):
            return TEXT_CONFIG

    monkeypatch.setattr(OpenAIFrontend, "_backend_factory", lambda self: Backend)
    frontend = OpenAIFrontend("grpc://unused:1", [ChatModel("tiny", "chat")], port=0, api_key="k")
    with frontend:
        assert frontend._socket.proto == socket.IPPROTO_TCP
        thread = frontend._thread
        headers = {"Authorization": "Bearer k"}
        body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
        response = httpx.post(frontend.url + "/chat/completions", json=body, headers=headers, timeout=10)
        assert response.json()["choices"][0]["message"]["content"] == "whole answer"
        assert "server" not in response.headers  # the frontend does not advertise uvicorn
        streamed = httpx.post(frontend.url + "/chat/completions", json={**body, "stream": True}, headers=headers)
        assert (
            streamed.text.count("data: ") == 4
            and "whole answer" in streamed.text
            and streamed.text.endswith("data: [DONE]\n\n")
        )
        with pytest.raises(PyTritonInvalidOperationError, match="already started"):
            frontend.start()
    assert not thread.is_alive()
    with socket.socket() as again:
        again.bind(("127.0.0.1", frontend.port))  # the port is free again


def test_serve_blocks_until_a_signal_then_stops(monkeypatch):
    import os
    import signal
    import threading
    import time

    from tests.unit.test_openai_app import TEXT_CONFIG, FakeBackend

    class Backend(FakeBackend):
        async def config(self, model, version):
            return TEXT_CONFIG

    monkeypatch.setattr(OpenAIFrontend, "_backend_factory", lambda self: Backend)
    frontend = OpenAIFrontend("grpc://unused:1", [ChatModel("tiny", "chat")], port=0)
    previous = signal.getsignal(signal.SIGINT)
    returned, sent = threading.Event(), []

    def interrupt_once_handled() -> None:
        # SIGINT once serve() has put in its handler, not on a 0.5 s timer: on a loaded host start()
        # could take longer, and the default handler then raised KeyboardInterrupt into it.
        deadline = time.monotonic() + 30
        while signal.getsignal(signal.SIGINT) is previous and not returned.is_set():
            if time.monotonic() > deadline:
                break  # never handled: the SIGINT below fails the test rather than letting serve() hang
            time.sleep(0.005)
        if not returned.is_set():
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    interrupter = threading.Thread(target=interrupt_once_handled, daemon=True)
    interrupter.start()
    try:
        frontend.serve()  # returns on the SIGINT
    finally:
        returned.set()
        interrupter.join(35)
    assert sent == [True]  # it blocked until the signal came
    assert frontend._thread is None and signal.getsignal(signal.SIGINT) is previous

    class FakeTriton:
        served = False

        def serve(self):
            assert frontend._thread is not None  # the frontend serves while Triton does
            FakeTriton.served = True

    frontend = OpenAIFrontend(FakeTriton(), [ChatModel("tiny", "chat")], port=0)
    frontend.serve()
    assert FakeTriton.served and frontend._thread is None


def test_the_frontend_loop_is_uvloop_when_installed_else_asyncio():
    from pytriton.openai import _frontend

    seen = {}

    async def main():
        seen["loop"] = type(asyncio.get_running_loop()).__module__

    _frontend._run_loop(main())
    try:
        import uvloop  # noqa: F401
    except ImportError:
        assert seen["loop"].startswith("asyncio")
    else:
        assert seen["loop"].startswith("uvloop")


class RecordingTransport:
    def __init__(self):
        self.writes = []
        self.closed = self.aborted = False

    def write(self, data):
        self.writes.append(data)

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def abort(self):
        self.aborted = True

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default


def test_a_write_waits_for_the_next_one_or_the_end_of_its_loop_step():
    from pytriton._platform.uvicorn_http import CoalescingTransport

    async def main():
        raw = RecordingTransport()
        transport = CoalescingTransport(raw)
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(b"")
        assert raw.writes == []  # held within the step
        transport.write(b"{}")
        assert raw.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"]  # head and body in one send, at once
        transport.writelines([b"a", b"b", b"c"])
        assert raw.writes[1:] == [b"ab"]  # pairs: "c" does not wait for more than its step
        await asyncio.sleep(0)
        assert raw.writes[1:] == [b"ab", b"c"]
        transport.write(b"last")
        transport.close()  # sends what is pending first
        assert raw.writes[-1] == b"last" and raw.closed
        assert transport.get_extra_info("peername") == ("127.0.0.1", 1) and transport.is_closing()
        dropped = CoalescingTransport(RecordingTransport())
        dropped.write(b"x")
        dropped.abort()
        await asyncio.sleep(0)
        assert dropped._transport.writes == [] and dropped._transport.aborted

    asyncio.run(main())
