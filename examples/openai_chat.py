"""OpenAI-compatible endpoints for plain Python models: a tiny numpy chat model that streams tokens,
and an embedding model, served to OpenAI's own client.

Run: ``python examples/openai_chat.py`` (after ``make server``; needs ``pip install pytriton[openai]``
and, for the client part, ``pip install openai``). No weights: the "chat model" answers by echoing
the last user message word by word, the "embedding model" hashes words into a 16-dimensional vector.
Given ``tools``, the chat model calls the first one (or the one ``tool_choice`` names) with the last
user message as its ``text`` argument, and once a tool has answered it repeats what the tool said.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from pytriton.decorators import batch, current_requests
from pytriton.model_config import ModelConfig, Tensor
from pytriton.openai import ChatModel, EmbeddingModel, OpenAIFrontend
from pytriton.triton import Triton, TritonConfig  # ports: 8000-8002, or PYTRITON_TRITON_CONFIG_*_PORT

EMBEDDING_DIM = 16


def reply_tokens(messages: List[Dict[str, Any]]) -> List[str]:
    """The "model": tokens (words with their trailing space) of an answer echoing the last user message."""
    last = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
    return re.findall(r"\S+\s*", f"You said: {last}")


def tool_call(messages: List[Dict[str, Any]], parameters: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The tool call the "model" makes: when tools are offered and the last message is the user's, else None."""
    tools = json.loads(parameters.get("tools", "[]"))
    choice = parameters.get("tool_choice", "auto")
    if not tools or choice == "none" or messages[-1].get("role") != "user":
        return None
    name = tools[0]["function"]["name"]
    if choice.startswith("{"):  # {"type": "function", "function": {"name": ...}}
        name = json.loads(choice)["function"]["name"]
    return {"function": {"name": name, "arguments": json.dumps({"text": messages[-1].get("content") or ""})}}


def _generation(messages_json: bytes, parameters: Dict[str, Any]) -> Dict[str, Any]:
    messages = json.loads(messages_json)
    call = tool_call(messages, parameters)
    if messages[-1].get("role") == "tool":
        tokens = re.findall(r"\S+\s*", f"The tool said: {messages[-1].get('content') or ''}")
    else:
        tokens = [] if call else reply_tokens(messages)
    limit = int(parameters.get("max_tokens", 256))
    prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in messages)
    finish = "length" if len(tokens) > limit else "tool_calls" if call else "stop"
    return {"tokens": tokens[:limit], "finish": finish, "prompt": prompt_tokens, "call": call}


def _row(value: Any, dtype: Any) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


@batch
def chat(messages: np.ndarray) -> Dict[str, np.ndarray]:
    """Ordinary model: the whole answer at once (one row per request of the batch)."""
    rows = [_generation(row[0], request.parameters or {}) for row, request in zip(messages, current_requests())]
    return {
        "text": np.array([["".join(g["tokens"]).encode()] for g in rows], dtype=object),
        "finish_reason": np.array([[g["finish"].encode()] for g in rows], dtype=object),
        "prompt_tokens": np.array([[g["prompt"]] for g in rows], dtype=np.int32),
        "completion_tokens": np.array([[len(g["tokens"])] for g in rows], dtype=np.int32),
        # JSON text of a list of tool calls; empty when the row calls none.
        "tool_calls": np.array([[json.dumps([g["call"]]).encode() if g["call"] else b""] for g in rows], dtype=object),
    }


@batch
def chat_stream(messages: np.ndarray) -> Iterator[Dict[str, np.ndarray]]:
    """Decoupled model: one response per token (or a tool call in two pieces), then finish reason and counts."""
    generation = _generation(messages[0, 0], current_requests()[0].parameters or {})
    for token in generation["tokens"]:
        yield {"text": _row(token.encode(), object)}
    if generation["call"]:  # the call's name and half its arguments, then (same index) the other half
        arguments = generation["call"]["function"]["arguments"]
        half = len(arguments) // 2
        head = {"function": {"name": generation["call"]["function"]["name"], "arguments": arguments[:half]}}
        for item in (head, {"index": 0, "function": {"arguments": arguments[half:]}}):
            yield {"text": _row(b"", object), "tool_calls": _row(json.dumps([item]).encode(), object)}
    yield {
        "text": _row(b"", object),
        "finish_reason": _row(generation["finish"].encode(), object),
        "prompt_tokens": _row(generation["prompt"], np.int32),
        "completion_tokens": _row(len(generation["tokens"]), np.int32),
    }


