"""Embedded ``Triton``: the stub environment and the API guards.

No server is started here (tests/e2e/test_embedded.py runs one). The launch plan's rendering to
in-process options is tested in tests/unit/test_plan.py.
"""

from __future__ import annotations

import os

import pytest

from pytriton._serving import embedded as _embedded
from pytriton.exceptions import PyTritonBadParameterError, PyTritonInvalidOperationError
from pytriton.triton import Triton


def test_the_stub_environment_drops_the_users_python_variables_and_restores_them(monkeypatch):
    target = {"PATH": "/stub/bin:/usr/bin", "LD_LIBRARY_PATH": "/lib", "MALLOC_ARENA_MAX": "1", "HOME": "/root"}
    current = {"PATH": "/usr/bin", "PYTHONPATH": "/mine", "HOME": "/root", "VIRTUAL_ENV": "/venv"}
    # PATH and LD_LIBRARY_PATH belong to pytriton.inprocess.Server (held for the server's whole life).
    assert _embedded.environment_changes(target, current) == {
        "MALLOC_ARENA_MAX": "1",
        "PYTHONPATH": None,
        "VIRTUAL_ENV": None,
    }
    monkeypatch.setenv("PYTHONPATH", "/mine")
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    before = dict(os.environ)
    target = {key: value for key, value in before.items() if key != "PYTHONPATH"}
    target["MALLOC_ARENA_MAX"] = "1"
    with _embedded.stub_environment(target):
        assert "PYTHONPATH" not in os.environ and os.environ["MALLOC_ARENA_MAX"] == "1"
    assert dict(os.environ) == before


def test_the_embedded_flag_and_the_network_only_names():
    with pytest.raises(PyTritonBadParameterError, match="embedded must be a bool"):
        Triton(embedded="yes")  # type: ignore[arg-type]
    triton = Triton(embedded=True)
    try:
        assert triton.embedded is True
        assert triton.get_access_token() is None  # no endpoint needs one
        for name in ("http_url", "grpc_url"):
            with pytest.raises(PyTritonInvalidOperationError, match="no network endpoints"):
                getattr(triton, name)
        for call in (lambda: triton.inprocess_server, lambda: triton.client("m"), lambda: triton.model("m")):
            with pytest.raises(PyTritonInvalidOperationError, match="not running yet"):
                call()
    finally:
        triton.stop()
    with pytest.raises(PyTritonInvalidOperationError, match="stopped"):
        triton.client("m")
    plain = Triton()
    try:
        assert plain.embedded is False and plain.get_access_token() is not None
        assert plain.http_url.startswith("http://")
        with pytest.raises(PyTritonInvalidOperationError, match="only for Triton\\(embedded=True\\)"):
            plain.client("m")
    finally:
        plain.stop()


@pytest.mark.parametrize(("given", "expected"), [(None, "false"), ("true", "true")])
def test_importing_pytriton_triton_turns_grpc_fork_support_off_unless_set(given, expected):
    """Triton(embedded=True) imports pytriton.inprocess only when constructed, possibly after a gRPC call."""
    import subprocess
    import sys

    env = {key: value for key, value in os.environ.items() if key != "GRPC_ENABLE_FORK_SUPPORT"}
    if given is not None:
        env["GRPC_ENABLE_FORK_SUPPORT"] = given
    code = "import os, sys, pytriton.triton; assert 'pytriton.inprocess' not in sys.modules; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)  # noqa: S603
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected
