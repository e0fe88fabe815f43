"""OpenAI response bodies and server-sent events, built from model outputs.

Streaming follows OpenAI's wire format exactly: ``Content-Type: text/event-stream``, one
``data: {json}\\n\\n`` event per chunk, and ``data: [DONE]\\n\\n`` at the end. A chat stream opens
with a chunk whose delta carries the role, sends one chunk per piece of text, and closes with a
chunk whose delta is empty and whose ``finish_reason`` is set; that closing chunk carries ``usage``
when the model reported token counts, and with ``stream_options.include_usage`` a further chunk
with no choices carries it too, as OpenAI sends it.

Unit test: tests/unit/test_openai_requests.py (bodies and event bytes).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, TypedDict, Union, cast

import numpy as np
import numpy.typing as npt

from pytriton.openai._errors import model_failed
from pytriton.openai._models import ChatModel

LOGGER = logging.getLogger("pytriton.openai")

DONE_EVENT = b"data: [DONE]\n\n"

JsonObject = Dict[str, object]  # a body, a chunk or a part of one, as json encodes it


class FunctionCall(TypedDict, total=False):
    """The ``function`` of a tool call: its name and its arguments (a JSON text)."""

    name: str
    arguments: str


class ToolCall(TypedDict, total=False):
    """A tool call item: as the model's output holds it (``function`` and an optional ``index``) and as
    an answer's message lists it (``id``, ``type`` and ``function``)."""

    index: int
    id: str
    type: str
    function: FunctionCall


# One encoder for every body and event (json.dumps with options builds a new encoder on each call).
# Compact, UTF-8 as is, and no NaN (not JSON; a client's parser would fail on it).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(payload: Mapping[str, object]) -> bytes:
    """``payload`` as compact UTF-8 JSON (the bodies of the answers)."""
    return _ENCODER.encode(payload).encode("utf-8")


def event(payload: Mapping[str, object]) -> bytes:
    """One server-sent event carrying ``payload`` as compact JSON."""
    return b"data: " + _ENCODER.encode(payload).encode("utf-8") + b"\n\n"


def new_id(prefix: str) -> str:
    """``prefix-`` and 32 random hex digits."""
    return f"{prefix}-{os.urandom(16).hex()}"  # uuid4().hex reads the same bytes and builds an object around them


@dataclasses.dataclass
class Piece:
    """What one model response said: text, tool call items, and optionally a finish reason and token counts."""

    text: str
    finish_reason: Optional[str] = None
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    tool_calls: List[ToolCall] = dataclasses.field(default_factory=list)


def _scalar(outputs: Mapping[str, np.ndarray], name: str) -> Any:  # type: ignore[type-arg]
    value = outputs.get(name)
    if value is None or value.size == 0:
        return None
    return value.reshape(-1)[0]


