"""Request validation, the mapping onto model inputs/parameters, and response bodies and events (no server)."""

import base64
import json

import numpy as np
import pytest

from pytriton.exceptions import PyTritonBadParameterError
from pytriton.openai import ChatModel, EmbeddingModel
from pytriton.openai._errors import OpenAIError
from pytriton.openai._models import check_chat_model, check_embedding_model, model_info, plain_chat_template
from pytriton.openai._requests import (
    embedding_call,
    parse_chat,
    parse_completion,
    parse_embeddings,
    parse_json,
    text_call,
)
from pytriton.openai._responses import (
    DONE_EVENT,
    Answer,
    ChunkWriter,
    embedding_response,
    event,
    read_piece,
    text_response,
    total_usage,
)

CONFIG = {
    "max_batch_size": 4,
    "input": [
        {"name": "messages", "data_type": "TYPE_STRING", "dims": [1]},
        {"name": "max_new_tokens", "data_type": "TYPE_INT32", "dims": [1]},
    ],
    "output": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}],
    "model_transaction_policy": {"decoupled": True},
}
INFO = model_info(CONFIG)
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _error(function, body):
    with pytest.raises(OpenAIError) as caught:
        function(body)
    return caught.value


def test_model_info_reads_triton_json_config():
    assert INFO.inputs["messages"] == np.dtype(object)
    assert INFO.inputs["max_new_tokens"] == np.dtype(np.int32)
    assert list(INFO.outputs) == ["text"]
    assert INFO.batching and INFO.decoupled
    plain = model_info({"input": [], "output": []})
    assert not plain.batching and not plain.decoupled


