"""install-server from a local wheel: layout, hash verification, idempotency, errors."""

import hashlib
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

from pytriton.exceptions import PyTritonServerNotInstalledError
from pytriton.server import distribution as dist
from pytriton.server.install import InstallError, install_server


def _fake_wheel(path: pathlib.Path) -> pathlib.Path:
    files = {
        "pytriton/__init__.py": "raise SystemExit('the wheel python code must never be unpacked')",
        "pytriton/tritonserver/bin/tritonserver": "#!/bin/sh\necho fake\n",
        "pytriton/tritonserver/backends/python/libtriton_python.so": "so",
        "pytriton/tritonserver/backends/python/triton_python_backend_utils.py": "# utils",
        "pytriton/tritonserver/caches/local/libtritoncache_local.so": "cache",
        f"pytriton/tritonserver/python_backend_stubs/{dist.python_tag()}/triton_python_backend_stub": "stub",
        "pytriton/tritonserver/python_backend_stubs/3.8/triton_python_backend_stub": "old stub",
        "nvidia_pytriton.libs/libfoo-1234.so.1": "lib",
    }
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o755 if "bin/" in name or "stub" in name else 0o644) << 16
            archive.writestr(info, content)
    return path


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTRITON_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PYTRITON_TRITONSERVER_DIR", raising=False)
    return tmp_path / "home"


