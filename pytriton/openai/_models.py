"""How an OpenAI model name maps onto a bound Triton model: :class:`ChatModel` and :class:`EmbeddingModel`.

Both are declarations checked once, when the frontend starts, against the bound model's
configuration (input and output names, batching, decoupled): a mapping that names an input the
model lacks fails there with what to change, never on the first request.

Unit test: tests/unit/test_openai_requests.py.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from pytriton.exceptions import PyTritonBadParameterError

# OpenAI request fields the frontend forwards to a text model, when the request sets them. ``n`` is
# not among them: the frontend runs the model once per choice.
SAMPLING_FIELDS: Tuple[str, ...] = (
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "user",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "presence_penalty",
    "frequency_penalty",
)

Parameter = Union[str, int, float, bool]  # a Triton request parameter's value
ChatTemplate = Callable[[List[Dict[str, Any]]], str]


def plain_chat_template(messages: List[Dict[str, Any]]) -> str:
    """The default template for a model that takes a prompt: ``role: content`` lines, then ``assistant:``."""
    lines = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        lines.append(f"{message.get('role')}: {content if content is not None else ''}")
    return "\n".join([*lines, "assistant:"])


@dataclasses.dataclass(frozen=True)
class ChatModel:
    """A text model served on ``/v1/chat/completions`` and ``/v1/completions`` as ``name``.

    ``model`` is the bound model that answers; with ``stream_model`` (a decoupled model with the same
    inputs and outputs), ``model`` answers requests without ``stream`` and ``stream_model`` those
    with ``"stream": true``. Either kind serves either request: a decoupled model's responses are
    joined into one answer, an ordinary model's answer is streamed as one piece.

    Inputs of the bound model (each of shape ``(1,)``, plus the batch axis if it batches):

    - chat messages: as JSON text (``[{"role": ..., "content": ...}, ...]``) in the BYTES input
      ``messages_input`` when the model has it and no ``chat_template`` is given; otherwise rendered
      by ``chat_template`` (default :func:`plain_chat_template`) into the BYTES input ``prompt_input``;
    - a completions prompt: as text in ``prompt_input`` when the model has it, else as one user
      message in ``messages_input``;
    - the fields of :data:`SAMPLING_FIELDS` the request sets: request parameters of the same name
      (``request.parameters`` in the callable, ``pytriton.decorators.current_requests()`` under
      ``@batch``) unless ``inputs`` maps them onto model inputs (``{"max_tokens": "max_new_tokens"}``),
      converted to the input's dtype. ``stop``, ``tools`` and a non-text ``tool_choice`` travel as
      JSON text. Fields the request leaves out are not sent: the model applies its own defaults.

    Outputs: ``text_output`` (BYTES, required) is the whole answer of an ordinary model, or the next
    piece of text in each response of a decoupled (streaming) model. Optional outputs, used when the
    model declares them: ``finish_reason_output`` (BYTES, default ``"stop"``) and the token counts
    ``prompt_tokens_output``/``completion_tokens_output`` (integers; for a streaming model the last
    response that carries them counts), which become the ``usage`` of the answer.

    Tool calls: a chat model that declares ``tool_calls_output`` (BYTES) answers with tool calls by
    putting JSON text there: a list of calls, each ``{"function": {"name": ..., "arguments": ...}}``
    (``arguments`` a JSON text or an object, sent on as JSON text), optionally with an ``id`` (else
    ``call_<random>``) and a ``type`` (``"function"``). Calls are numbered in order across the
    responses of a streaming model; an item with the ``index`` of an earlier call continues it (its
    ``arguments`` are appended), so a model can stream a call's arguments piece by piece. An empty
    output (``b""``) means no call. The answer's ``finish_reason`` is then ``"tool_calls"`` unless the
    model sets another, and its message content is ``null`` when the model sent no text.
    """

    name: str
    model: str
    model_version: Optional[int] = None
    stream_model: Optional[str] = None
    messages_input: str = "messages"
    prompt_input: str = "prompt"
    chat_template: Optional[ChatTemplate] = None
    inputs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    text_output: str = "text"
    finish_reason_output: str = "finish_reason"
    prompt_tokens_output: str = "prompt_tokens"
    completion_tokens_output: str = "completion_tokens"
    tool_calls_output: str = "tool_calls"

    def __post_init__(self) -> None:
        _check_names(self.name, self.model)
        if self.stream_model is not None:
            _check_names(self.name, self.stream_model)
        unknown = sorted(set(self.inputs) - set(SAMPLING_FIELDS))
        if unknown:
            raise PyTritonBadParameterError(
                f"ChatModel {self.name!r}: inputs maps unknown OpenAI fields {unknown}; "
                f"the fields that can be mapped are {list(SAMPLING_FIELDS)}."
            )


@dataclasses.dataclass(frozen=True)
class EmbeddingModel:
    """A model served on ``/v1/embeddings`` as ``name``.

    Each text of the request's ``input`` is sent as one request to ``model``: BYTES input
    ``text_input`` of shape ``(1,)`` (plus the batch axis if it batches; Triton's dynamic batcher
    batches the texts of one request together). The model answers with the float vector
    ``embedding_output``, and optionally an integer token count ``tokens_output`` for ``usage``.
    """

    name: str
    model: str
    model_version: Optional[int] = None
    text_input: str = "input"
    embedding_output: str = "embedding"
    tokens_output: str = "tokens"

    def __post_init__(self) -> None:
        _check_names(self.name, self.model)


def _check_names(name: str, model: str) -> None:
    if not isinstance(name, str) or not name or not isinstance(model, str) or not model:
        raise PyTritonBadParameterError(
            f"An OpenAI model needs a non-empty name and the name of a bound model, got {name!r} and {model!r}."
        )


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What the frontend needs of a bound model's configuration."""

    inputs: Mapping[str, np.dtype]  # type: ignore[type-arg]
    outputs: Sequence[str]
    batching: bool
    decoupled: bool


