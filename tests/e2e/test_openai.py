"""The OpenAI frontend against real Tritons: the official ``openai`` client (sync and async), curl and raw
httpx, over gRPC to a launched server and in-process to an embedded one.

Models: those of examples/openai_chat.py (an ordinary and a decoupled chat model, an embedding
model) plus a slow streaming model that records when its generator is closed, and one that fails;
the chat, slow and failing models also on backend instances (the tests taking ``kind``,
tests/e2e/_kinds.py).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import pathlib
import shutil
import socket
import subprocess
import uuid

import httpx
import numpy as np
import openai
import pytest

from examples import openai_chat as importable
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.openai import ChatModel, OpenAIFrontend
from pytriton.triton import Triton, TritonConfig
from tests.conftest import needs_stub_strings, triton_ports, wait_for
from tests.e2e._kinds import KINDS, model
from tests.e2e.kind_models import SLOW_TOKENS, SlowStream, gives_up

pytestmark = needs_stub_strings

_spec = importlib.util.spec_from_file_location(
    "openai_chat_example", pathlib.Path(__file__).parents[2] / "examples" / "openai_chat.py"
)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

KEY = "test-key-" + uuid.uuid4().hex
MESSAGES = [{"role": "user", "content": "one two three"}]
# The callables run on each instance kind (tests/e2e/_kinds.py): the chat model as "tiny-chat" and
# "tiny-chat_backend", the others as "<name>" and "<name>_backend".
KIND_MODELS = ("slow", "fails")


def _bind(triton: Triton, notes: pathlib.Path):
    models = example.bind_models(triton)
    messages = [Tensor(name="messages", shape=(1,), dtype=bytes)]
    text = [Tensor(name="text", shape=(1,), dtype=bytes)]
    # The example's chat models again on backend instances: its stubs import them as examples.openai_chat.
    chat = ChatModel("tiny-chat_backend", model="chat_backend", stream_model="chat_stream_backend")
    for name, infer_func, max_batch_size in (("chat", importable.chat, 8), ("chat_stream", importable.chat_stream, 1)):
        config = ModelConfig(max_batch_size=max_batch_size, decoupled=name == "chat_stream")
        triton.bind(
            model(name, "backend"), infer_func, messages, example.TEXT_OUTPUTS, config=config, instance_kind="backend"
        )
    for kind in KINDS:
        config = ModelConfig(max_batch_size=1, decoupled=True)
        slow = batch(SlowStream(str(notes)))
        triton.bind(model("slow", kind), slow, messages, text, config=config, instance_kind=kind)
        config = ModelConfig(max_batch_size=1)
        triton.bind(model("fails", kind), gives_up, messages, text, config=config, instance_kind=kind)
    triton.bind("gone", gives_up, messages, text, config=ModelConfig(max_batch_size=1))  # unbound by the last test
    own = [ChatModel(model(name, kind), model(name, kind)) for name in KIND_MODELS for kind in KINDS]
    return [*models, chat, *own, ChatModel("gone", "gone")]


def _closed(frontend, tag):
    """How many tokens the slow generator of ``tag`` had yielded when it was closed; None while it is not."""
    path = frontend.notes / f"{tag}.closed"
    return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture(scope="module", params=["grpc", "inprocess"])
def frontend(request, tmp_path_factory):
    """One Triton per backend (launched: gRPC; embedded: in-process), with a keyed frontend in front."""
    embedded = request.param == "inprocess"
    triton = Triton(embedded=True) if embedded else Triton(config=TritonConfig(**triton_ports()))
    notes = tmp_path_factory.mktemp("openai")  # where the slow generators note their closing
    try:
        models = _bind(triton, notes)
        triton.run()
        with OpenAIFrontend(triton, models, port=0, api_key=KEY) as served:
            served.triton = triton
            served.models = models
            served.notes = notes
            yield served
    finally:
        triton.stop()


def _client(frontend, **kwargs):
    return openai.OpenAI(base_url=frontend.url, api_key=KEY, max_retries=0, timeout=30, **kwargs)


def _tag() -> str:
    return "tag-" + uuid.uuid4().hex


def test_model_list(frontend):
    client = _client(frontend)
    assert sorted(model.id for model in client.models.list()) == [
        "fails", "fails_backend", "gone", "slow", "slow_backend", "tiny-chat", "tiny-chat_backend", "tiny-embed"
    ]  # fmt: skip
    assert client.models.retrieve("tiny-chat").owned_by == "pytriton"


def test_chat_sync(frontend, kind):
    client = _client(frontend)
    answer = client.chat.completions.create(model=model("tiny-chat", kind), messages=MESSAGES)
    assert answer.choices[0].message.content == "You said: one two three"
    assert answer.choices[0].finish_reason == "stop"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (3, 5)
    short = client.chat.completions.create(model=model("tiny-chat", kind), messages=MESSAGES, max_tokens=2, n=2)
    assert [c.message.content for c in short.choices] == ["You said: ", "You said: "]
    assert {c.finish_reason for c in short.choices} == {"length"}


def test_chat_stream_sync(frontend, kind):
    client = _client(frontend)
    chunks = list(
        client.chat.completions.create(
            model=model("tiny-chat", kind), messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert pieces == ["You ", "said: ", "one ", "two ", "three"]
    assert chunks[0].choices[0].delta.role == "assistant"
    closing = [c for c in chunks if c.choices and c.choices[0].finish_reason][0]
    assert closing.choices[0].finish_reason == "stop" and closing.usage.total_tokens == 8
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5


def test_completions_sync_and_stream(frontend):
    client = _client(frontend)
    answer = client.completions.create(model="tiny-chat", prompt="hello there")
    assert answer.choices[0].text == "You said: hello there" and answer.object == "text_completion"
    pieces = [c.choices[0].text for c in client.completions.create(model="tiny-chat", prompt="hi", stream=True)]
    assert "".join(pieces) == "You said: hi"


def test_embeddings(frontend):
    client = _client(frontend)
    as_base64 = client.embeddings.create(model="tiny-embed", input=["hello world", "world hello", "other"])
    vectors = [np.array(item.embedding) for item in as_base64.data]
    assert len(vectors) == 3 and len(vectors[0]) == example.EMBEDDING_DIM
    assert np.allclose(vectors[0], vectors[1]) and not np.allclose(vectors[0], vectors[2])
    assert as_base64.usage.prompt_tokens == 5
    as_float = client.embeddings.create(model="tiny-embed", input="hello world", encoding_format="float")
    assert np.allclose(as_float.data[0].embedding, vectors[0], atol=1e-6)


def test_async_client(frontend):
    async def main():
        async with openai.AsyncOpenAI(base_url=frontend.url, api_key=KEY, max_retries=0, timeout=30) as client:
            answers = await asyncio.gather(
                *(
                    client.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": f"n{i}"}])
                    for i in range(4)
                )
            )
            stream = await client.chat.completions.create(model="tiny-chat", messages=MESSAGES, stream=True)
            pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
            embedding = await client.embeddings.create(model="tiny-embed", input="x y")
            return answers, pieces, embedding

    answers, pieces, embedding = asyncio.run(main())
    assert [a.choices[0].message.content for a in answers] == [f"You said: n{i}" for i in range(4)]
    assert "".join(pieces) == "You said: one two three"
    assert len(embedding.data[0].embedding) == example.EMBEDDING_DIM


TOOLS = [
    {"type": "function", "function": {"name": "shout", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "whisper", "parameters": {"type": "object"}}},
]


def _tool_round_trip(client, tools_answer, expected_name):
    """Check the tool call of ``tools_answer`` and send the tool's result back: the model repeats it."""
    message = tools_answer.choices[0].message
    # None in an answer; "" when accumulated from a stream (its opening chunk cannot know there will be no text).
    assert tools_answer.choices[0].finish_reason == "tool_calls" and not message.content
    [call] = message.tool_calls
    assert call.type == "function" and call.function.name == expected_name and call.id
    assert json.loads(call.function.arguments) == {"text": "one two three"}
    follow_up = [
        *MESSAGES,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "ONE"},
    ]
    return follow_up


