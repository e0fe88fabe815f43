"""The ```python blocks of README.md and docs/**/*.md, and a runner that executes one page's blocks.

Contract (checked by tests/unit/test_docs.py, executed by tests/e2e/test_docs.py):

- every ```python block is run, except one whose fence is directly preceded by the line
  ``<!-- no-run: REASON -->`` with a non-empty REASON;
- the blocks of one page run in order, in one namespace (a reader runs the page top to bottom), in a
  process of their own (``python -m tests.docs_blocks PAGE``), from the repository root;
- the default ports in the text (``localhost:8000``, ``:8001``, ``:8002``) are mapped onto the free ports
  the test gives through ``PYTRITON_TRITON_CONFIG_*_PORT``, so a page can show the defaults;
- ``Triton.serve()`` and ``RemoteTriton.serve()`` do not block: they call ``run()``, execute the rest of
  the page's blocks while the server is up (the client calls that follow a quick start), then the
  page's ```bash blocks made only of ``curl`` commands (with ``-f``: an HTTP error fails), then return,
  so the ``with`` block stops the server as it would after Ctrl-C;
- ``OpenAIFrontend.serve()`` likewise starts the frontend, runs the rest of the page's blocks and
  stops it; its default port in the text (8080) is mapped onto a free one.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import pathlib
import re
import sys
from typing import Any, Callable, Dict, List, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

MARKER = re.compile(r"^<!--\s*no-run:(?P<reason>.*?)-->\s*$")
# Anything that looks like a no-run marker, well-formed or not (a typo must not silently run or skip).
MARKER_LIKE = re.compile(r"^\s*<!--.*no-?run", re.IGNORECASE)
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")


@dataclasses.dataclass
class Block:
    page: pathlib.Path
    line: int  # 1-based line of the opening fence
    source: str
    no_run: Optional[str]  # the marker's reason ("" for a marker without one); None: the block runs

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclasses.dataclass
class Problem:
    where: str
    what: str


def pages() -> List[pathlib.Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def parse(page: pathlib.Path) -> tuple[List[Block], List[Problem]]:
    """The ```python blocks of ``page`` and the misplaced or malformed markers in it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: List[Block] = []
    problems: List[Problem] = []
    rel = page.relative_to(ROOT)
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            if MARKER_LIKE.search(lines[i]):
                following = lines[i + 1] if i + 1 < len(lines) else ""
                match = FENCE.match(following)
                if not MARKER.match(lines[i].strip()):
                    problems.append(Problem(f"{rel}:{i + 1}", "malformed marker: write `<!-- no-run: REASON -->`"))
                elif not match or match.group("lang") != "python":
                    problems.append(
                        Problem(f"{rel}:{i + 1}", "a no-run marker must be the line directly above a ```python fence")
                    )
            i += 1
            continue
        fence, indent = opening.group("fence"), opening.group("indent")
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if opening.group("lang") == "python":
            body = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end])
            no_run = None
            marker = MARKER.match(lines[i - 1].strip()) if i > 0 else None
            if marker:
                no_run = marker.group("reason").strip()
            blocks.append(Block(page, i + 1, body + "\n", no_run))
        i = end + 1
    return blocks, problems


