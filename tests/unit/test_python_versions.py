"""Pythons without a backend stub (3.14, 3.8) are refused at once, naming the supported versions.

The running interpreter's version is injected through ``distribution.python_version``.
"""

import pathlib
import re

import pytest

from pytriton._cli import main
from pytriton.exceptions import PyTritonServerError
from pytriton.server import distribution as dist
from pytriton.server import install
from pytriton.triton import Triton

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture()
def python_314(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTRITON_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(dist, "python_version", lambda: (3, 14))


@pytest.mark.parametrize("version", [(3, 9), (3, 10), (3, 11), (3, 12), (3, 13)])
def test_supported_versions_pass(version):
    dist.check_python_supported(version)


@pytest.mark.parametrize("version", [(3, 8), (3, 14), (3, 15), (4, 0)])
def test_other_versions_are_refused_naming_the_supported_ones(version):
    with pytest.raises(PyTritonServerError) as info:
        dist.check_python_supported(version)
    message = str(info.value)
    assert "Python 3.9 to 3.13" in message and f"this is Python {version[0]}.{version[1]}" in message


def test_triton_refuses_at_construction(python_314):
    with pytest.raises(PyTritonServerError, match="3.9 to 3.13"):
        Triton()


def test_install_server_refuses_before_downloading(python_314, monkeypatch):
    def no_download(*_args, **_kwargs):
        raise AssertionError("install-server downloaded on an unsupported Python")

    monkeypatch.setattr(install, "download_wheel", no_download)
    with pytest.raises(PyTritonServerError, match="3.9 to 3.13"):
        install.install_server()


def test_install_server_command_says_why(python_314, capsys):
    assert main(["install-server"]) == 1
    assert "error: pytriton supports Python 3.9 to 3.13; this is Python 3.14" in capsys.readouterr().err


def test_requires_python_and_readme_agree_with_the_check():
    (low_major, low_minor), (high_major, high_minor) = dist.SUPPORTED_PYTHONS
    pyproject = (ROOT / "pyproject.toml").read_text()
    specifier = re.search(r'requires-python = "([^"]+)"', pyproject)
    assert specifier and specifier.group(1) == f">={low_major}.{low_minor},<{high_major}.{high_minor + 1}"
    readme = (ROOT / "README.md").read_text()
    assert f"{low_major}.{low_minor} to {high_major}.{high_minor}" in readme
    assert f"{high_major}.{high_minor + 1}" in readme  # the README says what happens on the next one