def _as_text(value: object, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise model_failed(f"The model's output {name!r} is not UTF-8 text.") from None
    return str(value)


def _tool_calls(value: str, name: str) -> List[ToolCall]:
    """The tool call items in the text of output ``name`` (see ``ChatModel``), checked; 500 if malformed."""
    if not value.strip():
        return []
    try:
        items = json.loads(value)
    except ValueError:
        raise model_failed(f"The model's output {name!r} is not JSON: {value[:200]!r}.") from None
    items = [items] if isinstance(items, dict) else items
    if not isinstance(items, list):
        raise model_failed(f"The model's output {name!r} must be a JSON list of tool calls.")
    for item in items:
        function = item.get("function") if isinstance(item, dict) else None
        index = item.get("index") if isinstance(item, dict) else None
        if (
            not isinstance(function, dict)
            or not isinstance(function.get("name", ""), str)
            or (index is not None and (isinstance(index, bool) or not isinstance(index, int) or index < 0))
        ):
            raise model_failed(
                f"The model's output {name!r} holds a malformed tool call {item!r}: "
                'expected {"function": {"name": ..., "arguments": ...}} with an optional integer "index".'
            )
        if not isinstance(function.get("arguments", ""), str):
            function["arguments"] = json.dumps(function["arguments"])
    return items


def read_piece(spec: ChatModel, outputs: Mapping[str, np.ndarray]) -> Piece:  # type: ignore[type-arg]
    """The :class:`Piece` in one response's outputs (an empty final response gives empty text)."""
    text = _scalar(outputs, spec.text_output)
    reason = _scalar(outputs, spec.finish_reason_output)
    prompt_tokens = _scalar(outputs, spec.prompt_tokens_output)
    completion_tokens = _scalar(outputs, spec.completion_tokens_output)
    calls = _scalar(outputs, spec.tool_calls_output) if spec.tool_calls_output in outputs else None
    return Piece(
        _as_text(text, spec.text_output) if text is not None else "",
        _as_text(reason, spec.finish_reason_output) or None if reason is not None else None,
        int(prompt_tokens) if prompt_tokens is not None else None,
        int(completion_tokens) if completion_tokens is not None else None,
        _tool_calls(_as_text(calls, spec.tool_calls_output), spec.tool_calls_output) if calls is not None else [],
    )


@dataclasses.dataclass
class Answer:
    """One choice, accumulated from the pieces of its responses."""

    text: str = ""
    finish_reason: Optional[str] = None
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    tool_calls: List[ToolCall] = dataclasses.field(default_factory=list)

    def add(self, piece: Piece) -> List[JsonObject]:
        """Take in ``piece``; returns its tool calls as the deltas of a stream chunk (OpenAI's format)."""
        self.text += piece.text
        self.finish_reason = piece.finish_reason or self.finish_reason
        if piece.prompt_tokens is not None:
            self.prompt_tokens = piece.prompt_tokens
        if piece.completion_tokens is not None:
            self.completion_tokens = piece.completion_tokens
        return [self._add_call(item) for item in piece.tool_calls]

    def _add_call(self, item: ToolCall) -> JsonObject:
        function = item["function"]
        index = item.get("index")
        if index is not None and index < len(self.tool_calls):  # continues an earlier call
            known = self.tool_calls[index]["function"]
            known["name"] += function.get("name", "")
            known["arguments"] += function.get("arguments", "")
            fields = cast("Mapping[str, str]", function)  # mypy 1.19 (3.9) keys a TypedDict by literals only
            return {
                "index": index,
                "function": {key: fields[key] for key in ("name", "arguments") if key in fields},
            }
        if index is not None and index != len(self.tool_calls):
            raise model_failed(
                f"The model sent tool call index {index} after {len(self.tool_calls)} calls; "
                "a new call takes the next index (or none)."
            )
        call: ToolCall = {
            "id": str(item.get("id") or new_id("call")),
            "type": str(item.get("type") or "function"),
            "function": {"name": function.get("name", ""), "arguments": function.get("arguments", "")},
        }
        self.tool_calls.append(call)
        # A copy for the stream's delta: a later piece extends this call's own arguments.
        return {"index": len(self.tool_calls) - 1, **call, "function": dict(call["function"])}

    def reason(self, chat: bool) -> str:
        """The finish reason: the model's, else ``tool_calls`` for a chat answer with tool calls, else ``stop``."""
        if self.finish_reason:
            return self.finish_reason
        return "tool_calls" if chat and self.tool_calls else "stop"

    def message(self) -> JsonObject:
        """The chat message of this answer (content ``null`` for tool calls without text, as OpenAI sends)."""
        if not self.tool_calls:
            return {"role": "assistant", "content": self.text}
        return {"role": "assistant", "content": self.text or None, "tool_calls": self.tool_calls}


def usage(prompt_tokens: Optional[int], completion_tokens: Optional[int]) -> Optional[Dict[str, int]]:
    """OpenAI's usage object, or None when the model reported no counts."""
    if prompt_tokens is None and completion_tokens is None:
        return None
    prompt, completion = prompt_tokens or 0, completion_tokens or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


_UNCOUNTED_LOCK = threading.Lock()
_UNCOUNTED: Set[str] = set()  # model names already warned about; bounded by the served models


def zero_usage(model: str) -> Dict[str, int]:
    """The all-zero usage an answer must carry when its model reported no token counts.

    OpenAI's non-streaming answer (and its ``include_usage`` chunk) always has a ``usage``; pytriton
    does not guess token counts from text it cannot tokenize, so it reports zeros and says so once
    per model in the log, naming the outputs that would carry the real counts.
    """
    with _UNCOUNTED_LOCK:
        first = model not in _UNCOUNTED
        if first:
            _UNCOUNTED.add(model)
    if first:
        LOGGER.warning(
            "Model %r reports no token counts, so its OpenAI answers carry usage 0/0/0; return integer "
            "'prompt_tokens' and 'completion_tokens' outputs (ChatModel.prompt_tokens_output/"
            "completion_tokens_output) for real figures (docs/openai.md, 'Token usage').",
            model[:80],
        )
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def total_usage(answers: Sequence[Answer], choices_per_prompt: int) -> Optional[Dict[str, int]]:
    """Usage over all choices: each prompt's tokens counted once, every choice's completion tokens."""
    if all(a.prompt_tokens is None and a.completion_tokens is None for a in answers):
        return None
    prompt = sum(a.prompt_tokens or 0 for a in answers[::choices_per_prompt])
    return usage(prompt, sum(a.completion_tokens or 0 for a in answers))


def text_response(
    chat: bool, model: str, answers: Sequence[Answer], choices_per_prompt: int
) -> JsonObject:  # fmt: skip
    """The body of a non-streaming chat completion or text completion."""
    choices: List[JsonObject] = []
    for index, answer in enumerate(answers):
        reason = answer.reason(chat)
        if chat:
            choices.append({"index": index, "message": answer.message(), "logprobs": None, "finish_reason": reason})
        else:
            choices.append({"index": index, "text": answer.text, "logprobs": None, "finish_reason": reason})
    return {
        "id": new_id("chatcmpl" if chat else "cmpl"),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": total_usage(answers, choices_per_prompt) or zero_usage(model),
    }


class ChunkWriter:
    """The events of one streamed answer with ``choices`` choices (indexes 0 to choices-1).

    Order: :meth:`start`, then :meth:`piece` for each response of any choice and :meth:`close` once
    per choice as it ends (choices interleave as their responses arrive), then :meth:`end`. With one
    choice its closing chunk carries ``usage`` when the model reported token counts; with
    ``include_usage`` a last chunk with no choices carries the usage of all choices.
    """

    def __init__(self, chat: bool, model: str, include_usage: bool, choices: int = 1) -> None:
        self._chat = chat
        self._include_usage = include_usage
        self._choices = choices
        self._model = model
        self._base = {
            "id": new_id("chatcmpl" if chat else "cmpl"),
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }

    def _chunk(self, index: int, delta: JsonObject, text: str, reason: Optional[str], **extra: object) -> bytes:
        choice: JsonObject
        if self._chat:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
        return event({**self._base, "choices": [choice], **extra})

    def start(self) -> bytes:
        """The opening chunks: the role of each choice for chat, nothing for completions (empty bytes)."""
        if not self._chat:
            return b""
        return b"".join(
            self._chunk(index, {"role": "assistant", "content": ""}, "", None) for index in range(self._choices)
        )

    def piece(self, index: int, text: str, tool_calls: Sequence[JsonObject] = ()) -> bytes:
        """A chunk with choice ``index``'s next text and tool call deltas (chat only); empty bytes if none."""
        delta: JsonObject = {"content": text} if text else {}
        if tool_calls and self._chat:
            delta["tool_calls"] = list(tool_calls)
        if not delta:
            return b""
        return self._chunk(index, delta, text, None)

    def close(self, index: int, answer: Answer) -> bytes:
        """The closing chunk of choice ``index``: its finish reason (and usage, if it is the only choice)."""
        counts = usage(answer.prompt_tokens, answer.completion_tokens) if self._choices == 1 else None
        extra = {"usage": counts} if counts is not None else {}
        return self._chunk(index, {}, "", answer.reason(self._chat), **extra)

    def end(self, answers: Sequence[Answer], choices_per_prompt: int) -> bytes:
        """The usage chunk if asked for (all choices, as :func:`total_usage` counts), and ``[DONE]``."""
        if not self._include_usage:
            return DONE_EVENT
        counts = total_usage(answers, choices_per_prompt) or zero_usage(self._model)
        return event({**self._base, "choices": [], "usage": counts}) + DONE_EVENT


def embedding_response(
    model: str,
    vectors: Sequence[npt.NDArray[np.generic]],
    encoding_format: str,
    tokens: Optional[int],
) -> JsonObject:
    """The body of an embeddings answer; ``base64`` is the float32 little-endian bytes, as OpenAI sends."""
    data = []
    for index, vector in enumerate(vectors):
        flat = np.asarray(vector, dtype="<f4").reshape(-1)
        value: Union[str, List[float]] = (
            base64.b64encode(flat.tobytes()).decode("ascii") if encoding_format == "base64" else flat.tolist()
        )
        data.append({"object": "embedding", "index": index, "embedding": value})
    count = tokens or 0
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": count, "total_tokens": count}}


def model_list(names: Sequence[str], created: int) -> JsonObject:
    """The body of ``GET /v1/models``."""
    return {"object": "list", "data": [model_entry(name, created) for name in names]}


def model_entry(name: str, created: int) -> JsonObject:
    """One model as ``GET /v1/models/{name}`` describes it."""
    return {"id": name, "object": "model", "created": created, "owned_by": "pytriton"}