def curl_blocks(page: pathlib.Path) -> List[str]:
    """The ```bash blocks of ``page`` whose commands are all ``curl`` calls (indented continuation lines allowed)."""
    found, current, inside = [], [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if not inside and line.strip() == "```bash":
            inside, current = True, []
        elif inside and line.strip().startswith("```"):
            inside = False
            # Continuation lines (a quoted JSON body, after a backslash) are indented; commands are not.
            commands = [entry for entry in current if entry.strip() and not entry[0].isspace()]
            if commands and all(entry.startswith("curl ") for entry in commands):
                found.append("\n".join(current))
        elif inside:
            current.append(line)
    return found


def run_curl(source: str) -> None:
    """Run a curl block against this run's ports; ``-f`` makes an HTTP error status fail it."""
    import subprocess

    source = re.sub(r"\bcurl ", "curl -f --max-time 20 ", map_default_ports(source, dict(os.environ)))
    print(f"--- curl {source.splitlines()[0][:80]}", flush=True)
    subprocess.run(["bash", "-euo", "pipefail", "-c", source], check=True, timeout=60)
    print(flush=True)


def compile_block(block: Block) -> Any:
    """Compile a block as the runner does (top-level ``await`` and ``async with`` allowed)."""
    return compile(block.source, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)


OPENAI_PORT_VARIABLE = "PYTRITON_DOCS_OPENAI_PORT"  # the run's port for the pages' OpenAI frontend (8080)


def map_default_ports(source: str, env: Dict[str, str]) -> str:
    """Replace the default ports shown in the text by the ones this run serves on."""
    for default, field in (("8000", "HTTP"), ("8001", "GRPC"), ("8002", "METRICS")):
        port = env.get(f"PYTRITON_TRITON_CONFIG_{field}_PORT")
        if port:
            source = re.sub(rf"\blocalhost:{default}\b", f"127.0.0.1:{port}", source)
    openai_port = env.get(OPENAI_PORT_VARIABLE)
    if openai_port:
        source = re.sub(r"\b(127\.0\.0\.1|localhost):8080\b", f"127.0.0.1:{openai_port}", source)
        source = re.sub(r"\bport=8080\b", f"port={openai_port}", source)
    return source


def _exec(block: Block, namespace: Dict[str, Any]) -> None:
    import asyncio
    import inspect

    source = map_default_ports(block.source, dict(os.environ))
    code = compile(source, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    print(f"--- running {block.where}", flush=True)
    result = eval(code, namespace)  # noqa: S307 - the documentation's own code, run on purpose
    if inspect.iscoroutine(result):  # a block with top-level await
        asyncio.run(result)


def run_page(page: pathlib.Path) -> None:
    """Execute the runnable blocks of ``page`` in order (see the module docstring)."""
    from pytriton.triton import RemoteTriton, Triton

    blocks = [block for block in parse(page)[0] if block.no_run is None]
    namespace: Dict[str, Any] = {"__name__": "__docs__"}
    position = [0]

    def run_rest() -> None:
        while position[0] < len(blocks):
            block = blocks[position[0]]
            position[0] += 1
            _exec(block, namespace)

    def serving(original_run: Callable[[Any], Any]) -> Callable[[Any], None]:
        def serve(self: Any, *args: Any, **kwargs: Any) -> None:
            original_run(self)
            run_rest()  # the page's client calls, while the server is up
            for source in curl_blocks(page):
                run_curl(source)

        return serve

    Triton.serve = serving(Triton.run)  # type: ignore[method-assign]
    RemoteTriton.serve = serving(RemoteTriton.run)  # type: ignore[method-assign]
    _serve_openai_like_triton(run_rest)
    os.chdir(ROOT)
    run_rest()


def _serve_openai_like_triton(run_rest: Callable[[], None]) -> None:
    """``OpenAIFrontend.serve()`` starts the frontend, runs the page's following blocks, then stops it.

    On a free port of this run, which the pages' default 8080 is mapped to (``map_default_ports``).
    """
    try:
        from pytriton.openai import OpenAIFrontend
    except ImportError:  # the openai extra is not installed: a page using it fails on its own import
        return
    if OPENAI_PORT_VARIABLE not in os.environ:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ[OPENAI_PORT_VARIABLE] = str(probe.getsockname()[1])

    def serve(self: Any) -> None:
        self.start()
        try:
            run_rest()
        finally:
            self.stop()

    OpenAIFrontend.serve = serve  # type: ignore[method-assign]


if __name__ == "__main__":
    run_page(pathlib.Path(sys.argv[1]).resolve())
    print("--- page done", flush=True)
