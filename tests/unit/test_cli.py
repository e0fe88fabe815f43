"""The ``pytriton`` command's argument handling (``pytriton/_cli.py``), without installing anything.

``install_server`` and ``find_server`` are replaced by fakes; the tests check what the command
passes them, what it prints and its exit code.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import types

import pytest

from pytriton import __version__, _cli
from pytriton.exceptions import PyTritonError
from pytriton.server import distribution, install


@pytest.fixture()
def installs(monkeypatch):
    calls = []

    def fake_install_server(from_wheel=None, **kwargs):
        calls.append((from_wheel, kwargs))
        kwargs["progress"]("unpacking")
        return pathlib.Path("/nowhere")

    monkeypatch.setattr(install, "install_server", fake_install_server)
    return calls


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        _cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"pytriton {__version__}"


def test_a_command_is_required(capsys):
    with pytest.raises(SystemExit) as info:
        _cli.main([])
    assert info.value.code == 2
    assert "required: command" in capsys.readouterr().err


def test_an_unknown_option_is_refused(capsys, installs):
    with pytest.raises(SystemExit) as info:
        _cli.main(["install-server", "--from-whl", "x.whl"])
    assert info.value.code == 2
    assert "unrecognized arguments: --from-whl" in capsys.readouterr().err
    assert installs == []


def test_install_server_defaults(capsys, installs):
    assert _cli.main(["install-server"]) == 0
    ((from_wheel, kwargs),) = installs
    assert from_wheel is None
    assert {key: kwargs[key] for key in ("force", "find_links", "stub_env")} == {
        "force": False,
        "find_links": None,
        "stub_env": True,
    }
    assert capsys.readouterr().err == "unpacking\n"  # progress goes to stderr, stdout stays clean


def test_install_server_options(installs, tmp_path):
    wheel, links = tmp_path / "nvidia_pytriton.whl", tmp_path / "wheels"
    code = _cli.main(
        ["install-server", "--from-wheel", str(wheel), "--force", "--find-links", str(links), "--no-stub-env"]
    )
    assert code == 0
    ((from_wheel, kwargs),) = installs
    assert from_wheel == wheel and isinstance(from_wheel, pathlib.Path)
    assert (kwargs["force"], kwargs["find_links"], kwargs["stub_env"]) == (True, links, False)


def test_a_pytriton_error_is_one_line_and_exit_code_1(monkeypatch, capsys):
    def failing(*args, **kwargs):
        raise PyTritonError("the wheel's checksum does not match")

    monkeypatch.setattr(install, "install_server", failing)
    assert _cli.main(["install-server"]) == 1
    captured = capsys.readouterr()
    assert captured.err == "error: the wheel's checksum does not match\n" and captured.out == ""


def test_where_server_prints_the_server_root(monkeypatch, capsys):
    monkeypatch.setattr(distribution, "find_server", lambda: types.SimpleNamespace(root=pathlib.Path("/opt/triton")))
    assert _cli.main(["where-server"]) == 0
    assert capsys.readouterr().out == "/opt/triton\n"


def test_where_server_without_a_server(monkeypatch, capsys):
    def missing():
        raise distribution.PyTritonServerNotInstalledError("no server; run pytriton install-server")

    monkeypatch.setattr(distribution, "find_server", missing)
    assert _cli.main(["where-server"]) == 1
    assert capsys.readouterr().err == "error: no server; run pytriton install-server\n"


def test_python_dash_m_pytriton_is_the_same_command():
    result = subprocess.run(
        [sys.executable, "-m", "pytriton", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and result.stdout.strip() == f"pytriton {__version__}"


def test_run_server_takes_no_token_on_its_command_line(capsys):
    """The token of ``run-server`` comes from $PYTRITON_ACCESS_TOKEN only: an argv is readable by every local user."""
    with pytest.raises(SystemExit) as info:
        _cli.main(["run-server", "--model-repository", "/m", "--access-token", "t"])
    assert info.value.code == 2
    assert "unrecognized arguments: --access-token" in capsys.readouterr().err
