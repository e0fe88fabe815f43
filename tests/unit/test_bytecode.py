"""The stub package's copies come with bytecode (pytriton/proxy/_bytecode.py), so a stub does not compile them.

The last test loads a copied package in a fresh interpreter of the stub's own environment (as
tests/unit/test_stub_package.py does) and records every module its import system compiles from source:
with bytecode none of the package's, without it (the old copies) all of them.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import py_compile
import subprocess

import pytest

from pytriton.proxy import _binding, _bytecode, _stub_model, stubside
from tests.unit.test_stub_package import _backend_utils, _stub_python

PACKAGE_DIR = pathlib.Path(stubside.__file__).parent


def _write(path: pathlib.Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


@pytest.fixture(autouse=True)
def _fresh_memo(monkeypatch):
    monkeypatch.setattr(_bytecode, "_memo", {})


def _source(directory: pathlib.Path, text: str, name: str = "m.py") -> pathlib.Path:
    path = directory / name
    path.write_text(text)
    return path


def test_the_bytecode_is_the_standard_librarys_hash_checked_pyc_and_cached(tmp_path):
    source = _source(tmp_path, "VALUE = 41 + 1\n")
    data = _bytecode.bytecode(source, tmp_path / "cache")
    assert data is not None
    assert data[:4] == importlib.util.MAGIC_NUMBER
    assert int.from_bytes(data[4:8], "little") == 0b11  # hash-based, checked (PEP 552)
    assert data[8:16] == importlib.util.source_hash(source.read_bytes())
    # What py_compile writes for the same source, byte for byte.
    reference = py_compile.compile(
        str(source),
        str(tmp_path / "ref.pyc"),
        source.name,
        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
    )
    assert pathlib.Path(reference).read_bytes() == data
    cached = list((tmp_path / "cache").rglob("*.pyc"))
    assert len(cached) == 1 and cached[0].read_bytes() == data
    assert cached[0].parent.stat().st_mode & 0o777 == 0o700
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_a_damaged_cache_file_is_compiled_again_and_a_source_that_does_not_compile_gets_none(tmp_path):
    source = _source(tmp_path, "X = 1\n")
    good = _bytecode.bytecode(source, tmp_path / "cache")
    (cached,) = (tmp_path / "cache").rglob("*.pyc")
    cached.write_bytes(b"garbage")
    _bytecode._memo.clear()
    assert _bytecode.bytecode(source, tmp_path / "cache") == good
    assert cached.read_bytes() == good
    assert _bytecode.bytecode(_source(tmp_path, "def (:\n", "bad.py"), tmp_path / "cache") is None


def test_an_unwritable_cache_leaves_the_copy_without_bytecode(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert _bytecode.bytecode(_source(tmp_path, "X = 2\n"), blocked) is None
    (tmp_path / "a").mkdir()
    _bytecode.copy_with_bytecode(tmp_path / "m.py", tmp_path / "a" / "m.py", _write, blocked)
    assert sorted(path.name for path in (tmp_path / "a").iterdir()) == ["m.py"]  # the stub compiles it


def test_copies_get_a_private_pycache_and_none_without_a_cache_dir(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("X = 3\n")
    (tmp_path / "a").mkdir()
    _bytecode.copy_with_bytecode(source, tmp_path / "a" / "mod.py", _write, tmp_path / "cache")
    pyc = pathlib.Path(importlib.util.cache_from_source(str(tmp_path / "a" / "mod.py")))
    assert pyc.exists() and pyc.stat().st_mode & 0o777 == 0o600 and pyc.parent.stat().st_mode & 0o777 == 0o700
    (tmp_path / "b").mkdir()
    _bytecode.copy_with_bytecode(source, tmp_path / "b" / "mod.py", _write, None)
    assert sorted(path.name for path in (tmp_path / "b").iterdir()) == ["mod.py"]


# Loads model.py as the stub does and lists the modules compiled from source on the way.
_LOAD = """
import importlib._bootstrap_external as external, importlib.util, json, sys
sys.path.append(sys.argv[2])
compiled = []
original = external.SourceLoader.source_to_code
def recording(self, data, path, *, _optimize=-1):
    compiled.append(path)
    return original(self, data, path, _optimize=_optimize)
external.SourceLoader.source_to_code = recording
spec = importlib.util.spec_from_file_location("model", sys.argv[1] + "/model.py")
model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model)
print(json.dumps({"compiled": compiled, "model": model.TritonPythonModel.__module__}))
"""


@pytest.mark.parametrize("with_bytecode", [True, False], ids=["bytecode", "sources-only"])
def test_a_stub_loads_the_copied_package_without_compiling_it(tmp_path, with_bytecode):
    python, utils = _stub_python(), _backend_utils()
    version_dir = tmp_path / "repo" / "Model" / "1"
    version_dir.mkdir(parents=True)
    _binding.write_stub_package(version_dir, tmp_path / "cache" if with_bytecode else None)
    backend = tmp_path / "backend"
    backend.mkdir()
    (backend / utils.name).write_bytes(utils.read_bytes())
    done = subprocess.run(
        [str(python), "-I", "-c", _LOAD, str(version_dir), str(backend)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["model"] == f"{_stub_model.PACKAGE}._stub"
    ours = sorted(pathlib.Path(path).name for path in report["compiled"] if str(version_dir) in path)
    if with_bytecode:
        assert ours == [], f"compiled from source in the stub: {ours}"
    else:
        assert "_stub.py" in ours and "model.py" in ours  # what every stub paid before
