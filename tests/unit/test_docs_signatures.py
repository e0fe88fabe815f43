"""Every ``bind(``, ``ModelConfig(``, ``Triton(`` and ``TritonConfig(`` call the docs show uses parameters that exist.

Read from the Markdown text of README.md and docs/ (code blocks and inline code alike, since a
reader copies both), with ``ast`` where the call parses (``...`` placeholders allowed) and a
keyword pattern where it does not (``bind(..., execution_timeout_s=)``). Nothing is imported from
the pages and nothing runs.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from typing import Dict, FrozenSet, Iterator, List, Tuple

import pytest

from pytriton.model_config import ModelConfig
from pytriton.triton import Triton, TritonConfig
from tests.docs_blocks import ROOT, pages


def _parameters(function: object) -> FrozenSet[str]:
    return frozenset(
        name
        for name, p in inspect.signature(function).parameters.items()  # type: ignore[arg-type]
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    )


ALLOWED: Dict[str, FrozenSet[str]] = {
    "bind": _parameters(Triton.bind),
    "ModelConfig": frozenset(field.name for field in dataclasses.fields(ModelConfig)),
    "Triton": _parameters(Triton.__init__),
    "TritonConfig": _parameters(TritonConfig),
}
CALL = re.compile(r"(?<![\w.])(?:[A-Za-z_][\w]*\.)?(?P<name>bind|ModelConfig|Triton|TritonConfig)\(")
KEYWORD = re.compile(r"(?<![\w.=!<>])([a-z_][a-z0-9_]*)\s*=(?!=)")


def _arguments(text: str, start: int) -> str:
    """The text between the parenthesis at ``start`` and its match (or the rest of ``text``)."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] in "([{":
            depth += 1
        elif text[index] in ")]}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : index]
    return text[start + 1 :]


def _top_level_keywords(arguments: str) -> List[str]:
    """Keyword names at the call's own level (not inside a nested call or literal)."""
    try:
        call = ast.parse(f"f({arguments})", mode="eval").body
    except SyntaxError:
        flat, depth = [], 0
        for char in arguments:
            depth += char in "([{"
            depth -= char in ")]}"
            flat.append(char if depth == 0 else " ")
        return KEYWORD.findall("".join(flat))
    assert isinstance(call, ast.Call)
    return [keyword.arg for keyword in call.keywords if keyword.arg is not None]


def _calls() -> Iterator[Tuple[str, str, str]]:
    """``(where, callee, keyword)`` for each keyword of each shown call."""
    for page in pages():
        text = page.read_text(encoding="utf-8")
        for match in CALL.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            callee = match.group("name")
            for keyword in _top_level_keywords(_arguments(text, match.end() - 1)):
                yield f"{page.relative_to(ROOT)}:{line}", callee, keyword


def test_the_docs_show_calls():
    # The scan finds what it is for: the quick start's bind and ModelConfig at least.
    seen = {(callee, keyword) for _, callee, keyword in _calls()}
    assert ("bind", "model_name") in seen and ("ModelConfig", "max_batch_size") in seen


def test_every_shown_keyword_exists():
    unknown = [
        f"{where}: {callee}(..., {keyword}=...)"
        for where, callee, keyword in _calls()
        if keyword not in ALLOWED[callee]
    ]
    assert not unknown, "the docs show parameters that do not exist:\n" + "\n".join(unknown)


@pytest.mark.parametrize(
    "shown, expected",
    [
        (
            "triton.bind(model_name='m', infer_func=f, config=ModelConfig(max_batch_size=8))",
            ["model_name", "infer_func", "config"],
        ),
        ("bind(..., execution_timeout_s=)", ["execution_timeout_s"]),
        ("bind(..., instance_kind='backend', inputs=[Tensor(name='x')])", ["instance_kind", "inputs"]),
    ],
)
def test_keywords_are_read_at_the_calls_own_level(shown, expected):
    start = shown.index("(")
    assert _top_level_keywords(_arguments(shown, start)) == expected
