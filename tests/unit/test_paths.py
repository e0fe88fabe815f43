"""The ownership rule for model files (``pytriton/_platform/paths.py``, issue 42 item 2) and the stub's side of it.

Another local user is faked with ``chown`` to ``nobody`` (root only: those tests are skipped without
root, and say so). Each refusal is checked beside the healthy case it must not break: a directory
pytriton creates, one the user made with 0755 or 0700, a sticky parent such as ``/tmp``.
"""

from __future__ import annotations

import json
import os
import pathlib
import pwd
import stat
import sys

import numpy as np
import pytest

from pytriton._platform import paths as _paths
from pytriton._platform.paths import UnsafePathError
from pytriton.exceptions import PyTritonValidationError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy import _binding, _stub_model
from pytriton.proxy._binding import BindingContext, BoundModel
from pytriton.proxy.stubside import _wire
from pytriton.server.workspace import Workspace


def _nobody() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="faking another user's file needs root (chown to nobody)")


def _mode(path: pathlib.Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- the repository and workspace directories -------------------------------------------------------


def test_a_missing_directory_is_created_0700_and_returned_resolved(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")  # mine: allowed on the way
    resolved = _paths.private_directory(tmp_path / "link" / "a" / "b", "model repository")
    assert resolved == (tmp_path / "real" / "a" / "b") and resolved.is_dir()
    assert _mode(resolved) == 0o700 and _mode(resolved.parent) == 0o700


@pytest.mark.parametrize("mode", [0o755, 0o700, 0o750])
def test_a_directory_the_user_made_without_group_or_other_write_is_accepted(tmp_path, mode):
    repository = tmp_path / "models"
    repository.mkdir()
    repository.chmod(mode)
    assert _paths.private_directory(repository, "model repository") == repository
    assert _mode(repository) == mode  # left as the user made it


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777])
def test_a_directory_group_or_other_may_write_is_refused_with_the_fix(tmp_path, mode):
    repository = tmp_path / "models"
    repository.mkdir()
    repository.chmod(mode)
    with pytest.raises(UnsafePathError) as raised:
        _paths.private_directory(repository, "model repository")
    message = str(raised.value)
    assert str(repository) in message and f"{mode:04o}" in message and "chmod go-w" in message
    assert isinstance(raised.value, PyTritonValidationError)


@as_root
def test_a_directory_another_user_owns_is_refused_naming_the_owner(tmp_path):
    repository = tmp_path / "models"
    repository.mkdir(mode=0o755)
    os.chown(repository, _nobody(), -1)
    with pytest.raises(UnsafePathError, match=rf"owned by .*uid {_nobody()}.*a new path"):
        _paths.private_directory(repository, "model repository")


def test_a_symlink_as_a_subdirectory_is_refused_not_followed(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "Model").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePathError, match="is a symlink"):
        _paths.private_subdir(tmp_path / "repo", "Model")


def test_a_parent_others_may_write_is_refused_unless_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could rename "models" away and put their own in its place
    with pytest.raises(UnsafePathError, match=r"above pytriton's model files.*0777.*sticky"):
        _paths.private_directory(shared / "models", "model repository")
    assert not (shared / "models").exists()  # refused before anything was created
    shared.chmod(0o1777)  # like /tmp: only the owner of "models" may rename it
    assert _paths.private_directory(shared / "models", "model repository") == shared / "models"


@as_root
def test_a_parent_another_user_owns_or_their_symlink_on_the_way_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, _nobody(), -1)
    with pytest.raises(UnsafePathError, match="neither root nor the serving user"):
        _paths.private_directory(theirs / "models", "model repository")
    (tmp_path / "mine").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "mine")
    os.lchown(link, _nobody(), -1)  # they could point it at their own directory at any time
    with pytest.raises(UnsafePathError, match="a symlink on the path"):
        _paths.private_directory(link / "models", "model repository")


def test_workspace_refuses_a_directory_others_may_write_and_accepts_the_users_own(tmp_path, monkeypatch):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(UnsafePathError, match="workspace"):
        Workspace(open_dir)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    workspace = Workspace(mine)
    store = workspace.subdir("model-store")
    assert _mode(store) == 0o700
    workspace.clean()
    assert mine.is_dir() and not store.exists()
    monkeypatch.setenv("PYTRITON_HOME", str(tmp_path / "home"))
    fresh = Workspace()  # the default: created by pytriton
    assert _mode(fresh.path) == 0o700
    fresh.clean()