@pytest.fixture()
def wheel(tmp_path, monkeypatch):
    path = _fake_wheel(tmp_path / "nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    monkeypatch.setitem(dist.SOURCE_WHEEL_SHA256, dist.machine_arch(), digest)
    return path


def test_install_from_local_wheel_builds_the_layout(home, wheel):
    messages = []
    target = install_server(wheel, stub_env=False, progress=messages.append)
    assert target == home / "tritonserver" / dist.TRITON_VERSION
    assert os.access(target / "bin" / "tritonserver", os.X_OK)
    assert (target / "lib" / "libfoo-1234.so.1").is_file()
    assert (target / "caches" / "local" / "libtritoncache_local.so").is_file()
    own_backend = target / f"backends-py{dist.python_tag()}" / "python"
    assert (own_backend / "triton_python_backend_stub").read_text() == "stub"
    assert (own_backend / "libtriton_python.so").is_file()
    assert not (target / "pytriton").exists() and not (target / "__init__.py").exists()
    assert any("Installed" in message for message in messages)
    found = dist.find_server()
    assert found.root == target and found.backend_dir == own_backend.parent
    assert found.library_dirs == [target / "lib"]


def test_install_is_idempotent(home, wheel):
    install_server(wheel, stub_env=False, progress=lambda _: None)
    marker = home / "tritonserver" / dist.TRITON_VERSION / "bin" / "tritonserver"
    before = marker.stat().st_mtime_ns
    messages = []
    install_server(wheel, stub_env=False, progress=messages.append)
    assert marker.stat().st_mtime_ns == before
    assert any("already installed" in message for message in messages)


def test_corrupted_wheel_is_rejected_and_leaves_nothing(home, wheel):
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF
    wheel.write_bytes(bytes(data))
    with pytest.raises(InstallError, match="sha256"):
        install_server(wheel, stub_env=False, progress=lambda _: None)
    assert not (home / "tritonserver" / dist.TRITON_VERSION).exists()
    assert list((home / "tritonserver").iterdir()) == []


def test_missing_wheel_file(home):
    with pytest.raises(InstallError, match="no such file"):
        install_server(pathlib.Path("/nonexistent/x.whl"), stub_env=False, progress=lambda _: None)


def test_no_network_error_says_how_to_install_offline(home, monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(InstallError, match="--from-wheel"):
        install_server(None, stub_env=False, progress=lambda _: None)
    assert not (home / "tritonserver" / dist.TRITON_VERSION).exists()


def test_stub_environment_offline_asks_pip_the_folder(home, tmp_path, monkeypatch):
    """``--find-links DIR`` reaches ``pip install`` (an empty folder: pip finds no numpy there)."""
    from pytriton.server.install import create_stub_environment

    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setattr(dist, "python_version", lambda: (3, 11))  # 3.13+ makes no stub environment at all
    empty = tmp_path / "wheels"
    empty.mkdir()
    with pytest.raises(InstallError) as caught:
        create_stub_environment(lambda _: None, find_links=empty, home=home)
    message = str(caught.value)
    assert "no such option" not in message
    assert "No matching distribution" in message or "Could not find a version" in message, message


class _FakePip:
    """``subprocess.run`` of the install module: records each pip command, "installs" the requirement."""

    def __init__(self):
        self.commands = []

    def __call__(self, command, **kwargs):
        self.commands.append(command)
        target = pathlib.Path(command[command.index("--target") + 1])
        package = "zmq" if command[-1].startswith("pyzmq") else command[-1].split(">")[0]
        (target / package).mkdir(parents=True)
        (target / package / "__init__.py").write_text("")
        return subprocess.CompletedProcess(command, 0, stderr="")


def _existing_stub_env(home):
    env = dist.stub_env_dir(home)
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python3").write_text("")
    site = dist.site_packages(env)
    (site / "numpy").mkdir(parents=True)
    (site / "numpy" / "__init__.py").write_text("")
    return site


def test_with_pyzmq_adds_pyzmq_to_the_stub_environment_once(home, tmp_path, monkeypatch):
    """``install-server --with-pyzmq``: pyzmq goes into the existing stub environment, offline too, and only once."""
    from pytriton.server import install

    monkeypatch.setattr(dist, "python_version", lambda: (3, 11))
    site = _existing_stub_env(home)
    pip = _FakePip()
    monkeypatch.setattr(install.subprocess, "run", pip)
    wheels = tmp_path / "wheels"
    assert install.create_stub_environment(lambda _: None, find_links=wheels, home=home, pyzmq=True)
    (command,) = pip.commands
    assert command[-1] == install.STUB_PYZMQ_REQUIREMENT and "--only-binary=:all:" in command
    assert command[command.index("--target") + 1] == str(site)
    assert command[command.index("--find-links") + 1] == str(wheels) and "--no-index" in command
    assert (site / "zmq" / "__init__.py").is_file()
    install.create_stub_environment(lambda _: None, home=home, pyzmq=True)
    install.create_stub_environment(lambda _: None, home=home)
    assert len(pip.commands) == 1  # already there, or not asked for


def test_without_pyzmq_the_stub_environment_gets_numpy_only(home, monkeypatch):
    from pytriton.server import install

    monkeypatch.setattr(dist, "python_version", lambda: (3, 11))
    pip = _FakePip()
    monkeypatch.setattr(install.subprocess, "run", lambda command, **kwargs: pip(command) if "pip" in command else None)
    env = install.create_stub_environment(lambda _: None, home=home)
    (command,) = pip.commands
    assert command[-1] == dist.STUB_NUMPY_REQUIREMENT
    assert env is not None and dist._site_packages_has(env, "numpy") and not dist._site_packages_has(env, "zmq")


def test_with_pyzmq_on_python_3_13_names_the_extra(home, monkeypatch):
    """3.13 has no private stub environment: the stub imports pyzmq from the user's, which is told how to get it."""
    from pytriton.server import install

    monkeypatch.setattr(dist, "python_version", lambda: (3, 13))
    monkeypatch.setitem(sys.modules, "zmq", None)  # this environment then cannot import pyzmq
    said = []
    assert install.create_stub_environment(said.append, home=home, pyzmq=True) is None
    assert "pip install 'pytriton[remote]'" in said[-1]


def test_missing_server_error_names_the_command(home, monkeypatch):
    monkeypatch.setattr(dist, "NGC_DIR", home / "no-ngc")
    with pytest.raises(PyTritonServerNotInstalledError, match="pytriton install-server"):
        dist.find_server()


def test_explicit_dir_that_is_not_a_server(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTRITON_TRITONSERVER_DIR", str(tmp_path))
    with pytest.raises(PyTritonServerNotInstalledError, match="PYTRITON_TRITONSERVER_DIR"):
        dist.find_server()
