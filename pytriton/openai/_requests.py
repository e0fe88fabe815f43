"""OpenAI request bodies: validation, and the model calls they turn into.

A body is checked field by field; the first problem becomes a 400 :class:`OpenAIError` that names
the field (``param``). Fields the frontend does not know are ignored, as OpenAI-compatible servers
commonly do (clients send newer fields); fields it knows but cannot honour (``logprobs``,
``echo``, ``dimensions``) are refused rather than silently dropped.

Unit test: tests/unit/test_openai_requests.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple, cast

import numpy as np

from pytriton.openai._errors import invalid_request, shown
from pytriton.openai._models import (
    SAMPLING_FIELDS,
    ChatModel,
    EmbeddingModel,
    ModelInfo,
    Parameter,
    as_parameter,
    plain_chat_template,
)

MAX_CHOICES = 16
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclasses.dataclass(frozen=True)
class ModelCall:
    """One request to a bound model: inputs of one sample (no batch axis) and request parameters."""

    inputs: Dict[str, np.ndarray]  # type: ignore[type-arg]
    parameters: Dict[str, Parameter]


@dataclasses.dataclass(frozen=True)
class TextRequest:
    """A validated chat or completions request."""

    model: str
    prompts: List[Any]  # chat: one message list; completions: one text per prompt
    chat: bool
    stream: bool
    include_usage: bool
    n: int
    options: Dict[str, object]  # the SAMPLING_FIELDS the request set, normalised


@dataclasses.dataclass(frozen=True)
class EmbeddingRequest:
    """A validated embeddings request."""

    model: str
    texts: List[str]
    encoding_format: str


# The deepest nesting of a body's JSON (the body object itself is level 1). Well below Python's
# recursion limit (1000), so that nothing that walks the parsed request later (json.dumps of the
# messages, the model's own json.loads) can hit it: a deeper body is a 400 here, not a model error.
MAX_JSON_DEPTH = 64
# A JSON string escape of a UTF-16 surrogate: the only way a body can hold a lone surrogate once it
# decoded as strict UTF-8. json.loads accepts one, but no UTF-8 encoder downstream does.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _yielding_object(pairs: List[Tuple[str, object]]) -> Dict[str, object]:
    # A Python-level hook: each object parsed runs Python code, where the interpreter may hand the
    # GIL to the event loop's thread. With no hook the C parser holds it for the whole body.
    return dict(pairs)


_YIELDING_DECODER = json.JSONDecoder(object_pairs_hook=_yielding_object)


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH, yielding: bool = False) -> Dict[str, object]:
    """The body, UTF-8 JSON text, as a JSON object, else 400 (``code`` ``invalid_json``).

    Refused besides malformed JSON and a non-object: text that is not strict UTF-8 (json.loads of
    bytes would take UTF-16 and UTF-32, and UTF-8-encoded surrogates), nesting deeper than
    ``max_depth`` levels, and a lone UTF-16 surrogate escape (``"\\ud800"``) in any string.
    ``yielding``: parse so that another thread gets the GIL between objects (for large bodies parsed
    off the event loop; slower). The extra checks cost about a microsecond for ordinary bodies: the
    tree is walked only when the body holds more brackets than ``max_depth`` or a surrogate escape.
    """
    try:
        text = raw.decode("utf-8")
        body = _YIELDING_DECODER.decode(text) if yielding else json.loads(text)
    except RecursionError:  # deeper than the C parser's recursion limit
        raise _too_deep(max_depth) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid_request(f"The request body is not valid UTF-8 JSON: {exc}", code="invalid_json") from None
    del text
    if not isinstance(body, dict):
        raise invalid_request("The request body must be a JSON object.", code="invalid_json")
    surrogates = _SURROGATE_ESCAPE.search(raw) is not None
    if surrogates or raw.count(b"[") + raw.count(b"{") > max_depth:
        _check_tree(body, max_depth, surrogates)
    return body


def _too_deep(max_depth: int) -> Exception:
    return invalid_request(f"The request body's JSON nests deeper than {max_depth} levels.", code="invalid_json")


def _check_tree(body: object, max_depth: int, surrogates: bool) -> None:
    """400 for nesting deeper than ``max_depth`` or (when ``surrogates``) a string no UTF-8 encoder takes."""
    stack: List[Tuple[object, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if depth > max_depth:
                raise _too_deep(max_depth)
            stack.extend((item, depth + 1) for item in value.values())
            if surrogates:
                stack.extend((key, depth) for key in value)
        elif isinstance(value, list):
            if depth > max_depth:
                raise _too_deep(max_depth)
            stack.extend((item, depth + 1) for item in value)
        elif surrogates and isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise invalid_request(
                    'The request body holds a lone UTF-16 surrogate (such as "\\ud800"), which is not text; '
                    "send valid Unicode (a surrogate pair, or the character itself).",
                    code="invalid_json",
                ) from None


def _model_name(body: Mapping[str, object]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid_request("'model' is required and must be a non-empty string.", "model")
    return model


def _number(body: Mapping[str, object], name: str, low: float, high: float) -> Optional[float]:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise invalid_request(f"'{name}' must be a number from {low:g} to {high:g}, got {shown(value)}.", name)
    return float(value)


def _integer(body: Mapping[str, object], name: str, low: int, high: int) -> Optional[int]:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid_request(f"'{name}' must be an integer from {low} to {high}, got {shown(value)}.", name)
    return int(value)


def _flag(body: Mapping[str, object], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid_request(f"'{name}' must be true or false, got {shown(value)}.", name)
    return value


def _refuse(body: Mapping[str, object], *names: str) -> None:
    for name in names:
        if body.get(name) not in (None, False, 0):
            raise invalid_request(f"'{name}' is not supported by this server.", name, "unsupported_parameter")


def _options(body: Mapping[str, object], chat: bool) -> Dict[str, object]:
    """The sampling fields the request set, checked and normalised (``max_completion_tokens`` -> ``max_tokens``)."""
    options: Dict[str, object] = {}
    max_tokens = _integer(body, "max_tokens", 1, 2**31 - 1)
    if chat and max_tokens is None:
        max_tokens = _integer(body, "max_completion_tokens", 1, 2**31 - 1)
    for name, value in (
        ("max_tokens", max_tokens),
        ("temperature", _number(body, "temperature", 0, 2)),
        ("top_p", _number(body, "top_p", 0, 1)),
        ("presence_penalty", _number(body, "presence_penalty", -2, 2)),
        ("frequency_penalty", _number(body, "frequency_penalty", -2, 2)),
        ("seed", _integer(body, "seed", -(2**63), 2**63 - 1)),
    ):
        if value is not None:
            options[name] = value
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(item, str) for item in stop):
            raise invalid_request("'stop' must be a string or a list of at most 4 strings.", "stop")
        options["stop"] = stop
    user = body.get("user")
    if user is not None:
        if not isinstance(user, str):
            raise invalid_request("'user' must be a string.", "user")
        options["user"] = user
    if chat:
        options.update(_tools(body))
    else:
        _refuse(body, "tools", "tool_choice")
    return options


def _tools(body: Mapping[str, object]) -> Dict[str, object]:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls``, checked as OpenAI checks them."""
    options: Dict[str, object] = {}
    tools = body.get("tools")
    names = set()
    if tools is not None:
        if not isinstance(tools, list) or not tools:
            raise invalid_request("'tools' must be a non-empty list of tool objects.", "tools")
        for index, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(tool, dict) or not isinstance(tool.get("type", "function"), str):
                raise invalid_request(f"'tools[{index}]' must be an object with a 'type'.", f"tools[{index}]")
            if tool.get("type", "function") == "function":
                if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
                    raise invalid_request(
                        f"'tools[{index}].function.name' is required: a function tool needs a name.",
                        f"tools[{index}].function.name",
                    )
                names.add(function["name"])
        options["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        if tools is None:
            raise invalid_request("'tool_choice' is only allowed when 'tools' are given.", "tool_choice")
        if isinstance(choice, dict):
            function = choice.get("function")
            if choice.get("type", "function") == "function" and (
                not isinstance(function, dict) or function.get("name") not in names
            ):
                raise invalid_request(
                    f"'tool_choice' must name one of the functions in 'tools' {shown(sorted(names))}, got {shown(choice)}.",
                    "tool_choice",
                )
        elif choice not in ("none", "auto", "required"):
            raise invalid_request(
                "'tool_choice' must be 'none', 'auto', 'required' or an object naming a function of 'tools'.",
                "tool_choice",
            )
        options["tool_choice"] = choice
    parallel = body.get("parallel_tool_calls")
    if parallel is not None:
        if tools is None:
            raise invalid_request(
                "'parallel_tool_calls' is only allowed when 'tools' are given.", "parallel_tool_calls"
            )
        options["parallel_tool_calls"] = _flag(body, "parallel_tool_calls")
    return options


def _stream_fields(body: Mapping[str, object]) -> Tuple[bool, bool]:
    stream = _flag(body, "stream")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise invalid_request("'stream_options' must be an object.", "stream_options")
    include_usage = bool((stream_options or {}).get("include_usage", False))
    return stream, include_usage


def _messages(body: Mapping[str, object]) -> List[Dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid_request("'messages' is required and must be a non-empty list.", "messages")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise invalid_request(f"'{where}' must be an object.", where)
        if message.get("role") not in _ROLES:
            raise invalid_request(
                f"'{where}.role' must be one of {sorted(_ROLES)}, got {shown(message.get('role'))}.", f"{where}.role"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise invalid_request(f"'{where}.content' must be a string or a list of parts.", f"{where}.content")
    return messages


def _texts(body: Mapping[str, object], name: str) -> List[str]:
    """Field ``name`` as a list of texts: a string, or a non-empty list of strings (token ids are refused)."""
    value = body.get(name)
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
        raise invalid_request(f"'{name}' is required: a string or a non-empty list of strings.", name)
    return texts


def parse_chat(body: Mapping[str, object]) -> TextRequest:
    """A ``/v1/chat/completions`` body, validated."""
    model = _model_name(body)
    messages = _messages(body)
    _refuse(body, "logprobs", "top_logprobs")
    n = _integer(body, "n", 1, MAX_CHOICES) or 1
    stream, include_usage = _stream_fields(body)
    return TextRequest(model, [messages], True, stream, include_usage, n, _options(body, chat=True))


def parse_completion(body: Mapping[str, object]) -> TextRequest:
    """A ``/v1/completions`` body, validated (a text prompt or a list of them; token ids are refused)."""
    model = _model_name(body)
    prompts = _texts(body, "prompt")
    _refuse(body, "logprobs", "echo", "suffix")
    _integer(body, "best_of", 1, 1)  # 1 is the default and all this server does
    n = _integer(body, "n", 1, MAX_CHOICES) or 1
    if len(prompts) * n > MAX_CHOICES:
        raise invalid_request(f"At most {MAX_CHOICES} choices per request (prompts times n).", "n")
    stream, include_usage = _stream_fields(body)
    return TextRequest(model, prompts, False, stream, include_usage, n, _options(body, chat=False))


def parse_embeddings(body: Mapping[str, object]) -> EmbeddingRequest:
    """A ``/v1/embeddings`` body, validated (texts only; token ids and ``dimensions`` are refused)."""
    model = _model_name(body)
    texts = _texts(body, "input")
    if len(texts) > 2048:
        raise invalid_request("'input' may hold at most 2048 texts.", "input")
    encoding_format = cast(str, body.get("encoding_format") or "float")  # one of the two strings: checked next
    if encoding_format not in ("float", "base64"):
        raise invalid_request("'encoding_format' must be 'float' or 'base64'.", "encoding_format")
    _refuse(body, "dimensions")
    return EmbeddingRequest(model, texts, encoding_format)


def _text(value: str) -> np.ndarray:  # type: ignore[type-arg]
    return np.array([value.encode("utf-8")], dtype=np.object_)


def _input_value(value: object, dtype: np.dtype, field: str) -> np.ndarray:  # type: ignore[type-arg]
    if dtype == np.object_:
        return _text(value if isinstance(value, str) else json.dumps(value))
    try:
        return np.array([value], dtype=dtype)
    except (TypeError, ValueError):
        raise invalid_request(f"'{field}' cannot be passed to this model: {shown(value)}.", field) from None


def text_call(spec: ChatModel, info: ModelInfo, request: TextRequest, prompt: Any) -> ModelCall:
    """The model call for one prompt (a message list for chat, a text for completions)."""
    inputs: Dict[str, np.ndarray] = {}  # type: ignore[type-arg]
    if request.chat:
        if spec.messages_input in info.inputs and spec.chat_template is None:
            inputs[spec.messages_input] = _text(json.dumps(prompt))
        else:
            template = spec.chat_template or plain_chat_template
            inputs[spec.prompt_input] = _text(template(prompt))
    elif spec.prompt_input in info.inputs:
        inputs[spec.prompt_input] = _text(prompt)
    else:
        inputs[spec.messages_input] = _text(json.dumps([{"role": "user", "content": prompt}]))
    parameters: Dict[str, Parameter] = {}
    for field in SAMPLING_FIELDS:
        if field not in request.options:
            continue
        value = request.options[field]
        if field in spec.inputs:
            name = spec.inputs[field]
            inputs[name] = _input_value(value, info.inputs[name], field)
        else:
            parameters[field] = as_parameter(value)
    return ModelCall(inputs, parameters)


def embedding_call(spec: EmbeddingModel, text: str) -> ModelCall:
    """The model call for one text of an embeddings request."""
    return ModelCall({spec.text_input: _text(text)}, {})
