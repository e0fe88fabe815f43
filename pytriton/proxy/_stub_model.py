"""The ``model.py`` Triton's Python backend loads: pytriton's proxy model, from the package beside it.

``Triton.bind`` writes this file as ``<model>/<version>/model.py`` and copies
``pytriton/proxy/stubside`` beside it as ``_pytriton_stubside/``. The package is loaded from that
directory by its location (``importlib``), under the name ``_pytriton_stubside``, so the stub
needs no ``sys.path`` entry: nothing else in the version directory becomes importable, and no
other copy of a module with the same name (another pytriton installed in the stub's environment)
can be picked up instead. Each stub process hosts one model instance, so the one name in
``sys.modules`` is never shared by two models.

When the version directory also holds ``pytriton_backend.pkl`` (``bind(..., instance_kind="backend")``,
``proxy/_backend_kind.py``), the model is ``_inline.InlineModel`` instead: the callable runs here.

Runs inside the stub: standard library only. Unit tests: tests/unit/test_stub_package.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

PACKAGE = "_pytriton_stubside"


# Its presence in the version directory means the callable runs in the stub (instance_kind="backend").
BACKEND_PAYLOAD = "pytriton_backend.pkl"


def load(directory: str) -> Any:
    """The proxy model module (``_stub``) of the stub-side package copied into ``directory``."""
    if PACKAGE not in sys.modules:
        package_dir = os.path.join(directory, PACKAGE)
        init = os.path.join(package_dir, "__init__.py")
        spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[package_dir])
        if not os.path.isfile(init) or spec is None or spec.loader is None:
            raise ImportError(f"pytriton's stub package is missing from {package_dir}: bind the model again")
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package  # before running it: its modules import each other through it
        spec.loader.exec_module(package)
    return importlib.import_module(f"{PACKAGE}._stub")


if os.path.basename(__file__) == "model.py":  # the copy Triton loads (pytriton imports this module too)
    _here = os.path.dirname(os.path.abspath(__file__))
    TritonPythonModel = load(_here).TritonPythonModel
    if os.path.isfile(os.path.join(_here, BACKEND_PAYLOAD)):  # the callable runs here (stubside/_inline.py)
        TritonPythonModel = importlib.import_module(f"{PACKAGE}._inline").InlineModel
