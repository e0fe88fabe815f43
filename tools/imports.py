"""Which modules of a source tree a module imports, read with ``ast`` (nothing is imported).

Shared by tests/unit/test_import_graph.py (no cycles, no upward layer imports) and tools/structure.py
(the package map). Every ``import`` counts: at module level, inside functions and methods, and under
``if TYPE_CHECKING:``; relative imports are resolved against the importing module's package. ``from
pkg import name`` is an import of ``pkg.name`` when that is a module of the tree, else of ``pkg`` (its
``__init__.py``). ``importlib.import_module(...)``/``__import__(...)`` of a name built from literals
and module-level string constants counts too, marked *by name*. Standard library only.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, Iterator, Optional, Tuple

# Packages known under another name where they run: the stub loads pytriton/proxy/stubside as this package.
ALIASES = {"_pytriton_stubside": "pytriton.proxy.stubside"}


def modules(root: pathlib.Path, package: str) -> Dict[str, pathlib.Path]:
    """Dotted module name -> file, for every ``.py`` file under ``root/package`` (a package is its ``__init__``)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def resolve(importer: str, is_package: bool, level: int, module: Optional[str]) -> str:
    """The absolute name a relative ``from`` names, resolved against the importer's package."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not is_package:
        base.pop()
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def constants(tree: ast.Module) -> Dict[str, str]:
    """Module-level ``NAME = "text"`` assignments (what a by-name import may refer to)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def text(node: ast.expr, known: Dict[str, str]) -> Optional[str]:
    """The string ``node`` evaluates to, when built from literals and module-level string constants only."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return known.get(node.id)
    if isinstance(node, ast.JoinedStr):
        parts = [text(value.value if isinstance(value, ast.FormattedValue) else value, known) for value in node.values]
        return None if any(part is None for part in parts) else "".join(parts)  # type: ignore[arg-type]
    return None


def by_name(node: ast.Call, known: Dict[str, str]) -> Optional[str]:
    """The module an ``importlib.import_module(...)`` or ``__import__(...)`` call names, when it can be read."""
    function = node.func
    named = (isinstance(function, ast.Attribute) and function.attr == "import_module") or (
        isinstance(function, ast.Name) and function.id in ("import_module", "__import__")
    )
    if not named or not node.args:
        return None
    name = text(node.args[0], known)
    if name is None:
        return None
    head, _, rest = name.partition(".")
    return ".".join(filter(None, [ALIASES.get(head, head), rest]))


def imports(importer: str, path: pathlib.Path, tree_modules: Dict[str, pathlib.Path]) -> Iterator[Tuple[str, bool]]:
    """``(module, by name)`` for every module of ``tree_modules`` that ``importer`` imports (itself included)."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    known = constants(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            named = by_name(node, known)
            if named is not None and named in tree_modules:
                yield named, True
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in tree_modules:
                    yield alias.name, False
        elif isinstance(node, ast.ImportFrom):
            base = resolve(importer, is_package, node.level, node.module)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in tree_modules:
                    yield submodule, False
                elif base in tree_modules:
                    yield base, False
