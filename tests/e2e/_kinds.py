"""The same e2e models served by each instance kind, in one server per test module.

A second module-scoped server per kind would double the suite's time, so a module binds each model
it wants on both kinds twice in its own server: as ``name`` (``instance_kind="thread"``, the default)
and as ``name_backend`` (``instance_kind="backend"``: the callable runs inside the Python-backend
stub, which unpickles it, so it must be importable: a module-level function or an object of a
module-level class). A test then takes the ``kind`` fixture (tests/e2e/conftest.py: ids ``thread``
and ``backend``) and calls ``model(name, kind)``.

Keep backend callables in a module that imports little (``tests/e2e/*_models.py``): every stub
imports the callable's module, and a test module drags pytest and tritonclient into each one.
"""

from __future__ import annotations

from typing import Any

KINDS = ("thread", "backend")


def model(name: str, kind: str) -> str:
    """The name under which :func:`bind_kinds` bound ``name`` for instance ``kind``."""
    return f"{name}_backend" if kind == "backend" else name


def bind_kinds(triton: Any, name: str, *args: Any, **kwargs: Any) -> None:
    """``triton.bind(name, ...)`` once per instance kind of :data:`KINDS`, named by :func:`model`."""
    for kind in KINDS:
        extra = {"instance_kind": kind} if kind != "thread" else {}
        triton.bind(model(name, kind), *args, **kwargs, **extra)
