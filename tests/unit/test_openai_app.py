"""The OpenAI app on a fake backend through Starlette's TestClient: routes, auth, errors, streams (no server)."""

import asyncio
import json

import numpy as np
import pytest
from starlette.testclient import TestClient

from pytriton.openai import ChatModel, EmbeddingModel
from pytriton.openai._app import AppState, EventStream, create_app
from pytriton.openai._backend import error_from_status
from pytriton.openai._errors import OpenAIError, model_failed, overloaded
from pytriton.openai._models import model_info

TEXT_CONFIG = {
    "input": [{"name": "messages", "data_type": "TYPE_STRING"}],
    "output": [
        {"name": n, "data_type": "TYPE_STRING"} for n in ("text", "finish_reason", "prompt_tokens", "completion_tokens")
    ],
}
PLAIN = model_info(TEXT_CONFIG)
STREAMING = model_info({**TEXT_CONFIG, "model_transaction_policy": {"decoupled": True}})
EMBED = model_info(
    {"max_batch_size": 8, "input": [{"name": "input", "data_type": "TYPE_STRING"}], "output": [{"name": "embedding"}]}
)
MESSAGES = [{"role": "user", "content": "hi"}]


def text(value, **extra):
    outputs = {"text": np.array([value.encode()], dtype=object)}
    outputs.update({name: np.array([v]) for name, v in extra.items()})
    return outputs


class FakeStream:
    def __init__(self, items):
        self.items = items
        self.cancelled = False
        self.closed = False

    async def __aiter__(self):
        try:
            for item in self.items:
                if isinstance(item, BaseException):
                    raise item
                if item == "hang":
                    await asyncio.sleep(30)
                if isinstance(item, float):  # a pause before the next response
                    await asyncio.sleep(item)
                    continue
                yield item
        finally:
            self.closed = True

    def cancel(self):
        self.cancelled = True


class FakeBackend:
    def __init__(self):
        self.calls = []
        self.streams = []
        self.stream_items = [
            text("a "),
            text("b"),
            text("", finish_reason=b"length", prompt_tokens=4, completion_tokens=2),
        ]
        self.stream_plan = []  # items of each next stream, in order; then stream_items
        self.infer_outputs = None
        self.infer_error = None
        self.ready_models = {"chat", "chat_stream", "embed"}

    async def config(self, model, version):
        return {}

    async def ready(self, model, version):
        return model in self.ready_models

    async def infer(self, model, version, call, batching):
        self.calls.append((model, call, batching))
        if self.infer_error is not None:
            raise self.infer_error
        if model == "embed":
            words = call.inputs["input"][0].decode().split()
            return {"embedding": np.array([len(words), 1.0], dtype=np.float32)}
        if self.infer_outputs is not None:
            return self.infer_outputs
        return text("whole answer", finish_reason=b"stop", prompt_tokens=3, completion_tokens=2)

    def stream(self, model, version, call, batching):
        self.calls.append((model, call, batching))
        stream = FakeStream(list(self.stream_plan.pop(0) if self.stream_plan else self.stream_items))
        self.streams.append(stream)
        return stream

    async def close(self):
        pass


@pytest.fixture()
def backend():
    return FakeBackend()


def make_client(backend, api_key=None, max_in_flight=8):
    state = AppState(
        backend,
        {"tiny": (ChatModel("tiny", "chat", stream_model="chat_stream"), PLAIN, STREAMING)},
        {"emb": (EmbeddingModel("emb", "embed"), EMBED)},
        api_key=api_key,
        max_in_flight=max_in_flight,
    )
    return TestClient(create_app(state)), state


def assert_error(response, status, kind, code=None, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == kind and error["code"] == code and error["param"] == param
    assert "Traceback" not in error["message"] and ".py" not in error["message"]
    return error


def test_models_and_health(backend):
    client, _ = make_client(backend)
    listed = client.get("/v1/models").json()
    assert [m["id"] for m in listed["data"]] == ["emb", "tiny"] and listed["object"] == "list"
    assert client.get("/v1/models/tiny").json()["id"] == "tiny"
    assert_error(client.get("/v1/models/nope"), 404, "invalid_request_error", "model_not_found", "model")
    assert client.get("/health").json() == {"status": "ok"}
    backend.ready_models.discard("chat_stream")
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["models_not_ready"] == ["chat_stream"]


def test_api_key_is_required_on_v1_routes_only(backend):
    client, _ = make_client(backend, api_key="s3cret")
    assert_error(client.get("/v1/models"), 401, "invalid_request_error", "invalid_api_key")
    assert_error(
        client.get("/v1/models", headers={"Authorization": "Bearer wrong"}),
        401,
        "invalid_request_error",
        "invalid_api_key",
    )
    assert_error(
        client.get("/v1/models", headers={"Authorization": "Basic s3cret"}),
        401,
        "invalid_request_error",
        "invalid_api_key",
    )
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/health").status_code == 200


def test_chat_without_stream_uses_the_ordinary_model(backend):
    client, _ = make_client(backend)
    body = client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "temperature": 0.5}).json()
    assert body["choices"][0]["message"]["content"] == "whole answer"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    model, call, _ = backend.calls[0]
    assert model == "chat" and call.parameters == {"temperature": 0.5}


