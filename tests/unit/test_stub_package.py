"""The stub side as one package (``pytriton/proxy/stubside``) and the ``model.py`` shim that loads it.

Inside Triton's Python-backend stub only the standard library, numpy, ``triton_python_backend_utils``
and (for the TCP transport) pyzmq exist. These tests read every module of the package with ``ast``
(imports inside functions included) and fail on any other import, then copy the package into a
model version directory as ``Triton.bind`` does and import it in a fresh interpreter of the stub's
own environment, with the server's real ``triton_python_backend_utils.py``.
"""

import ast
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import sysconfig

import pytest

from pytriton.proxy import _binding, _stub_model, stubside

PACKAGE_DIR = pathlib.Path(stubside.__file__).parent
SHIM = pathlib.Path(_stub_model.__file__)
ALLOWED = {"__future__", "numpy", "zmq", "triton_python_backend_utils"}


def _is_stdlib(name: str) -> bool:
    names = getattr(sys, "stdlib_module_names", None)  # Python 3.10+
    if names is not None:
        return name in names
    if name in sys.builtin_module_names:
        return True
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin in (None, "built-in", "frozen"):
        return spec is not None
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    origin = os.path.realpath(spec.origin)
    return origin.startswith(stdlib + os.sep) and "site-packages" not in origin


def foreign_imports(source: str) -> list:
    """``(line, module)`` of every import in ``source`` the stub cannot satisfy."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level > 0:  # relative: inside the package
                continue
            modules = [node.module or ""]
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            if top not in ALLOWED and not _is_stdlib(top):
                found.append((node.lineno, module))
    return found


def test_the_checker_catches_what_the_stub_cannot_import():
    source = "import os\nimport numpy as np\nfrom . import _wire\ndef f():\n    from pytriton.proxy import _wire\n    import yaml\n"
    assert foreign_imports(source) == [(5, "pytriton.proxy"), (6, "yaml")]


@pytest.mark.parametrize("path", sorted(PACKAGE_DIR.glob("*.py")) + [SHIM], ids=lambda path: path.name)
def test_a_stub_module_imports_only_the_stdlib_numpy_zmq_backend_utils_and_its_package(path):
    assert foreign_imports(path.read_text()) == [], f"{path} imports what the stub does not have"


def test_the_package_is_flat_so_its_py_files_are_all_of_it():
    assert [entry.name for entry in PACKAGE_DIR.iterdir() if entry.is_dir() and entry.name != "__pycache__"] == []


def _stub_python() -> pathlib.Path:
    from pytriton.server.distribution import stub_environment

    try:
        return stub_environment().bin_dir / "python3"
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no stub environment here ({exc}); run `pytriton install-server`")


def _backend_utils() -> pathlib.Path:
    from pytriton.server.distribution import find_server

    try:
        return find_server().backend_dir / "python" / "triton_python_backend_utils.py"
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no tritonserver installed here ({exc}); run `pytriton install-server`")


def test_the_copied_package_loads_in_a_fresh_stub_interpreter_without_pytriton(tmp_path):
    python, utils = _stub_python(), _backend_utils()
    version_dir = tmp_path / "repo" / "Model" / "1"
    version_dir.mkdir(parents=True)
    _binding.write_stub_package(version_dir)
    backend = tmp_path / "backend"
    backend.mkdir()
    (backend / utils.name).write_bytes(utils.read_bytes())
    code = (
        "import importlib.util, json, sys\n"
        f"sys.path.append({str(backend)!r})\n"  # where the stub finds triton_python_backend_utils
        f"spec = importlib.util.spec_from_file_location('model', {str(version_dir / 'model.py')!r})\n"
        "model = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(model)\n"
        "files = {name: getattr(module, '__file__', None) for name, module in sys.modules.items()\n"
        "         if name.startswith('_pytriton_stubside')}\n"
        "print(json.dumps({'model': model.TritonPythonModel.__module__, 'files': files,\n"
        "                  'pytriton': sorted(name for name in sys.modules if name.split('.')[0] == 'pytriton')}))\n"
    )
    # -I: no PYTHONPATH, no user site, not the current directory: only the stub environment's own paths.
    done = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["model"] == "_pytriton_stubside._stub" and report["pytriton"] == []
    package = version_dir / "_pytriton_stubside"
    assert {"_pytriton_stubside._wire", "_pytriton_stubside._zmq_channel", "_pytriton_stubside._stub_bytes"} <= set(
        report["files"]
    )
    assert all(pathlib.Path(file).parent == package for file in report["files"].values())


def test_the_shim_names_a_missing_package_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, _stub_model.PACKAGE, raising=False)
    with pytest.raises(ImportError, match="bind the model again"):
        _stub_model.load(str(tmp_path))
    assert _stub_model.PACKAGE not in sys.modules
