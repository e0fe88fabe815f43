"""tools/structure.py, the package map of docs/architecture.md's source map: on a made-up tree and on this one."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from tools import structure

ROOT = pathlib.Path(__file__).parents[2]


def _tree(root: pathlib.Path, files: dict) -> pathlib.Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_nodes_lines_and_arrows_of_a_small_tree(tmp_path):
    root = _tree(
        tmp_path,
        {
            "pytriton/__init__.py": "",
            "pytriton/top.py": "from pytriton.core import a\nfrom .core.b import thing\n",
            "pytriton/core/__init__.py": '"""doc"""\n',
            "pytriton/core/a.py": "import pytriton.exceptions\n\n\n",
            "pytriton/core/b.py": "def f():\n    from ..exceptions import E\n",
            "pytriton/core/inner/__init__.py": "",
            "pytriton/core/inner/c.py": 'import importlib\nNAME = "pytriton.top"\nimportlib.import_module(NAME)\n',
            "pytriton/exceptions.py": "class E(Exception):\n    pass\n",
        },
    )
    found = structure.Structure(root)
    assert found.nodes() == [
        "pytriton.core",
        "pytriton.core.inner",
        "pytriton",
        "pytriton.exceptions",
        "pytriton.top",
    ]
    assert found.lines["pytriton.core"] == 1 + 3 + 2 and found.counts["pytriton.core"] == 3
    assert found.arrows == {
        ("pytriton.top", "pytriton.core"): [2, 0],  # a relative import resolves too
        ("pytriton.core", "pytriton.exceptions"): [2, 0],  # one at module level, one in a function
        ("pytriton.core.inner", "pytriton.top"): [0, 1],  # by name, through a module constant
    }
    text = found.text()
    assert "total: 2 packages, 3 top-level modules, 8 modules, 13 lines" in text
    assert "  pytriton.core.inner -> pytriton.top (0, 1 by name)" in text
    mermaid = found.mermaid()
    assert mermaid.startswith("graph LR\n") and "pytriton_core_inner -.->|1 by name| pytriton_top" in mermaid
    assert 'pytriton_core["pytriton.core<br/>3 modules, 6 lines"]' in mermaid


def test_this_checkout_every_package_and_the_serving_core_below_triton():
    found = structure.Structure(ROOT)
    packages = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "pytriton").rglob("__init__.py")
        if path.parent != ROOT / "pytriton"
    }
    assert packages <= set(found.nodes())
    assert sum(found.lines.values()) == sum(len(p.read_text().splitlines()) for p in (ROOT / "pytriton").rglob("*.py"))
    assert ("pytriton.triton", "pytriton._serving") in found.arrows
    assert ("pytriton._serving", "pytriton.triton") not in found.arrows
    assert found.arrows[("pytriton.proxy.stubside", "pytriton.proxy")][1] >= 1  # the backend kind's by-name import


def test_the_command_line_prints_both_forms_and_refuses_a_tree_without_the_package(tmp_path):
    tool = ROOT / "tools" / "structure.py"
    text = subprocess.run([sys.executable, str(tool)], capture_output=True, text=True, timeout=60, check=True)
    assert "pytriton._serving" in text.stdout and "arrows (imports between nodes):" in text.stdout
    graph = subprocess.run([sys.executable, str(tool), "--mermaid"], capture_output=True, text=True, timeout=60)
    assert graph.returncode == 0 and graph.stdout.startswith("graph LR")
    refused = subprocess.run([sys.executable, str(tool), "--root", str(tmp_path)], capture_output=True, text=True)
    assert refused.returncode == 2 and "holds no pytriton/ package" in refused.stderr
