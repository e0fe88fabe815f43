"""Every ```python block of README.md and docs/ runs (unless marked no-run, with a reason).

One process per page (``python -m tests.docs_blocks PAGE``, the contract is in tests/docs_blocks.py), on
free loopback ports; ``serve()`` runs the page's following blocks, the clients, against the live server.
Nothing is downloaded: the blocks use the installed server and the packages of the test extra.
"""

import os
import subprocess
import sys

import pytest

from tests.conftest import triton_ports
from tests.docs_blocks import ROOT, curl_blocks, pages, parse

RUNNABLE = [page for page in pages() if any(block.no_run is None for block in parse(page)[0])]


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda page: str(page.relative_to(ROOT)))
def test_page_blocks_run(page):
    env = dict(os.environ)
    for field, port in triton_ports().items():
        env[f"PYTRITON_TRITON_CONFIG_{field.upper()}"] = str(port)
    completed = subprocess.run(
        [sys.executable, "-m", "tests.docs_blocks", str(page)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=ROOT,
    )
    ran = completed.stdout.count("--- running ")
    expected = sum(block.no_run is None for block in parse(page)[0])
    assert completed.returncode == 0, (completed.stdout[-3000:], completed.stderr[-4000:])
    assert ran == expected and "--- page done" in completed.stdout, completed.stdout[-3000:]


def test_readme_quick_start_serves_and_answers():
    # test_page_blocks_run[README.md] binds and serves the quick start, then runs its client block and
    # its curl call against it: here, that those blocks are still there to run.
    readme = ROOT / "README.md"
    sources = [block.source for block in parse(readme)[0] if block.no_run is None]
    assert any("triton.serve()" in source for source in sources)
    assert any("ModelClient(" in source and "infer" in source for source in sources)
    assert any("/v2/models/AddSub/infer" in source for source in curl_blocks(readme))
