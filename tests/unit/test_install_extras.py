"""pyproject.toml's install story: what ``pip install .`` and each extra bring (issue 27, item 6)."""

from __future__ import annotations

import ast
import pathlib
import re

try:
    import tomllib
except ImportError:  # Python < 3.11: mypy (in the test extra) brings tomli there
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
DEVELOPMENT_TOOLS = {"pytest", "pytest-timeout", "ruff", "mypy", "matplotlib", "kubernetes-validate"}

# The distribution that provides each OpenTelemetry module pytriton imports (longest prefix wins).
OTEL_DISTRIBUTIONS = {
    "opentelemetry.exporter.otlp.proto.http": "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry": "opentelemetry-api",
}


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()


def _self_extras(requirements) -> set:
    """The extras of ``pytriton[...]`` entries (self-references) among ``requirements``."""
    found = set()
    for requirement in requirements:
        match = re.fullmatch(r"pytriton\[([^\]]+)\]", requirement.replace(" ", ""))
        if match:
            found.update(match.group(1).split(","))
    return found


def test_plain_install_brings_no_development_tools():
    assert {_name(r) for r in PROJECT["dependencies"]} & DEVELOPMENT_TOOLS == set()


def test_tracing_extra_has_every_opentelemetry_package_tracing_imports():
    tree = ast.parse((ROOT / "pytriton" / "proxy" / "_tracing.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opentelemetry"):
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names if alias.name.startswith("opentelemetry"))
    assert any(module.startswith("opentelemetry.exporter.otlp") for module in imported)
    needed = {
        next(OTEL_DISTRIBUTIONS[prefix] for prefix in sorted(OTEL_DISTRIBUTIONS, key=len, reverse=True)
             if module == prefix or module.startswith(prefix + "."))
        for module in imported
    }  # fmt: skip
    assert needed <= {_name(r) for r in EXTRAS["tracing"]}


def test_test_extra_takes_the_optional_extras_the_tests_exercise():
    assert {"remote", "tracing"} <= _self_extras(EXTRAS["test"])


def test_dev_extra_refers_to_test_instead_of_repeating_it():
    assert "test" in _self_extras(EXTRAS["dev"])
    own = {_name(r) for r in EXTRAS["dev"] if not r.startswith("pytriton")}
    repeated = own & {_name(r) for r in EXTRAS["test"]}
    assert repeated == set(), f"dev repeats {sorted(repeated)} from test"
