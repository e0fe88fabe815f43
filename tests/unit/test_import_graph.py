"""The modules of ``pytriton/`` import each other without cycles, and the named layers never import upward.

The graph is built from the source with ``ast`` (tools/imports.py), not by importing anything: every ``import`` statement counts,
at module level, inside functions and methods, and under ``if TYPE_CHECKING:``. Relative imports are resolved
against the importing module's package. ``from pkg import name`` is an arrow to ``pkg.name`` when that is a module
of the tree, else an arrow to ``pkg`` (its ``__init__.py``). An import hidden in a function still fixes the order in
which modules may be understood, so it is no way out of a cycle: a cycle is broken by moving the shared piece down
or by letting the lower module define the protocol it needs.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, FrozenSet, Iterator, List, Set

from tools import imports

ROOT = pathlib.Path(__file__).parents[2]
PACKAGE = "pytriton"


def _modules() -> Dict[str, pathlib.Path]:
    return imports.modules(ROOT, PACKAGE)


def _targets(importer: str, path: pathlib.Path, modules: Dict[str, pathlib.Path]) -> Iterator[str]:
    """Every module of the tree that ``importer`` imports anywhere in its source, by name (``importlib``) too."""
    return (target for target, _ in imports.imports(importer, path, modules))


def import_graph() -> Dict[str, Set[str]]:
    """Module name -> the modules of ``pytriton/`` it imports (itself excluded)."""
    modules = _modules()
    return {name: {t for t in _targets(name, path, modules) if t != name} for name, path in modules.items()}


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle (as a closed path) per strongly connected component with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_closed_path(graph, set(component)) for component in components]


def _closed_path(graph: Dict[str, Set[str]], component: Set[str]) -> List[str]:
    """A shortest cycle through the component's first module, for the failure message."""
    start = min(component)
    parents: Dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if nxt not in parents:
                    parents[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle in component {sorted(component)}")


# Cycles and upward arrows still open, with what breaks each. Each entry must still exist (the last test below), so
# the entry goes when the cycle does; any other cycle fails at once. None is left.
KNOWN_CYCLES: Dict[FrozenSet[str], str] = {}
KNOWN_UPWARD: Dict[str, str] = {}


def test_the_package_imports_have_no_cycles() -> None:
    cycles = [cycle for cycle in find_cycles(import_graph()) if frozenset(cycle) not in KNOWN_CYCLES]
    assert not cycles, "import cycles in pytriton/:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


# Lower layers that must never import a higher one (the arrows issue 26 named as running upward).
FORBIDDEN = {
    "pytriton.proxy": ("pytriton.decorators", "pytriton.server", "pytriton.triton", "pytriton._serving"),
    "pytriton.triton": ("pytriton._remote",),
    "pytriton.model_config": (
        "pytriton.proxy",
        "pytriton.server",
        "pytriton.triton",
        "pytriton.decorators",
        "pytriton._serving",
    ),
    # The serving core (issue 43 item 5) sits between the server and proxy layers and Triton: it never
    # imports Triton, the pipelines, the command line or the frontends built on Triton.
    "pytriton._serving": (
        "pytriton.triton",
        "pytriton.pipeline",
        "pytriton._remote",
        "pytriton._cli",
        "pytriton._serve",
        "pytriton._check",
        "pytriton.decorators",
        "pytriton.openai",
        "pytriton.ray",
    ),
    "pytriton.server": ("pytriton._serving", "pytriton.triton"),
    # The platform layer is the bottom one: the standard library and pytriton.exceptions only.
    "pytriton._platform": (
        "pytriton.proxy",
        "pytriton.server",
        "pytriton.triton",
        "pytriton.model_config",
        "pytriton.client",
        "pytriton.inprocess",
        "pytriton.openai",
        "pytriton._serving",
    ),
}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_lower_layers_never_import_upward() -> None:
    graph = import_graph()
    upward = sorted(
        f"{importer} -> {target}"
        for importer, targets in graph.items()
        for layer, above in FORBIDDEN.items()
        if _within(importer, layer)
        for target in targets
        if any(_within(target, higher) for higher in above) and f"{importer} -> {target}" not in KNOWN_UPWARD
    )
    assert not upward, "imports from a lower layer up into a higher one:\n" + "\n".join(upward)


def test_the_graph_sees_function_level_relative_and_type_checking_imports(tmp_path: pathlib.Path) -> None:
    """The checker itself: a cycle held open by a late import, a relative import or TYPE_CHECKING is found."""
    modules = {"pkg": tmp_path / "__init__.py", "pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
    modules["pkg"].write_text("")
    modules["pkg.a"].write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n")
    modules["pkg.b"].write_text("def late():\n    from .a import thing\n")
    graph = {name: {t for t in _targets(name, path, modules) if t != name} for name, path in modules.items()}
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_the_graph_sees_imports_made_by_name(tmp_path: pathlib.Path) -> None:
    """``importlib.import_module`` with a literal, a module-level constant or an f-string of constants is an arrow."""
    modules = {name: tmp_path / f"{name}.py" for name in ("pkg.a", "pkg.b", "pkg.c", "pkg.d")}
    modules["pkg.a"].write_text('import importlib\nRUNNER = "pkg.b"\ndef f():\n    importlib.import_module(RUNNER)\n')
    modules["pkg.b"].write_text('PKG = "pkg"\nimport importlib\nimportlib.import_module(f"{PKG}.c")\n')
    modules["pkg.c"].write_text('__import__("pkg.d")\nimport importlib\nimportlib.import_module(input())\n')
    modules["pkg.d"].write_text("")
    graph = {name: set(_targets(name, path, modules)) for name, path in modules.items()}
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.d"}, "pkg.d": set()}
    assert imports.by_name(ast.parse('import_module("_pytriton_stubside._stub")').body[0].value, {}) == (  # type: ignore[attr-defined]
        "pytriton.proxy.stubside._stub"
    )


def test_every_known_exception_still_exists() -> None:
    """A cycle or upward arrow that was broken leaves the lists above, so it cannot come back unnoticed."""
    graph = import_graph()
    cycles = {frozenset(cycle) for cycle in find_cycles(graph)}
    assert not [sorted(known) for known in KNOWN_CYCLES if known not in cycles]
    arrows = {f"{importer} -> {target}" for importer, targets in graph.items() for target in targets}
    assert not [arrow for arrow in KNOWN_UPWARD if arrow not in arrows]
