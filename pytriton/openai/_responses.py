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
import time
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import numpy.typing as npt

from pytriton.openai._errors import model_failed
from pytriton.openai._models import ChatModel

DONE_EVENT = b"data: [DONE]\n\n"


def event(payload: Mapping[str, Any]) -> bytes:
    """One server-sent event carrying ``payload`` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclasses.dataclass
class Piece:
    """What one model response said: text, and optionally a finish reason and token counts."""

    text: str
    finish_reason: Optional[str] = None
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None


def _scalar(outputs: Mapping[str, np.ndarray], name: str) -> Any:  # type: ignore[type-arg]
    value = outputs.get(name)
    if value is None or value.size == 0:
        return None
    return value.reshape(-1)[0]


def _as_text(value: Any, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise model_failed(f"The model's output {name!r} is not UTF-8 text.") from None
    return str(value)


def read_piece(spec: ChatModel, outputs: Mapping[str, np.ndarray]) -> Piece:  # type: ignore[type-arg]
    """The :class:`Piece` in one response's outputs (an empty final response gives empty text)."""
    text = _scalar(outputs, spec.text_output)
    reason = _scalar(outputs, spec.finish_reason_output)
    prompt_tokens = _scalar(outputs, spec.prompt_tokens_output)
    completion_tokens = _scalar(outputs, spec.completion_tokens_output)
    return Piece(
        _as_text(text, spec.text_output) if text is not None else "",
        _as_text(reason, spec.finish_reason_output) or None if reason is not None else None,
        int(prompt_tokens) if prompt_tokens is not None else None,
        int(completion_tokens) if completion_tokens is not None else None,
    )


@dataclasses.dataclass
class Answer:
    """One choice, accumulated from the pieces of its responses."""

    text: str = ""
    finish_reason: Optional[str] = None
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None

    def add(self, piece: Piece) -> None:
        self.text += piece.text
        self.finish_reason = piece.finish_reason or self.finish_reason
        if piece.prompt_tokens is not None:
            self.prompt_tokens = piece.prompt_tokens
        if piece.completion_tokens is not None:
            self.completion_tokens = piece.completion_tokens


def usage(prompt_tokens: Optional[int], completion_tokens: Optional[int]) -> Optional[Dict[str, int]]:
    """OpenAI's usage object, or None when the model reported no counts."""
    if prompt_tokens is None and completion_tokens is None:
        return None
    prompt, completion = prompt_tokens or 0, completion_tokens or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def total_usage(answers: Sequence[Answer], choices_per_prompt: int) -> Optional[Dict[str, int]]:
    """Usage over all choices: each prompt's tokens counted once, every choice's completion tokens."""
    if all(a.prompt_tokens is None and a.completion_tokens is None for a in answers):
        return None
    prompt = sum(a.prompt_tokens or 0 for a in answers[::choices_per_prompt])
    return usage(prompt, sum(a.completion_tokens or 0 for a in answers))


def text_response(
    chat: bool, model: str, answers: Sequence[Answer], choices_per_prompt: int
) -> Dict[str, Any]:  # fmt: skip
    """The body of a non-streaming chat completion or text completion."""
    choices: List[Dict[str, Any]] = []
    for index, answer in enumerate(answers):
        reason = answer.finish_reason or "stop"
        if chat:
            message = {"role": "assistant", "content": answer.text}
            choices.append({"index": index, "message": message, "logprobs": None, "finish_reason": reason})
        else:
            choices.append({"index": index, "text": answer.text, "logprobs": None, "finish_reason": reason})
    return {
        "id": new_id("chatcmpl" if chat else "cmpl"),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": total_usage(answers, choices_per_prompt) or usage(0, 0),
    }


class ChunkWriter:
    """The events of one streamed choice (index 0), in order: :meth:`start`, :meth:`piece`..., :meth:`end`."""

    def __init__(self, chat: bool, model: str, include_usage: bool) -> None:
        self._chat = chat
        self._include_usage = include_usage
        self._base = {
            "id": new_id("chatcmpl" if chat else "cmpl"),
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }

    def _chunk(self, delta: Optional[Dict[str, Any]], text: str, reason: Optional[str], **extra: Any) -> bytes:
        choice: Dict[str, Any]
        if self._chat:
            choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return event({**self._base, "choices": [choice], **extra})

    def start(self) -> bytes:
        """The opening chunk: the role for chat, nothing for completions (empty bytes)."""
        return self._chunk({"role": "assistant", "content": ""}, "", None) if self._chat else b""

    def piece(self, text: str) -> bytes:
        """A chunk with the next piece of text (empty bytes for empty text)."""
        if not text:
            return b""
        return self._chunk({"content": text}, text, None)

    def end(self, answer: Answer) -> bytes:
        """The closing chunk (finish reason, usage if known), the usage chunk if asked for, and ``[DONE]``."""
        counts = usage(answer.prompt_tokens, answer.completion_tokens)
        extra = {"usage": counts} if counts is not None else {}
        closing = self._chunk({}, "", answer.finish_reason or "stop", **extra)
        if self._include_usage:
            closing += event({**self._base, "choices": [], "usage": counts or usage(0, 0)})
        return closing + DONE_EVENT


def embedding_response(
    model: str,
    vectors: Sequence[npt.NDArray[np.generic]],
    encoding_format: str,
    tokens: Optional[int],
) -> Dict[str, Any]:
    """The body of an embeddings answer; ``base64`` is the float32 little-endian bytes, as OpenAI sends."""
    data = []
    for index, vector in enumerate(vectors):
        flat = np.asarray(vector, dtype="<f4").reshape(-1)
        value: Any = base64.b64encode(flat.tobytes()).decode("ascii") if encoding_format == "base64" else flat.tolist()
        data.append({"object": "embedding", "index": index, "embedding": value})
    count = tokens or 0
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": count, "total_tokens": count}}


def model_list(names: Sequence[str], created: int) -> Dict[str, Any]:
    """The body of ``GET /v1/models``."""
    return {"object": "list", "data": [model_entry(name, created) for name in names]}


def model_entry(name: str, created: int) -> Dict[str, Any]:
    """One model as ``GET /v1/models/{name}`` describes it."""
    return {"id": name, "object": "model", "created": created, "owned_by": "pytriton"}