def test_n_choices_are_separate_model_calls(backend):
    client, _ = make_client(backend)
    body = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "n": 3}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2] and len(backend.calls) == 3
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 6


def test_chat_stream_uses_the_decoupled_model_and_openais_event_format(backend):
    client, _ = make_client(backend)
    response = client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert "content-length" not in response.headers
    raw = response.content
    assert raw.startswith(b"data: {") and raw.endswith(b"data: [DONE]\n\n")
    chunks = [json.loads(part[6:]) for part in raw.split(b"\n\n")[:-2]]
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": "a "},
        {"content": "b"},
        {},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    assert backend.calls[0][0] == "chat_stream"
    assert not backend.streams[0].cancelled  # it ended on its own: nothing to cancel


def _chunks(raw):
    assert raw.endswith(b"data: [DONE]\n\n")
    return [json.loads(part[6:]) for part in raw.split(b"\n\n")[:-2]]


def test_n_streamed_choices_interleave_each_with_its_index(backend):
    client, state = make_client(backend)
    slow = [text("a "), 0.3, text("b", finish_reason=b"length", prompt_tokens=4, completion_tokens=2)]
    backend.stream_plan = [slow, [text("c ", prompt_tokens=4), text("d", completion_tokens=2)]]
    body = {"model": "tiny", "messages": MESSAGES, "stream": True, "n": 2, "stream_options": {"include_usage": True}}
    chunks = _chunks(client.post("/v1/chat/completions", json=body).content)
    events = [
        (c["choices"][0]["index"], c["choices"][0]["delta"], c["choices"][0]["finish_reason"]) for c in chunks[:-1]
    ]
    assert events[:2] == [
        (0, {"role": "assistant", "content": ""}, None),
        (1, {"role": "assistant", "content": ""}, None),
    ]
    assert events[2:4] == [(0, {"content": "a "}, None), (1, {"content": "c "}, None)]
    # The slow choice 0 does not hold back choice 1: its end comes before choice 0's second piece.
    assert events[4:] == [(1, {"content": "d"}, None), (1, {}, "stop"), (0, {"content": "b"}, None), (0, {}, "length")]
    assert all("usage" not in c for c in chunks[:-1]) and len({c["id"] for c in chunks}) == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8
    }  # fmt: skip
    assert len(backend.calls) == 2 and state.in_flight == 0


def test_completions_stream_several_prompts_as_numbered_choices(backend):
    client, _ = make_client(backend)
    backend.stream_plan = [[text("p0 ")], [text("p0 ")], [text("p1")], [text("p1")]]
    body = {"model": "tiny", "prompt": ["x", "y"], "n": 2, "stream": True}
    chunks = _chunks(client.post("/v1/completions", json=body).content)
    texts = {
        index: "".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == index)
        for index in range(4)
    }
    assert texts == {0: "p0 ", 1: "p0 ", 2: "p1", 3: "p1"}
    prompts = [json.loads(call.inputs["messages"][0])[0]["content"] for _, call, _ in backend.calls]
    assert prompts == ["x", "x", "y", "y"]


def test_a_choice_failing_before_its_first_response_fails_the_stream_and_cancels_the_others(backend):
    client, state = make_client(backend)
    backend.stream_plan = [[text("a"), "hang"], [0.05, model_failed("The model failed: ValueError: boom")]]
    response = client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": True, "n": 2}
    )  # fmt: skip
    assert_error(response, 500, "server_error", "model_error")
    assert backend.streams[0].cancelled and backend.streams[1].cancelled and state.in_flight == 0


