"""The documentation's static checks: no-run markers, Python syntax of every block, the site's nav.

tests/e2e/test_docs.py executes the blocks; the contract is in tests/docs_blocks.py.
"""

import re

import pytest

from tests.docs_blocks import DOCS, ROOT, Block, compile_block, pages, parse

ALL_BLOCKS = [block for page in pages() for block in parse(page)[0]]


def test_the_pages_have_python_blocks():
    assert len(ALL_BLOCKS) > 20
    assert any(block.page.name == "README.md" and block.no_run is None for block in ALL_BLOCKS)


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_markers_are_well_formed_and_give_a_reason(page):
    blocks, problems = parse(page)
    problems += [f"{block.where}: no-run marker without a reason" for block in blocks if block.no_run == ""]
    assert not problems, problems


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda block: block.where)
def test_every_block_is_valid_python(block: Block):
    # Blocks marked no-run too: a fragment may skip what it needs, but not be broken Python.
    compile_block(block)


def nav_pages() -> list:
    """The .md files named in mkdocs.yml's nav (comment lines left out)."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:") :]
    lines = [line for line in nav.splitlines() if not line.lstrip().startswith("#")]
    return re.findall(r":\s*([\w./-]+\.md)\s*$", "\n".join(lines), flags=re.MULTILINE)


def test_every_docs_page_is_in_the_nav():
    listed = nav_pages()
    on_disk = sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))
    missing = [page for page in on_disk if page not in listed]
    assert not missing, f"pages not in mkdocs.yml's nav (add them, or the site hides them): {missing}"
    absent = [page for page in listed if not (DOCS / page).is_file()]
    assert not absent, f"mkdocs.yml's nav names pages that do not exist: {absent}"
    assert len(listed) == len(set(listed)), "a page is listed twice in the nav"


def test_the_parser_finds_markers_and_problems(tmp_path, monkeypatch):
    # The checks above cannot pass by finding nothing: a page with each case.
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- no-run: needs a GPU -->\n```python\nx = 1\n```\n"
        "```python\ny = 2\n```\n"
        "<!-- no-run: -->\n```python\nz = 3\n```\n"
        "<!-- no-run: stray -->\ntext\n"
        "<!-- norun: typo -->\n```python\nw = 4\n```\n",
        encoding="utf-8",
    )
    monkeypatch.setattr("tests.docs_blocks.ROOT", tmp_path)
    blocks, problems = parse(page)
    assert [(block.line, block.no_run) for block in blocks] == [(2, "needs a GPU"), (5, None), (9, ""), (15, None)]
    assert [problem.where for problem in problems] == ["page.md:12", "page.md:14"]


def test_readme_links_point_at_files():
    # mkdocs checks the links of docs/; the README lives outside it.
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [target for target in targets if "://" not in target]
    assert local, "the README links into docs/"
    missing = [target for target in local if not (ROOT / target).exists()]
    assert not missing, missing