@batch
def embed(input: np.ndarray) -> Dict[str, np.ndarray]:
    """Bag of hashed words, L2-normalised."""
    vectors = np.zeros((len(input), EMBEDDING_DIM), dtype=np.float32)
    tokens = np.zeros((len(input), 1), dtype=np.int32)
    for index, text in enumerate(input[:, 0]):
        words = text.decode().lower().split()
        for word in words:
            vectors[index, zlib.crc32(word.encode()) % EMBEDDING_DIM] += 1.0
        vectors[index] /= max(float(np.linalg.norm(vectors[index])), 1e-6)
        tokens[index, 0] = len(words)
    return {"embedding": vectors, "tokens": tokens}


TEXT_OUTPUTS = [
    Tensor(name="text", shape=(1,), dtype=bytes),
    Tensor(name="finish_reason", shape=(1,), dtype=bytes),
    Tensor(name="prompt_tokens", shape=(1,), dtype=np.int32),
    Tensor(name="completion_tokens", shape=(1,), dtype=np.int32),
    Tensor(name="tool_calls", shape=(1,), dtype=bytes),
]


def bind_models(triton: Triton) -> List[Any]:
    """Bind the three models; returns the OpenAI declarations that serve them."""
    messages = [Tensor(name="messages", shape=(1,), dtype=bytes)]
    triton.bind("chat", chat, inputs=messages, outputs=TEXT_OUTPUTS, config=ModelConfig(max_batch_size=8))
    triton.bind(
        "chat_stream", chat_stream, inputs=messages, outputs=TEXT_OUTPUTS,
        config=ModelConfig(max_batch_size=1, decoupled=True),
    )  # fmt: skip
    triton.bind(
        "embed", embed, inputs=[Tensor(name="input", shape=(1,), dtype=bytes)],
        outputs=[Tensor(name="embedding", shape=(EMBEDDING_DIM,), dtype=np.float32),
                 Tensor(name="tokens", shape=(1,), dtype=np.int32)],
        config=ModelConfig(max_batch_size=16),
    )  # fmt: skip
    return [ChatModel("tiny-chat", model="chat", stream_model="chat_stream"), EmbeddingModel("tiny-embed", "embed")]


def main() -> None:
    import openai

    with Triton(config=TritonConfig()) as triton:
        models = bind_models(triton)
        triton.run()
        # 127.0.0.1 and no API key: fine for a local demo. Serving others: api_key=... (docs/openai.md).
        with OpenAIFrontend(triton, models, port=0) as frontend:
            print("OpenAI endpoints at", frontend.url)
            client = openai.OpenAI(base_url=frontend.url, api_key="unused")
            print("models:", [model.id for model in client.models.list()])
            messages: Any = [{"role": "user", "content": "streams arrive one token at a time"}]
            answer = client.chat.completions.create(model="tiny-chat", messages=messages)
            print("answer:", answer.choices[0].message.content, "| usage:", answer.usage.total_tokens)
            pieces = []
            for chunk in client.chat.completions.create(model="tiny-chat", messages=messages, stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
            print(f"streamed {len(pieces)} tokens:", "|".join(pieces))
            vectors = client.embeddings.create(model="tiny-embed", input=["hello world", "world hello"]).data
            same = np.allclose(vectors[0].embedding, vectors[1].embedding)
            print(f"embedding dims {len(vectors[0].embedding)}; word order ignored: {same}")
            tools: Any = [{"type": "function", "function": {"name": "shout", "parameters": {"type": "object"}}}]
            asked = client.chat.completions.create(model="tiny-chat", messages=messages, tools=tools)
            call = asked.choices[0].message.tool_calls[0]
            print("tool call:", call.function.name, call.function.arguments)
            shouted = json.loads(call.function.arguments)["text"].upper()
            messages += [asked.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": shouted}]  # fmt: skip
            final = client.chat.completions.create(model="tiny-chat", messages=messages, tools=tools)
            print("after the tool:", final.choices[0].message.content)


if __name__ == "__main__":
    main()
