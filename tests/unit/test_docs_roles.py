"""tools/docs_roles.py: reStructuredText roles become links or code in the API reference; leftovers are found.

No mkdocs and no Griffe here: ``rewrite`` and ``check_site`` are plain functions (the extension class
around them is exercised by ``make docs``, which builds the reference with it and runs ``check_site``).
"""

from __future__ import annotations

import pathlib

from tools import docs_roles

PATHS = [
    "pytriton.triton.Triton",
    "pytriton.triton.Triton.run",
    "pytriton.triton.RemoteTriton",
    "pytriton.triton.RemoteTriton.run",
    "pytriton.model_config.ModelConfig",
]


def test_a_role_with_one_rendered_match_becomes_a_link():
    assert docs_roles.rewrite("See :class:`Triton`.", PATHS) == "See [`Triton`][pytriton.triton.Triton]."
    assert docs_roles.rewrite(":class:`~pytriton.model_config.ModelConfig`", PATHS) == (
        "[`ModelConfig`][pytriton.model_config.ModelConfig]"
    )


def test_an_ambiguous_name_resolves_in_the_docstrings_scope_or_stays_code():
    assert docs_roles.rewrite(":meth:`run`", PATHS, scope="pytriton.triton.RemoteTriton") == (
        "[`run`][pytriton.triton.RemoteTriton.run]"
    )
    assert docs_roles.rewrite(":meth:`run`", PATHS) == "`run`"  # two candidates, no scope


def test_a_name_the_reference_does_not_render_becomes_code():
    assert docs_roles.rewrite(":class:`~pytriton._serving.backend.ServerBackend`", PATHS) == "`ServerBackend`"
    assert docs_roles.rewrite(":func:`pytriton._remote.server_command`", PATHS) == "`pytriton._remote.server_command`"


def test_the_literal_marker_becomes_a_colon():
    assert docs_roles.rewrite("Typical use::\n\n    triton.run()", PATHS) == "Typical use:\n\n    triton.run()"
    assert docs_roles.rewrite("a :: b", PATHS) == "a :: b"


def test_check_site_names_raw_roles_and_maintainers_notes(tmp_path: pathlib.Path):
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "clean.html").write_text("<p>Serve it with <code>Triton</code>.</p>")
    (reference / "dirty.html").write_text("<p>See :class:`Triton`.</p>\n<p>Unit tests: tests/unit/test_x.py</p>")
    assert docs_roles.check_site(tmp_path) == [
        "dirty.html: See :class:`Triton`.",
        "dirty.html: Unit tests: tests/unit/test_x.py",
    ]