@as_root
def test_workspace_refuses_a_subdirectory_another_user_created_first(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    (mine / "model-store").mkdir(mode=0o700)
    os.chown(mine / "model-store", _nobody(), -1)
    workspace = Workspace(mine)
    with pytest.raises(UnsafePathError, match="model-store.*owned by"):
        workspace.subdir("model-store")


# -- the files --------------------------------------------------------------------------------------


def test_write_private_replaces_a_planted_symlink_and_leaves_its_target_alone(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    victim.chmod(0o644)
    target = tmp_path / "pytriton_private.json"
    target.symlink_to(victim)
    _paths.write_private(target, b"{}")
    assert victim.read_bytes() == b"precious" and _mode(victim) == 0o644
    assert not target.is_symlink() and target.read_bytes() == b"{}" and _mode(target) == 0o600
    assert sorted(path.name for path in tmp_path.iterdir()) == ["pytriton_private.json", "victim"]


X = [Tensor(name="x", shape=(-1,), dtype=np.float32)]


def identity(requests):
    return [{"y": request["x"]} for request in requests]


def _model(tmp_path: pathlib.Path, instance_kind: str = "thread") -> BoundModel:
    context = BindingContext(
        user_pid=os.getpid(), shm_prefix=f"pytriton-{os.getpid()}-paths", socket_dir=tmp_path / "s",
        on_unrecoverable=lambda exc: None,
    )  # fmt: skip
    return BoundModel(
        index=0, model_name="Identity", model_version=1, infer_funcs=identity, inputs=X,
        outputs=[Tensor(name="y", shape=(-1,), dtype=np.float32)], config=ModelConfig(), strict=False,
        context=context, instance_kind=instance_kind,
    )  # fmt: skip


def test_bind_writes_through_planted_symlinks_without_following_them(tmp_path):
    repository = tmp_path / "repo"
    version_dir = repository / "Identity" / "1"
    version_dir.mkdir(parents=True)
    victims = {}
    for name in (_wire.PRIVATE_FILE, "model.py"):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_bytes(b"root's file")
        victims[name].chmod(0o644)
        (version_dir / name).symlink_to(victims[name])
    (repository / "Identity" / "config.pbtxt").symlink_to(victims["model.py"])
    _model(tmp_path).write_repository(repository)
    for victim in victims.values():
        assert victim.read_bytes() == b"root's file" and _mode(victim) == 0o644
    assert json.loads((version_dir / _wire.PRIVATE_FILE).read_text())["slots"] == 1
    assert not (version_dir / "model.py").is_symlink()


@as_root
def test_bind_refuses_a_model_directory_another_user_created_first(tmp_path):
    repository = tmp_path / "repo"
    (repository / "Identity").mkdir(parents=True)
    os.chown(repository / "Identity", _nobody(), -1)
    with pytest.raises(UnsafePathError, match="directory of model 'Identity'.*owned by"):
        _model(tmp_path).write_repository(repository)
    assert list((repository / "Identity").iterdir()) == []


# -- the stub's side ----------------------------------------------------------------------------------


def test_the_stub_reads_its_own_0600_file(tmp_path):
    path = tmp_path / "own"
    _paths.write_private(path, b"data")
    assert _wire.read_owned(str(path)) == b"data"


def test_the_stub_refuses_a_symlink_or_a_file_others_may_write(tmp_path):
    real = tmp_path / "real"
    _paths.write_private(real, b"data")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(PermissionError, match="symlink"):
        _wire.read_owned(str(link))
    real.chmod(0o666)
    with pytest.raises(PermissionError, match=r"mode 0666.*Bind the model again"):
        _wire.read_owned(str(real))


@as_root
def test_the_stub_refuses_a_file_another_user_owns(tmp_path):
    path = tmp_path / "pytriton_backend.pkl"
    _paths.write_private(path, b"planted")
    os.chown(path, _nobody(), -1)
    with pytest.raises(PermissionError, match=f"owner uid {_nobody()}"):
        _wire.read_owned(str(path))


@pytest.fixture()
def fresh_package(monkeypatch):
    monkeypatch.delitem(sys.modules, _stub_model.PACKAGE, raising=False)
    yield
    for name in [name for name in sys.modules if name.split(".")[0] == _stub_model.PACKAGE]:
        del sys.modules[name]


def _written(tmp_path: pathlib.Path) -> pathlib.Path:
    version_dir = tmp_path / "repo" / "Model" / "1"
    version_dir.mkdir(parents=True, mode=0o755)
    _binding.write_stub_package(version_dir, tmp_path / "bytecode")  # with its __pycache__
    return version_dir


def test_the_stub_accepts_a_package_only_its_user_could_write(tmp_path):
    """The check passes on what bind writes (the whole load in a stub: test_stub_package.py)."""
    version_dir = _written(tmp_path)
    package = version_dir / _stub_model.PACKAGE
    assert any((package / "__pycache__").iterdir())
    _stub_model._check_package(str(version_dir), str(package))


@pytest.mark.parametrize("where", ["version", "model", "package"])
def test_the_stub_refuses_a_package_in_a_directory_others_may_write(tmp_path, fresh_package, where):
    version_dir = _written(tmp_path)
    directory = {
        "version": version_dir,
        "model": version_dir.parent,
        "package": version_dir / _stub_model.PACKAGE,
    }[where]
    directory.chmod(0o777)
    with pytest.raises(ImportError, match=f"refuses to load {directory} .*drwxrwxrwx"):
        _stub_model.load(str(version_dir))
    assert _stub_model.PACKAGE not in sys.modules  # nothing of it ran


@as_root
def test_the_stub_refuses_a_module_another_user_renamed_into_place(tmp_path, fresh_package):
    version_dir = _written(tmp_path)
    planted = version_dir / _stub_model.PACKAGE / "_wire.py"
    os.chown(planted, _nobody(), -1)
    with pytest.raises(ImportError, match=f"refuses to load {planted} .*owner uid {_nobody()}"):
        _stub_model.load(str(version_dir))
    assert _stub_model.PACKAGE not in sys.modules


def test_the_default_workspace_only_warns_about_a_parent_others_may_write(tmp_path, monkeypatch, caplog):
    """The default must keep serving (a container's $HOME may belong to the image's build user): a WARNING."""
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(0o777)
    monkeypatch.setenv("PYTRITON_HOME", str(parent / "home"))
    with caplog.at_level("WARNING", logger="pytriton.server.workspace"):
        workspace = Workspace()
    try:
        assert _mode(workspace.path) == 0o700 and workspace.path.parent == parent / "home"
        assert any(
            str(parent) in record.getMessage() and "PYTRITON_HOME" in record.getMessage() for record in caplog.records
        )
    finally:
        workspace.clean()
    with pytest.raises(UnsafePathError):  # the same place given explicitly is refused
        Workspace(parent / "explicit")