def test_parse_json_refuses_non_objects():
    assert parse_json(b'{"a": 1}') == {"a": 1}
    for raw in (b"{", b"[1]", b"\xff"):
        error = _error(parse_json, raw)
        assert error.status == 400 and error.code == "invalid_json"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": MESSAGES}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": ["hi"]}, "messages[0]"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"model": "m", "messages": MESSAGES, "temperature": 3}, "temperature"),
        ({"model": "m", "messages": MESSAGES, "temperature": "hot"}, "temperature"),
        ({"model": "m", "messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "messages": MESSAGES, "max_tokens": True}, "max_tokens"),
        ({"model": "m", "messages": MESSAGES, "top_p": 1.5}, "top_p"),
        ({"model": "m", "messages": MESSAGES, "n": 0}, "n"),
        ({"model": "m", "messages": MESSAGES, "n": 17}, "n"),
        ({"model": "m", "messages": MESSAGES, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"model": "m", "messages": MESSAGES, "stream": "yes"}, "stream"),
        ({"model": "m", "messages": MESSAGES, "logprobs": True}, "logprobs"),
        ({"model": "m", "messages": MESSAGES, "tools": {"type": "function"}}, "tools"),
        ({"model": "m", "messages": MESSAGES, "tools": []}, "tools"),
        ({"model": "m", "messages": MESSAGES, "tools": ["f"]}, "tools[0]"),
        ({"model": "m", "messages": MESSAGES, "tools": [{"type": "function"}]}, "tools[0].function.name"),
        ({"model": "m", "messages": MESSAGES, "tool_choice": "auto"}, "tool_choice"),
        ({"model": "m", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
        (
            {"model": "m", "messages": MESSAGES, "tools": TOOLS, "tool_choice": {"function": {"name": "g"}}},
            "tool_choice",
        ),
        ({"model": "m", "messages": MESSAGES, "parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"model": "m", "messages": MESSAGES, "tools": TOOLS, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
        ({"model": "m", "messages": MESSAGES, "user": 7}, "user"),
    ],
)
def test_parse_chat_refuses_bad_fields_naming_them(body, param):
    error = _error(parse_chat, body)
    assert (error.status, error.kind, error.param) == (400, "invalid_request_error", param)


def test_parse_chat_normalises_the_options_it_knows_and_ignores_unknown_fields():
    request = parse_chat(
        {
            "model": "m", "messages": MESSAGES, "max_completion_tokens": 5, "temperature": 0, "stop": "END",
            "seed": 3, "stream": True, "stream_options": {"include_usage": True}, "some_future_field": 1,
        }
    )  # fmt: skip
    assert request.options == {"max_tokens": 5, "temperature": 0.0, "stop": ["END"], "seed": 3}
    assert request.stream and request.include_usage and request.chat and request.n == 1
    assert request.prompts == [MESSAGES]


def test_messages_go_as_json_and_fields_as_parameters_or_mapped_inputs():
    spec = ChatModel("m", "bound", inputs={"max_tokens": "max_new_tokens"})
    tools = [{"type": "function", "function": {"name": "f"}}]
    request = parse_chat(
        {"model": "m", "messages": MESSAGES, "max_tokens": 7, "top_p": 0.5, "stop": ["x"], "tools": tools}
    )
    call = text_call(spec, INFO, request, request.prompts[0])
    assert json.loads(call.inputs["messages"][0]) == MESSAGES
    assert call.inputs["max_new_tokens"].dtype == np.int32 and call.inputs["max_new_tokens"].tolist() == [7]
    assert call.parameters == {"top_p": 0.5, "stop": '["x"]', "tools": json.dumps(tools)}


def test_tool_fields_reach_the_model_as_declared_at_bind():
    info = model_info(
        {**CONFIG, "input": [*CONFIG["input"], {"name": "tool_specs", "data_type": "TYPE_STRING", "dims": [1]}]}
    )
    choice = {"type": "function", "function": {"name": "f"}}
    body = {"model": "m", "messages": MESSAGES, "tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": False}
    request = parse_chat(body)
    assert request.options == {"tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": False}
    mapped = text_call(ChatModel("m", "b", inputs={"tools": "tool_specs"}), info, request, MESSAGES)
    assert json.loads(mapped.inputs["tool_specs"][0]) == TOOLS
    assert mapped.parameters == {"tool_choice": json.dumps(choice), "parallel_tool_calls": False}
    plain = text_call(ChatModel("m", "b"), info, parse_chat({**body, "tool_choice": "required"}), MESSAGES)
    assert plain.parameters == {"tools": json.dumps(TOOLS), "tool_choice": "required", "parallel_tool_calls": False}
    error = _error(parse_completion, {"model": "m", "prompt": "x", "tools": TOOLS})
    assert (error.status, error.param, error.code) == (400, "tools", "unsupported_parameter")


def test_a_chat_template_renders_messages_into_the_prompt_input():
    info = model_info({"input": [{"name": "prompt", "data_type": "TYPE_STRING"}], "output": [{"name": "text"}]})
    request = parse_chat({"model": "m", "messages": MESSAGES})
    default = text_call(ChatModel("m", "b"), info, request, MESSAGES)
    assert default.inputs["prompt"][0].decode() == "system: be brief\nuser: hi\nassistant:"
    assert plain_chat_template([{"role": "user", "content": [{"type": "text", "text": "a"}]}]) == "user: a\nassistant:"
    custom = text_call(ChatModel("m", "b", chat_template=lambda ms: ms[-1]["content"]), info, request, MESSAGES)
    assert custom.inputs["prompt"][0] == b"hi"


def test_completions_prompt_goes_to_the_prompt_input_or_becomes_a_user_message():
    request = parse_completion({"model": "m", "prompt": ["a", "b"], "n": 2})
    assert request.prompts == ["a", "b"] and request.n == 2 and not request.chat
    as_message = text_call(ChatModel("m", "b"), INFO, request, "a")
    assert json.loads(as_message.inputs["messages"][0]) == [{"role": "user", "content": "a"}]
    info = model_info({"input": [{"name": "prompt", "data_type": "TYPE_STRING"}], "output": [{"name": "text"}]})
    assert text_call(ChatModel("m", "b"), info, request, "a").inputs["prompt"].tolist() == [b"a"]
    for body, param in (
        ({"model": "m", "prompt": [1, 2]}, "prompt"),
        ({"model": "m", "prompt": "a", "echo": True}, "echo"),
        ({"model": "m", "prompt": [], "stream": True}, "prompt"),
        ({"model": "m", "prompt": "a", "best_of": 2}, "best_of"),
        ({"model": "m", "prompt": ["a"] * 9, "n": 2}, "n"),
    ):
        assert _error(parse_completion, body).param == param
    several = parse_completion({"model": "m", "prompt": ["a", "b"], "n": 2, "stream": True})
    assert several.stream and several.prompts == ["a", "b"] and several.n == 2


def test_embeddings_requests():
    request = parse_embeddings({"model": "e", "input": "hello", "encoding_format": "base64"})
    assert request.texts == ["hello"] and request.encoding_format == "base64"
    assert embedding_call(EmbeddingModel("e", "b"), "hello").inputs["input"].tolist() == [b"hello"]
    for body, param in (
        ({"model": "e", "input": [[1, 2]]}, "input"),
        ({"model": "e", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "e", "input": "x", "dimensions": 8}, "dimensions"),
    ):
        assert _error(parse_embeddings, body).param == param


def test_declarations_are_checked_against_the_bound_model():
    with pytest.raises(PyTritonBadParameterError, match="unknown OpenAI fields"):
        ChatModel("m", "b", inputs={"colour": "x"})
    with pytest.raises(PyTritonBadParameterError, match="non-empty name"):
        ChatModel("", "b")
    check_chat_model(ChatModel("m", "b"), INFO)
    with pytest.raises(PyTritonBadParameterError, match="neither the messages input"):
        check_chat_model(ChatModel("m", "b", messages_input="msgs"), INFO)
    with pytest.raises(PyTritonBadParameterError, match="no output 'answer'"):
        check_chat_model(ChatModel("m", "b", text_output="answer"), INFO)
    with pytest.raises(PyTritonBadParameterError, match="lacks"):
        check_chat_model(ChatModel("m", "b", inputs={"seed": "rng"}), INFO)
    with pytest.raises(PyTritonBadParameterError, match="needs the input 'input'"):
        check_embedding_model(EmbeddingModel("e", "b"), INFO)


def test_read_piece_and_usage():
    spec = ChatModel("m", "b")
    piece = read_piece(spec, {"text": np.array([b"hi "], dtype=object), "completion_tokens": np.array([2])})
    assert (piece.text, piece.finish_reason, piece.completion_tokens) == ("hi ", None, 2)
    assert read_piece(spec, {}).text == ""
    with pytest.raises(OpenAIError, match="UTF-8") as caught:
        read_piece(spec, {"text": np.array([b"\xff"], dtype=object)})
    assert caught.value.status == 500
    answers = [Answer("a", None, 3, 1), Answer("b", "length", 3, 2)]
    assert total_usage(answers, 2) == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert total_usage([Answer("a")], 1) is None
    body = text_response(True, "m", answers, 2)
    assert body["object"] == "chat.completion" and body["usage"]["total_tokens"] == 6
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    assert body["choices"][1]["message"] == {"role": "assistant", "content": "b"}
    assert text_response(False, "m", [Answer("x")], 1)["choices"][0]["text"] == "x"


def _tool_outputs(items):
    return {"text": np.array([b""], dtype=object), "tool_calls": np.array([json.dumps(items).encode()], dtype=object)}


def test_tool_calls_are_read_numbered_and_continued():
    spec = ChatModel("m", "b")
    answer = Answer()
    first = read_piece(spec, _tool_outputs([{"function": {"name": "f", "arguments": '{"a": '}}]))
    [delta] = answer.add(first)
    assert delta["index"] == 0 and delta["id"].startswith("call-") and delta["type"] == "function"
    assert delta["function"] == {"name": "f", "arguments": '{"a": '}
    more = [
        {"index": 0, "function": {"arguments": "1}"}},
        {"id": "c2", "function": {"name": "g", "arguments": {"x": 2}}},
    ]
    assert answer.add(read_piece(spec, _tool_outputs(more))) == [
        {"index": 0, "function": {"arguments": "1}"}},
        {"index": 1, "id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"x": 2}'}},
    ]
    assert [call["function"] for call in answer.tool_calls] == [
        {"name": "f", "arguments": '{"a": 1}'},
        {"name": "g", "arguments": '{"x": 2}'},
    ]
    assert answer.reason(chat=True) == "tool_calls" and answer.reason(chat=False) == "stop"
    assert answer.message() == {"role": "assistant", "content": None, "tool_calls": answer.tool_calls}
    body = text_response(True, "m", [answer], 1)
    assert body["choices"][0]["finish_reason"] == "tool_calls" and body["choices"][0]["message"]["content"] is None
    assert read_piece(spec, {"tool_calls": np.array([b""], dtype=object)}).tool_calls == []  # empty: no call
    assert Answer("x").message() == {"role": "assistant", "content": "x"}  # no tool_calls key without calls


@pytest.mark.parametrize(
    "raw",
    [b"not json", b'"f"', b'[{"name": "f"}]', b'[{"function": {"name": 3}}]', b'[{"index": -1, "function": {}}]'],
)
def test_malformed_tool_calls_are_a_model_failure(raw):
    with pytest.raises(OpenAIError) as caught:
        read_piece(ChatModel("m", "b"), {"tool_calls": np.array([raw], dtype=object)})
    assert caught.value.status == 500 and "tool_calls" in caught.value.message


def test_a_new_tool_call_must_take_the_next_index():
    answer = Answer()
    with pytest.raises(OpenAIError, match="index 2 after 0 calls"):
        answer.add(read_piece(ChatModel("m", "b"), _tool_outputs([{"index": 2, "function": {"name": "f"}}])))


def _events(raw: bytes):
    assert raw.endswith(b"\n\n")
    return [part[len(b"data: ") :] for part in raw.split(b"\n\n")[:-1]]


def test_event_format_is_exactly_openais():
    assert event({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()
    assert DONE_EVENT == b"data: [DONE]\n\n"


def test_chat_chunks_open_with_the_role_and_close_with_reason_usage_and_done():
    writer = ChunkWriter(True, "m", include_usage=True)
    first = json.loads(_events(writer.start())[0])
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "",
    }
    assert writer.piece(0, "") == b""
    middle = json.loads(_events(writer.piece(0, "tok"))[0])
    assert middle["choices"][0] == {"index": 0, "delta": {"content": "tok"}, "logprobs": None, "finish_reason": None}
    answer = Answer("tok", None, 2, 1)
    closing = json.loads(_events(writer.close(0, answer))[0])
    usage_chunk, done = _events(writer.end([answer], 1))
    usage_chunk = json.loads(usage_chunk)
    assert closing["choices"][0]["finish_reason"] == "stop" and closing["usage"]["total_tokens"] == 3
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 1
    assert done == b"[DONE]"
    assert len({first["id"], middle["id"], closing["id"]}) == 1


def test_chunks_of_several_choices_carry_their_index_and_usage_only_at_the_end():
    writer = ChunkWriter(True, "m", include_usage=True, choices=2)
    opening = [json.loads(raw) for raw in _events(writer.start())]
    assert [chunk["choices"][0]["index"] for chunk in opening] == [0, 1]
    tool = {"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}
    chunk = json.loads(_events(writer.piece(1, "", [tool]))[0])
    assert chunk["choices"][0]["index"] == 1 and chunk["choices"][0]["delta"] == {"tool_calls": [tool]}
    answers = [Answer("a", None, 2, 1), Answer("b", "length", 2, 3)]
    closing = json.loads(_events(writer.close(1, answers[1]))[0])
    assert closing["choices"][0]["finish_reason"] == "length" and "usage" not in closing
    usage_chunk, _ = _events(writer.end(answers, 2))
    assert json.loads(usage_chunk)["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}


def test_completion_chunks_carry_text_and_no_usage_when_the_model_reports_none():
    writer = ChunkWriter(False, "m", include_usage=False)
    assert writer.start() == b""
    chunk = json.loads(_events(writer.piece(0, "x"))[0])
    assert chunk["object"] == "text_completion" and chunk["choices"][0]["text"] == "x"
    closing = _events(writer.close(0, Answer("x")))[0]
    assert "usage" not in json.loads(closing) and writer.end([Answer("x")], 1) == DONE_EVENT


def test_embedding_body_float_and_base64():
    vector = np.array([0.5, -1.0, 2.0], dtype=np.float32)
    as_float = embedding_response("e", [vector], "float", 4)
    assert as_float["data"][0]["embedding"] == [0.5, -1.0, 2.0] and as_float["usage"]["prompt_tokens"] == 4
    encoded = embedding_response("e", [vector], "base64", None)["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(encoded), dtype="<f4").tolist() == [0.5, -1.0, 2.0]


def test_a_model_without_token_counts_gets_zero_usage_and_one_warning_per_model(caplog, monkeypatch):
    from pytriton.openai import _responses

    monkeypatch.setattr(_responses, "_UNCOUNTED", set())
    with caplog.at_level("WARNING", logger="pytriton.openai"):
        for _ in range(3):
            body = text_response(True, "NoCounts", [Answer("hi")], 1)
            assert body["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        stream_end = ChunkWriter(True, "NoCounts2", include_usage=True).end([Answer("hi")], 1)
        assert json.loads(_events(stream_end)[0])["usage"]["total_tokens"] == 0
        counted = text_response(True, "Counted", [Answer("hi", prompt_tokens=3, completion_tokens=2)], 1)
        assert counted["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    warned = [r.getMessage() for r in caplog.records if r.name == "pytriton.openai"]
    assert len(warned) == 2, warned  # once for each model without counts, none for the one with counts
    assert "Model 'NoCounts' reports no token counts" in warned[0] and "prompt_tokens" in warned[0]