def test_tool_calls_sync(frontend):
    client = _client(frontend)
    answer = client.chat.completions.create(model="tiny-chat", messages=MESSAGES, tools=TOOLS)
    assert answer.choices[0].message.content is None
    follow_up = _tool_round_trip(client, answer, "shout")
    final = client.chat.completions.create(model="tiny-chat", messages=follow_up, tools=TOOLS)
    assert final.choices[0].message.content == "The tool said: ONE" and final.choices[0].finish_reason == "stop"
    assert not final.choices[0].message.tool_calls
    # Streamed: the model sends the call's arguments in two pieces; the SDK's own accumulator joins them.
    from openai.lib.streaming.chat import ChatCompletionStreamState

    state = ChatCompletionStreamState()
    chunks = list(client.chat.completions.create(model="tiny-chat", messages=MESSAGES, tools=TOOLS, stream=True))
    for chunk in chunks:
        state.handle_chunk(chunk)
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(deltas) == 2 and deltas[1][0].index == 0 and deltas[1][0].id is None
    _tool_round_trip(client, state.get_final_completion(), "shout")
    # tool_choice "none": an ordinary answer.
    plain = client.chat.completions.create(model="tiny-chat", messages=MESSAGES, tools=TOOLS, tool_choice="none")
    assert plain.choices[0].message.content == "You said: one two three" and not plain.choices[0].message.tool_calls


