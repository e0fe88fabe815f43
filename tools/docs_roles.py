"""A Griffe extension for the API reference: reStructuredText roles in docstrings become links or code.

pytriton's docstrings name other objects the Sphinx way (``:class:`Triton```, ``:meth:`run```),
which mkdocstrings' Google-style Markdown shows as raw text. This extension rewrites each role,
while the reference is built (the source stays as it is):

* into a cross-reference link (``[`Triton`][pytriton.triton.Triton]``) when exactly one object the
  reference renders matches the name (the rendered modules are the extension's ``modules`` option,
  the same list as the ``:::`` lines of docs/reference/; an object is rendered when it is public
  and has a docstring);
* into inline code otherwise (a private helper, or an ambiguous name), so nothing raw is left and
  no link points nowhere.

A line ending in the reStructuredText literal marker ``::`` ends in ``:`` instead (the indented block
after it is already a code block in Markdown).

Used by mkdocs.yml (``extensions`` of the Python handler); tested by tests/unit/test_docs_roles.py.
"""

from __future__ import annotations

import html
import pathlib
import re
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence

try:
    import griffe
except ImportError:  # the test environment has no griffe: rewrite() and check_site() work without it
    griffe = None

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|data|attr|mod|exc|obj|const):`(?P<tilde>~?)(?P<target>[^`<>]+)`")
LITERAL_MARKER = re.compile(r"(?<=\S)::$", re.MULTILINE)


def _public(path: str) -> bool:
    return not any(part.startswith("_") for part in path.split("."))


def _walk(obj: Any, seen: Optional[set] = None) -> Iterator[Any]:  # type: ignore[type-arg]
    seen = set() if seen is None else seen
    if obj.path in seen:
        return
    seen.add(obj.path)
    yield obj
    if obj.is_alias:
        return
    for member in list(obj.members.values()):
        yield from _walk(member, seen)


def rendered_paths(modules: Dict[str, Any]) -> List[str]:
    """The identifiers the reference renders: public members (recursively) with a docstring."""
    paths: List[str] = []
    for module in modules.values():
        exports = getattr(module, "exports", None)  # a module with __all__ renders only those names
        for obj in _walk(module):
            relative = obj.path[len(module.path) + 1 :]
            if obj.path != module.path and not _public(relative):
                continue
            if relative and exports is not None and relative.split(".")[0] not in {str(e) for e in exports}:
                continue
            try:
                docstring = obj.docstring
            except Exception:  # an alias whose target is outside the loaded packages
                continue
            if docstring is not None and docstring.value.strip():
                paths.append(obj.path)
    return paths


def rewrite(text: str, paths: Sequence[str], scope: str = "") -> str:
    """``text`` with every role made a link (one rendered match) or inline code (see the module docstring).

    ``scope``: the path of the object whose docstring this is; a name that matches several rendered
    objects is resolved to the one under the nearest enclosing scope, if that is unique.
    """

    def replace(match: re.Match[str]) -> str:
        target = match.group("target").strip().lstrip(".")
        shown = target.rsplit(".", 1)[-1] if match.group("tilde") else target
        if target.endswith("()"):
            target = target[:-2]
        candidates = [p for p in paths if p == target or p.endswith("." + target)]
        if len(candidates) > 1 and scope:
            parts = scope.split(".")
            for depth in range(len(parts), 0, -1):
                prefix = ".".join(parts[:depth]) + "."
                near = [p for p in candidates if p.startswith(prefix)]
                if len(near) == 1:
                    candidates = near
                    break
        if len(candidates) == 1:
            return f"[`{shown}`][{candidates[0]}]"
        return f"`{shown}`"

    return LITERAL_MARKER.sub(":", ROLE.sub(replace, text))


# What must never reach the rendered reference: a raw role, a literal marker, a maintainers' note.
LEFTOVERS = re.compile(
    r":(?:class|meth|func|data|attr|mod|exc|obj):`|\btests/(?:unit|e2e)/|Structure \(docs/architecture"
)


def check_site(site: pathlib.Path) -> List[str]:
    """The leftovers (``LEFTOVERS``) in the text of the built reference pages, as ``page: text`` lines."""
    found = []
    for page in sorted((site / "reference").glob("*.html")):
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))
        for line in text.splitlines():
            if LEFTOVERS.search(line):
                found.append(f"{page.name}: {line.strip()[:160]}")
    return found


if griffe is not None:

    class RolesToLinks(griffe.Extension):
        """Rewrites the roles of every docstring of the loaded packages (see the module docstring)."""

        def __init__(self, modules: Sequence[str] = ()) -> None:
            super().__init__()
            self.modules = list(modules)

        def on_package(self, *, pkg: Any, loader: Any, **kwargs: Any) -> None:
            rendered = {}
            for name in self.modules:
                try:
                    rendered[name] = loader.modules_collection.get_member(name)
                except (KeyError, ValueError):
                    continue
            paths = rendered_paths(rendered)
            for obj in _walk(pkg):
                if obj.is_alias:
                    continue
                docstring = obj.docstring
                if docstring is not None and docstring.value:
                    docstring.value = rewrite(docstring.value, paths, obj.path)


if __name__ == "__main__":
    # `python tools/docs_roles.py SITE`: exit 1 naming every leftover in SITE/reference (make docs runs it).
    problems = check_site(pathlib.Path(sys.argv[1]))
    for problem in problems:
        print(f"reference leftover: {problem}", file=sys.stderr)
    sys.exit(1 if problems else 0)
