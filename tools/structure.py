"""The structure of ``pytriton/``: every package and top-level module, its size, and the imports between them.

Usage: ``python tools/structure.py [--root DIR] [--mermaid]``. ``--root`` is a checkout (default: this
one), so the picture of an older commit is ``git worktree add /tmp/old <commit>`` and ``--root /tmp/old``.
Standard library only; nothing is imported, the sources are read with ``ast``.

The nodes are the packages under ``pytriton/`` (a directory with ``__init__.py``; a nested package is a
node of its own, e.g. ``pytriton.proxy.stubside``) and, one by one, the modules at the top of
``pytriton/`` (the top level is where a reader starts, so each of its files is shown). For each node:
its modules and lines (every line of its ``.py`` files, nested packages not included). An arrow
``a -> b (n)`` says that ``n`` modules-to-module imports go from node ``a`` to node ``b``: every
``import``, at module level, in functions and under ``TYPE_CHECKING``, relative ones resolved, and
``importlib.import_module``/``__import__`` of a name made of literals and module-level constants
(marked ``by name``, the way the stub loads the user's side, see docs/architecture.md); the reading
of imports is tools/imports.py, shared with tests/unit/test_import_graph.py. The text output is a table, then the arrows; with
``--mermaid`` it is a Mermaid ``graph`` for docs. Tested by tests/unit/test_structure_tool.py.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Dict, List, Optional, Set, Tuple

if __package__:
    from tools import imports as _imports
else:  # run as a script, python tools/structure.py: its folder is on sys.path
    import imports as _imports  # type: ignore[no-redef]

PACKAGE = "pytriton"


class Structure:
    """The nodes and arrows of one checkout's ``pytriton/`` (see the module docstring)."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.modules = self._modules()
        packages = {name for name, path in self.modules.items() if path.name == "__init__.py"}
        # module -> node: the innermost package that holds it, or the module itself at the top level.
        self.node_of: Dict[str, str] = {}
        for name in self.modules:
            if name in packages and name != PACKAGE:
                self.node_of[name] = name
            elif name.count(".") == 1 or name == PACKAGE:
                self.node_of[name] = name  # a top-level module (and pytriton/__init__.py)
            else:
                parent = name.rsplit(".", 1)[0]
                while parent not in packages:
                    parent = parent.rsplit(".", 1)[0]
                self.node_of[name] = parent
        self.lines: Dict[str, int] = {}
        self.counts: Dict[str, int] = {}
        for name, path in self.modules.items():
            node = self.node_of[name]
            self.lines[node] = self.lines.get(node, 0) + len(path.read_text().splitlines())
            self.counts[node] = self.counts.get(node, 0) + 1
        # (from, to) -> [plain imports, by-name imports], between modules of different nodes.
        self.arrows: Dict[Tuple[str, str], List[int]] = {}
        for name, path in self.modules.items():
            for target, by_name in self._imports(name, path):
                source, goal = self.node_of[name], self.node_of[target]
                if source != goal:
                    self.arrows.setdefault((source, goal), [0, 0])[1 if by_name else 0] += 1

    def _modules(self) -> Dict[str, pathlib.Path]:
        return _imports.modules(self.root, PACKAGE)

    def _imports(self, importer: str, path: pathlib.Path) -> Set[Tuple[str, bool]]:
        """The modules of the tree ``importer`` imports: (module, imported by name); itself left out."""
        return {
            (target, by_name)
            for target, by_name in _imports.imports(importer, path, self.modules)
            if target != importer
        }

    def nodes(self) -> List[str]:
        """Packages first (by name), then the top-level modules (by name)."""
        packages = sorted(n for n in self.counts if self._is_package(n))
        return packages + sorted(n for n in self.counts if not self._is_package(n))

    def _is_package(self, node: str) -> bool:
        return self.modules[node].name == "__init__.py" and node != PACKAGE

    def text(self) -> str:
        """The table of nodes, then the arrows, one per line."""
        width = max(len(node) for node in self.counts) + 2
        rows = [f"{'node':{width}}{'kind':10}{'modules':>8}{'lines':>8}"]
        for node in self.nodes():
            kind = "package" if self._is_package(node) else "module"
            rows.append(f"{node:{width}}{kind:10}{self.counts[node]:>8}{self.lines[node]:>8}")
        packages = [n for n in self.nodes() if self._is_package(n)]
        top = [n for n in self.nodes() if not self._is_package(n)]
        rows.append(
            f"total: {len(packages)} packages, {len(top)} top-level modules, {len(self.modules)} modules, "
            f"{sum(self.lines.values())} lines"
        )
        rows.append("")
        rows.append("arrows (imports between nodes):")
        for (source, goal), (plain, by_name) in sorted(self.arrows.items()):
            extra = f", {by_name} by name" if by_name else ""
            rows.append(f"  {source} -> {goal} ({plain}{extra})")
        return "\n".join(rows) + "\n"

    def mermaid(self) -> str:
        """A Mermaid flowchart: packages as boxes, top-level modules as rounded nodes, by-name imports dashed."""

        def key(node: str) -> str:
            return node.replace(".", "_")

        rows = ["graph LR"]
        for node in self.nodes():
            label = f"{node}<br/>{self.counts[node]} modules, {self.lines[node]} lines"
            rows.append(f'  {key(node)}["{label}"]' if self._is_package(node) else f'  {key(node)}("{label}")')
        for (source, goal), (plain, by_name) in sorted(self.arrows.items()):
            if plain:
                rows.append(f"  {key(source)} -->|{plain}| {key(goal)}")
            if by_name:
                rows.append(f"  {key(source)} -.->|{by_name} by name| {key(goal)}")
        return "\n".join(rows) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/structure.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[1])
    parser.add_argument("--mermaid", action="store_true", help="a Mermaid graph instead of the text table")
    args = parser.parse_args(argv)
    if not (args.root / PACKAGE / "__init__.py").is_file():
        print(f"{args.root} holds no {PACKAGE}/ package: give a checkout with --root.", file=sys.stderr)
        return 2
    structure = Structure(args.root)
    sys.stdout.write(structure.mermaid() if args.mermaid else structure.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