def test_a_disconnect_cancels_the_streams_of_every_choice(backend):
    _, state = make_client(backend)
    backend.stream_plan = [[text("a"), "hang"], [text("b"), "hang"]]
    app = create_app(state)
    body = json.dumps({"model": "tiny", "messages": MESSAGES, "stream": True, "n": 2}).encode()
    sent = []

    async def main():
        first_body = asyncio.Event()
        requested: list = []

        async def receive():
            if not requested:
                requested.append(True)
                return {"type": "http.request", "body": body, "more_body": False}
            await first_body.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body" and message.get("body"):
                first_body.set()

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "root_path": "", "query_string": b"",
            "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
        }  # fmt: skip
        await asyncio.wait_for(app(scope, receive, send), 5)

    asyncio.run(main())
    assert sent[0]["status"] == 200
    assert [stream.cancelled for stream in backend.streams] == [True, True] and state.in_flight == 0


TOOL_CALL = {"function": {"name": "lookup", "arguments": {"q": "x"}}}


def test_tool_calls_without_stream(backend):
    client, _ = make_client(backend)
    backend.infer_outputs = {
        "text": np.array([b""], dtype=object), "tool_calls": np.array([json.dumps([TOOL_CALL]).encode()], dtype=object)
    }  # fmt: skip
    tools = [{"type": "function", "function": {"name": "lookup"}}]
    body = client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "tools": tools}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"] == {"name": "lookup", "arguments": '{"q": "x"}'}
    assert backend.calls[0][1].parameters == {"tools": json.dumps(tools)}
    backend.infer_outputs["tool_calls"] = np.array([b"{oops"], dtype=object)
    failed = client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "tools": tools})
    assert "not JSON" in assert_error(failed, 500, "server_error", "model_error")["message"]