_TRITON_DTYPES = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "STRING": np.object_,
    "BYTES": np.object_,
}


def model_info(config: Mapping[str, Any]) -> ModelInfo:
    """:class:`ModelInfo` from Triton's JSON model configuration (the same over gRPC and in-process)."""

    def dtype(entry: Mapping[str, Any]) -> np.dtype:  # type: ignore[type-arg]
        name = str(entry.get("data_type", "TYPE_FP32")).replace("TYPE_", "")
        return np.dtype(_TRITON_DTYPES.get(name, np.object_))

    policy = config.get("model_transaction_policy") or {}
    return ModelInfo(
        inputs={str(entry["name"]): dtype(entry) for entry in config.get("input", [])},
        outputs=[str(entry["name"]) for entry in config.get("output", [])],
        batching=int(config.get("max_batch_size", 0) or 0) > 0,
        decoupled=bool(policy.get("decoupled", False)),
    )


def check_chat_model(spec: ChatModel, info: ModelInfo) -> None:
    """``PyTritonBadParameterError`` unless the bound model has what ``spec`` maps onto."""
    where = f"ChatModel {spec.name!r} (bound model {spec.model!r})"
    if spec.messages_input not in info.inputs and spec.prompt_input not in info.inputs:
        raise PyTritonBadParameterError(
            f"{where}: the model has neither the messages input {spec.messages_input!r} nor the prompt input "
            f"{spec.prompt_input!r} (its inputs: {sorted(info.inputs)}); set messages_input or prompt_input."
        )
    if spec.text_output not in info.outputs:
        raise PyTritonBadParameterError(
            f"{where}: the model has no output {spec.text_output!r} (its outputs: {list(info.outputs)}); "
            "set text_output."
        )
    missing = sorted(name for name in spec.inputs.values() if name not in info.inputs)
    if missing:
        raise PyTritonBadParameterError(f"{where}: inputs maps fields onto inputs the model lacks: {missing}.")


def check_embedding_model(spec: EmbeddingModel, info: ModelInfo) -> None:
    """``PyTritonBadParameterError`` unless the bound model has what ``spec`` maps onto."""
    where = f"EmbeddingModel {spec.name!r} (bound model {spec.model!r})"
    if spec.text_input not in info.inputs or spec.embedding_output not in info.outputs:
        raise PyTritonBadParameterError(
            f"{where}: the model needs the input {spec.text_input!r} and the output {spec.embedding_output!r} "
            f"(it has inputs {sorted(info.inputs)}, outputs {list(info.outputs)}); set text_input/embedding_output."
        )
    if info.decoupled:
        raise PyTritonBadParameterError(f"{where}: an embedding model must not be decoupled.")


def as_parameter(value: object) -> Parameter:
    """A request field as a Triton request parameter (str, int, float or bool); lists and objects as JSON."""
    if isinstance(value, (str, bool, int, float)):
        return value
    return json.dumps(value)