def test_tool_calls_async(frontend):
    choice = {"type": "function", "function": {"name": "whisper"}}

    async def main():
        async with openai.AsyncOpenAI(base_url=frontend.url, api_key=KEY, max_retries=0, timeout=30) as client:
            answer = await client.chat.completions.create(
                model="tiny-chat", messages=MESSAGES, tools=TOOLS, tool_choice=choice
            )
            stream = await client.chat.completions.create(
                model="tiny-chat", messages=MESSAGES, tools=TOOLS, tool_choice=choice, stream=True
            )
            calls = {}
            reasons = []
            async for chunk in stream:
                for delta in chunk.choices[0].delta.tool_calls or []:
                    known = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
                    known["name"] += delta.function.name or ""
                    known["arguments"] += delta.function.arguments or ""
                reasons.append(chunk.choices[0].finish_reason)
            follow_up = _tool_round_trip(client, answer, "whisper")
            final = await client.chat.completions.create(model="tiny-chat", messages=follow_up, stream=True)
            pieces = [chunk.choices[0].delta.content or "" async for chunk in final]
            return calls, reasons, "".join(pieces)

    calls, reasons, final = asyncio.run(main())
    assert list(calls) == [0] and calls[0]["id"] and calls[0]["name"] == "whisper"
    assert json.loads(calls[0]["arguments"]) == {"text": "one two three"}
    assert reasons[-1] == "tool_calls" and final == "The tool said: ONE"


def test_n_choices_streamed(frontend):
    client = _client(frontend)
    pieces = {}
    reasons = {}
    stream = client.chat.completions.create(
        model="tiny-chat", messages=MESSAGES, n=3, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    for chunk in chunks:
        for choice in chunk.choices:
            pieces[choice.index] = pieces.get(choice.index, "") + (choice.delta.content or "")
            reasons[choice.index] = choice.finish_reason or reasons.get(choice.index)
    assert pieces == {index: "You said: one two three" for index in range(3)} and set(reasons.values()) == {"stop"}
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (3, 15)
    completions = client.completions.create(model="tiny-chat", prompt=["a b", "c"], n=2, stream=True)
    texts = {}
    for chunk in completions:
        texts[chunk.choices[0].index] = texts.get(chunk.choices[0].index, "") + chunk.choices[0].text
    assert texts == {0: "You said: a b", 1: "You said: a b", 2: "You said: c", 3: "You said: c"}


def test_errors_through_the_openai_client(frontend, kind):
    client = _client(frontend)
    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="tiny-chat", messages=[])
    assert bad.value.param == "messages"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=frontend.url, api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model=model("fails", kind), messages=MESSAGES)
    assert "ValueError: the model gave up" in failed.value.message
    assert "Traceback" not in failed.value.response.text and ".py" not in failed.value.response.text
    with pytest.raises(openai.InternalServerError):
        list(client.chat.completions.create(model=model("fails", kind), messages=MESSAGES, stream=True))


def test_overload_is_429(frontend):
    """A frontend with room for one request: a second one while a stream is open is refused at once."""
    with OpenAIFrontend(frontend.triton, frontend.models, port=0, max_in_flight=1) as single:
        client = openai.OpenAI(base_url=single.url, api_key="none", max_retries=0, timeout=30)
        tag = _tag()
        stream = client.chat.completions.create(model="slow", messages=[{"role": "user", "content": tag}], stream=True)
        try:
            next(iter(stream))
            with pytest.raises(openai.RateLimitError) as limited:
                client.chat.completions.create(model="tiny-chat", messages=MESSAGES)
            assert limited.value.code == "rate_limit_exceeded"
            if shutil.which("curl"):
                status, error = curl_error(
                    f"{single.url}/chat/completions", {"model": "tiny-chat", "messages": MESSAGES}
                )
                assert (status, error["type"]) == (429, "rate_limit_error")
        finally:
            stream.close()
        assert wait_for(lambda: _closed(frontend, tag) is not None, 10)
        assert client.chat.completions.create(model="tiny-chat", messages=MESSAGES).choices[0].message.content