def test_tool_calls_stream_as_deltas(backend):
    client, _ = make_client(backend)

    def calls(items):
        return {
            "text": np.array([b""], dtype=object),
            "tool_calls": np.array([json.dumps(items).encode()], dtype=object),
        }

    backend.stream_items = [
        calls([{"id": "call_1", "function": {"name": "lookup", "arguments": '{"q":'}}]),
        calls([{"index": 0, "function": {"arguments": ' "x"}'}}]),
        text(""),
    ]
    body = {"model": "tiny", "messages": MESSAGES, "stream": True, "tools": [{"function": {"name": "lookup"}}]}
    chunks = _chunks(client.post("/v1/chat/completions", json=body).content)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[1:] == [
        {
            "tool_calls": [
                {"index": 0, "id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q":'}}
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": ' "x"}'}}]},
        {},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_errors_before_the_first_token_keep_their_status(backend):
    client, state = make_client(backend)
    backend.stream_items = [model_failed("The model failed: ValueError: boom")]
    response = client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": True})
    assert assert_error(response, 500, "server_error", "model_error")["message"].endswith("ValueError: boom")
    assert backend.streams[0].cancelled and state.in_flight == 0


def test_an_error_mid_stream_is_a_last_event_with_openais_error_body(backend):
    client, state = make_client(backend)
    backend.stream_items = [text("a"), overloaded("queue full")]
    raw = client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "stream": True}).content
    last = json.loads(raw.split(b"\n\n")[-2][6:])
    assert last["error"]["type"] == "rate_limit_error" and b"[DONE]" not in raw
    assert state.in_flight == 0


def test_status_codes(backend):
    client, state = make_client(backend, max_in_flight=1)
    post = client.post
    assert_error(
        post("/v1/chat/completions", json={"model": "other", "messages": MESSAGES}),
        404,
        "invalid_request_error",
        "model_not_found",
        "model",
    )
    assert_error(
        post("/v1/embeddings", json={"model": "tiny", "input": "x"}),
        404,
        "invalid_request_error",
        "model_not_found",
        "model",
    )
    assert_error(post("/v1/chat/completions", content=b"{oops"), 400, "invalid_request_error", "invalid_json")
    assert_error(post("/v1/chat/completions", json={"model": "tiny"}), 400, "invalid_request_error", None, "messages")
    backend.infer_error = model_failed("The model failed: RuntimeError: bad")
    assert_error(post("/v1/completions", json={"model": "tiny", "prompt": "x"}), 500, "server_error", "model_error")
    backend.infer_error = RuntimeError("/secret/path.py line 3")
    error = assert_error(post("/v1/completions", json={"model": "tiny", "prompt": "x"}), 500, "server_error")
    assert "secret" not in error["message"]
    backend.infer_error = None
    state.in_flight = 1  # another request holds the only place
    assert_error(
        post("/v1/completions", json={"model": "tiny", "prompt": "x"}), 429, "rate_limit_error", "rate_limit_exceeded"
    )
    state.in_flight = 0
    assert post("/v1/completions", json={"model": "tiny", "prompt": "x"}).status_code == 200
    assert_error(client.get("/v1/nothing"), 404, "not_found_error")
    assert_error(client.get("/v1/chat/completions"), 405, "invalid_request_error")


def test_embeddings_one_call_per_text(backend):
    client, _ = make_client(backend)
    body = client.post("/v1/embeddings", json={"model": "emb", "input": ["a b", "c"]}).json()
    assert [d["embedding"] for d in body["data"]] == [[2.0, 1.0], [1.0, 1.0]]
    assert [call[2] for call in backend.calls] == [True, True]  # the embedding model batches


@pytest.mark.parametrize(
    "status, message, expected",
    [
        ("INVALID_ARGUMENT", "bad shape", 400),
        ("UNAVAILABLE", "Exceeds maximum queue size", 429),
        ("UNAVAILABLE", "model not ready", 503),
        ("NOT_FOUND", "no such model", 503),
        ("INTERNAL", "ValueError: boom", 500),
        ("", "stream error", 500),
    ],
)
def test_triton_errors_map_onto_status_codes(status, message, expected):
    error = error_from_status(status, message)
    assert isinstance(error, OpenAIError) and error.status == expected and message in error.message


def test_a_disconnect_cancels_the_models_stream_at_once():
    """EventStream watches receive() for the disconnect while the model is silent between tokens."""
    stream = FakeStream([text("a"), "hang", text("never")])
    released = []
    sent = []

    async def events():
        async for outputs in stream:
            yield b"data: " + outputs["text"][0] + b"\n\n"

    async def main():
        first_body = asyncio.Event()

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body":
                first_body.set()

        async def receive():
            await first_body.wait()
            return {"type": "http.disconnect"}

        response = EventStream(events(), stream.cancel, lambda: released.append(True))
        await asyncio.wait_for(response({"type": "http"}, receive, send), 5)

    asyncio.run(main())
    assert stream.cancelled and stream.closed and released == [True]
    assert [m.get("body") for m in sent[1:]] == [b"data: a\n\n"]


class FakeCall:
    """tritonclient's asyncio stream: (result, error) pairs, then the end; records cancel()."""

    def __init__(self, events):
        self.events = list(events)
        self.cancelled = False
        self.read_to_end = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.sleep(0)
        if not self.events:
            self.read_to_end = True
            raise StopAsyncIteration
        return self.events.pop(0)

    def cancel(self):
        self.cancelled = True


def _grpc_stream(call):
    import tritonclient.grpc.aio as grpcclient

    from pytriton.openai._backend import GrpcBackend, _GrpcStream

    backend = object.__new__(GrpcBackend)  # no channel: the stream only maps errors through it
    backend._grpc = grpcclient
    return _GrpcStream(backend, call, batching=False), grpcclient


def test_grpc_stream_after_an_error_response_is_read_to_its_end_not_cancelled():
    """Triton 2.51 can wedge a stream cancelled right after its final response (client/_decoupled.py)."""
    from tritonclient.utils import InferenceServerException

    call = FakeCall([(None, InferenceServerException("ValueError: boom")), ("late", None)])
    stream, _ = _grpc_stream(call)

    async def main():
        with pytest.raises(OpenAIError, match="boom"):
            async for _ in stream:
                pass
        stream.cancel()  # what the app does in its finally: a no-op here
        for _ in range(20):
            await asyncio.sleep(0)

    asyncio.run(main())
    assert call.read_to_end and not call.cancelled


def test_grpc_stream_left_early_is_cancelled_and_one_that_ended_is_not():
    class Result:
        def get_response(self):
            return type("R", (), {"outputs": []})()

    async def leave_early(call):
        stream, _ = _grpc_stream(call)
        async for _ in stream:
            break
        stream.cancel()

    async def read_all(call):
        stream, _ = _grpc_stream(call)
        async for _ in stream:
            pass
        stream.cancel()

    early, complete = FakeCall([(Result(), None), (Result(), None)]), FakeCall([(Result(), None)])
    asyncio.run(leave_early(early))
    asyncio.run(read_all(complete))
    assert early.cancelled and not complete.cancelled
