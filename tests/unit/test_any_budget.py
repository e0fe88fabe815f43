"""A ceiling on ``Any`` in pytriton's annotations (issue 26, item 6): it may only go down.

The count: every annotation in ``pytriton/**/*.py`` (function arguments, ``*args`` and ``**kwargs``
included, return types, annotated assignments) whose expression names ``Any`` (``Any`` or
``typing.Any``, or a string annotation containing ``Any``). Lower :data:`CEILING` to the new count
whenever a change removes some; a change that adds ``Any`` must type its values instead
(``object`` for a truly opaque value, a ``Protocol``, a ``TypedDict`` or a record).
"""

import ast
import pathlib
from typing import Dict, List, Optional

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "pytriton"
# 418 before issue 26 item 6 typed the decorators, the stub side (_pb_types Protocols), the OpenAI bodies,
# the backend kind, tracing spans, the process instances, the OpenAI backend/frontend and clients.
CEILING = 207


def _names_any(node: Optional[ast.AST]) -> bool:
    if node is None:
        return False
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and child.id == "Any":
            return True
        if isinstance(child, ast.Attribute) and child.attr == "Any":
            return True
        if isinstance(child, ast.Constant) and isinstance(child.value, str) and "Any" in child.value:
            return True
    return False


def _annotations(tree: ast.AST) -> List[Optional[ast.AST]]:
    found: List[Optional[ast.AST]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            every = arguments.posonlyargs + arguments.args + arguments.kwonlyargs
            every += [arg for arg in (arguments.vararg, arguments.kwarg) if arg is not None]
            found.extend(arg.annotation for arg in every)
            found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
    return found


def count_any() -> Dict[str, int]:
    """``Any`` annotations per file of the package (files without any left out)."""
    counts = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        count = sum(_names_any(annotation) for annotation in _annotations(tree))
        if count:
            counts[str(path.relative_to(PACKAGE.parent))] = count
    return counts


def test_the_count_of_any_stays_under_its_ceiling():
    counts = count_any()
    total = sum(counts.values())
    worst = ", ".join(f"{path} {count}" for path, count in sorted(counts.items(), key=lambda item: -item[1])[:8])
    assert total <= CEILING, f"{total} annotations name Any, more than the ceiling of {CEILING} (most in: {worst})"


def test_the_counter_sees_every_kind_of_annotation():
    source = """
from typing import Any, Dict
import typing
def f(a: Any, b: int, *args: Any, c: "Dict[str, Any]", **kwargs: typing.Any) -> Any:
    x: Dict[str, Any] = {}
    y: int = 0
async def g(d: "int") -> None: ...
"""
    annotations = _annotations(ast.parse(source))
    assert sum(_names_any(annotation) for annotation in annotations) == 6