def test_a_stream_cancelled_halfway_closes_the_generator(frontend, kind):
    client = _client(frontend)
    tag = _tag()
    stream = client.chat.completions.create(
        model=model("slow", kind), messages=[{"role": "user", "content": tag}], stream=True
    )
    received = 0
    for chunk in stream:
        received += bool(chunk.choices and chunk.choices[0].delta.content)
        if received == 5:
            break
    stream.close()  # the client disconnects
    assert wait_for(lambda: _closed(frontend, tag) is not None, 10), "the model's generator was not closed"
    # Closed early (GeneratorExit at a yield), not run to its end: a window of responses at most.
    assert 5 <= _closed(frontend, tag) < SLOW_TOKENS - 1


def test_a_non_stream_request_left_by_its_client_stops_the_generation(frontend, kind):
    """A non-streaming request to a decoupled model: the client disconnects mid-generation, the generator is closed."""
    tag = _tag()
    body = json.dumps({"model": model("slow", kind), "messages": [{"role": "user", "content": tag}]}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", frontend.port), timeout=30) as sock:
        sock.sendall(head.encode() + body)
        assert wait_for(lambda: (frontend.notes / f"{tag}.started").exists(), 30), "the model never started"
    # The socket is closed: the client left. Before, the generation ran to its end (SLOW_TOKENS - 1).
    healthy = _client(frontend).chat.completions.create(model="tiny-chat", messages=MESSAGES)
    assert healthy.choices[0].message.content == "You said: one two three"
    assert wait_for(lambda: _closed(frontend, tag) is not None, 15), "the model's generator was not closed"
    assert _closed(frontend, tag) < SLOW_TOKENS - 1


def test_hostile_bodies_are_refused_cleanly(frontend, caplog):
    """Lone surrogates and deep nesting are 400 (were 500 ``model_error`` from the model), a body over the
    limit 413, a long model name is not echoed whole; nothing is logged; healthy requests pass beside them."""
    url = frontend.url + "/chat/completions"
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    start = b'{"model": "tiny-chat", "messages": [{"role": "user", "content": '
    bodies = {
        "surrogate": start + b'"one \\ud800 two"}]}',
        "nesting": start + b'"x", "extra": ' + b"[" * 900 + b"]" * 900 + b"}]}",
    }
    client = _client(frontend)
    with caplog.at_level(logging.WARNING, logger="pytriton"):
        for name, body in bodies.items():
            response = httpx.post(url, content=body, headers=headers, timeout=30)
            assert response.status_code == 400, (name, response.text)
            assert response.json()["error"]["code"] == "invalid_json"
            assert client.chat.completions.create(model="tiny-chat", messages=MESSAGES).choices[0].message.content
        long_name = httpx.post(url, json={"model": "m" * 100_000, "messages": MESSAGES}, headers=headers, timeout=30)
        assert long_name.status_code == 404 and len(long_name.content) < 1000
        with pytest.raises(openai.APIStatusError) as too_large:
            client.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": "x" * (17 << 20)}])
        assert too_large.value.status_code == 413 and too_large.value.code == "request_too_large"
        assert client.chat.completions.create(model="tiny-chat", messages=MESSAGES).choices[0].message.content
    assert not [record for record in caplog.records if record.name.startswith("pytriton.openai")]


def test_raw_httpx_stream_format_and_errors(frontend):
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "tiny-chat", "messages": MESSAGES, "stream": True}
    with httpx.Client(base_url=frontend.url, headers=headers, timeout=30) as client:
        with client.stream("POST", "/chat/completions", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            raw = response.read()
        _check_event_stream(raw)
        assert client.post("/chat/completions", content=b"{").json()["error"]["code"] == "invalid_json"
        assert client.get("/models", headers={"Authorization": "Bearer no"}).status_code == 401
        # Nothing of Triton's own API is reachable through the frontend.
        root = frontend.url[: -len("/v1")]
        assert client.post(root + "/v2/repository/index").status_code == 404
        assert client.get(root + "/v2/models/chat/config").json()["error"]["type"] == "not_found_error"
        health = httpx.get(frontend.url.replace("/v1", "/health"), timeout=30)
        assert health.json() == {"status": "ok"}


def _check_event_stream(raw: bytes) -> None:
    assert raw.endswith(b"\n\ndata: [DONE]\n\n")
    events = raw.split(b"\n\n")[:-1]
    assert all(event.startswith(b"data: ") for event in events)
    chunks = [json.loads(event[6:]) for event in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "You said: one two three"
    assert chunks[-1]["usage"]["total_tokens"] == 8


needs_curl = pytest.mark.skipif(
    shutil.which("curl") is None, reason="curl is not installed (apt-get install curl); raw httpx covers the same"
)


def curl(*args, key=KEY):
    command = ["curl", "-sS", "-N", "--max-time", "30", "-H", f"Authorization: Bearer {key}", *args]
    return subprocess.run(command, capture_output=True, timeout=60, check=True).stdout


def curl_error(url, body=None, key=KEY):
    """(HTTP status, OpenAI error object) of a failing request sent by curl; checks there is no stack trace."""
    data = (
        []
        if body is None
        else ["-H", "Content-Type: application/json", "-d", body if isinstance(body, str) else json.dumps(body)]
    )
    raw = curl("-w", "\n%{http_code}", *data, url, key=key)
    payload, _, status = raw.rpartition(b"\n")
    assert b"Traceback" not in payload and b'.py"' not in payload and b".py'" not in payload, payload
    error = json.loads(payload)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return int(status), error


@needs_curl
def test_curl_errors(frontend):
    url = f"{frontend.url}/chat/completions"
    assert curl_error(url, {"model": "x", "messages": MESSAGES})[0] == 404
    status, error = curl_error(url, "{not json")
    assert (status, error["code"]) == (400, "invalid_json")
    status, error = curl_error(url, {"model": "tiny-chat", "messages": MESSAGES, "temperature": 9})
    assert (status, error["param"]) == (400, "temperature")
    status, error = curl_error(url, {"model": "tiny-chat", "messages": MESSAGES, "tool_choice": "auto"})
    assert (status, error["param"]) == (400, "tool_choice")
    status, error = curl_error(f"{frontend.url}/models", key="wrong")
    assert (status, error["code"]) == (401, "invalid_api_key")
    status, error = curl_error(url, {"model": "fails", "messages": MESSAGES})
    assert (status, error["type"]) == (500, "server_error") and "ValueError: the model gave up" in error["message"]
    # A streamed request whose model fails before its first token keeps the status too.
    status, error = curl_error(url, {"model": "fails", "messages": MESSAGES, "stream": True})
    assert (status, error["type"]) == (500, "server_error")


@needs_curl
def test_curl(frontend):
    post = ["-H", "Content-Type: application/json", "-d"]
    body = {"model": "tiny-chat", "messages": MESSAGES}
    _check_event_stream(curl(*post, json.dumps({**body, "stream": True}), f"{frontend.url}/chat/completions"))
    answer = json.loads(curl(*post, json.dumps(body), f"{frontend.url}/chat/completions"))
    assert answer["choices"][0]["message"]["content"] == "You said: one two three"
    embedding = json.loads(curl(*post, json.dumps({"model": "tiny-embed", "input": "a"}), f"{frontend.url}/embeddings"))
    assert len(embedding["data"][0]["embedding"]) == example.EMBEDDING_DIM
    assert [m["id"] for m in json.loads(curl(f"{frontend.url}/models"))["data"]][0] == "fails"
    missing = json.loads(curl(*post, json.dumps({**body, "model": "x"}), f"{frontend.url}/chat/completions"))
    assert missing["error"]["code"] == "model_not_found"


def test_a_model_unbound_under_the_frontend_is_503_and_health_says_so(frontend):
    """Runs last for each Triton: it unbinds a model the frontend serves."""
    frontend.triton.unbind("gone")
    client = _client(frontend)
    with pytest.raises(openai.InternalServerError) as unavailable:
        client.chat.completions.create(model="gone", messages=MESSAGES)
    assert unavailable.value.status_code == 503 and unavailable.value.code == "service_unavailable"
    if shutil.which("curl"):
        status, error = curl_error(f"{frontend.url}/chat/completions", {"model": "gone", "messages": MESSAGES})
        assert (status, error["code"]) == (503, "service_unavailable")
    health = httpx.get(frontend.url.replace("/v1", "/health"), timeout=30)
    assert health.status_code == 503 and health.json()["models_not_ready"] == ["gone"]
    assert client.chat.completions.create(model="tiny-chat", messages=MESSAGES).choices[0].message.content
