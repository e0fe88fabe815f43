"""RemoteTriton without a server: parameters, lifecycle policy, the load request's files, server_command."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from pytriton import _remote
from pytriton.exceptions import PyTritonBadParameterError, PyTritonInvalidOperationError, PyTritonServerError
from pytriton.model_config import Tensor
from pytriton.server.distribution import ServerDistribution, StubEnvironment
from pytriton.triton import RemoteTriton, Triton, TritonConfig, TritonLifecyclePolicy, TritonSecurityConfig


def _bind(triton: Triton, name: str = "Remote") -> None:
    triton.bind(
        name,
        lambda requests: [{"y": request["x"]} for request in requests],
        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
        [Tensor(name="y", shape=(-1,), dtype=np.float32)],
    )


# A RemoteTriton that does not connect when its context is entered: these tests have no server.
OFFLINE = TritonLifecyclePolicy(launch_triton_on_startup=False)


def test_defaults_and_policy():
    assert TritonLifecyclePolicy() == TritonLifecyclePolicy(launch_triton_on_startup=True, local_model_store=False)
    triton = RemoteTriton("localhost", access_token="tok")
    try:
        assert triton.triton_lifecycle_policy == _remote.REMOTE_LIFECYCLE_POLICY
        assert triton.triton_lifecycle_policy.launch_triton_on_startup  # connects on entering its context
        assert triton.get_access_token() == "tok"
        assert triton.http_url == "http://localhost:8000" and triton.tcp_endpoint is None
        # Nothing bound yet: alive exactly when the server at the URL answers (none here).
        assert not triton.is_connected() and not triton.is_alive()
    finally:
        assert triton.stop() is True
    assert triton.stop() is False
    with pytest.raises(PyTritonInvalidOperationError):
        triton.connect()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"triton_lifecycle_policy": "yes"}, "must be a TritonLifecyclePolicy"),
        ({"transport": "udp"}, "transport must be one of"),
        ({"access_token": ""}, "access_token must be a non-empty string"),
    ],
)
def test_bad_parameters(kwargs, message):
    with pytest.raises(PyTritonBadParameterError, match=message):
        RemoteTriton("localhost", **kwargs)


def test_connect_names_an_unreachable_server(free_port):
    with RemoteTriton(f"http://127.0.0.1:{free_port}", triton_lifecycle_policy=OFFLINE) as triton:
        with pytest.raises(PyTritonServerError, match="Cannot reach Triton at http://127.0.0.1"):
            triton.connect(timeout_s=0.2)
        assert not triton.is_connected()


def test_entering_the_context_connects(free_port, monkeypatch):
    # The default policy connects on entering the block (NVIDIA PyTriton's RemoteTriton does); a
    # server that does not answer fails the `with` itself, and nothing is left behind.
    from pytriton._serving import remote as remote_backend

    monkeypatch.setattr(remote_backend, "CONNECT_TIMEOUT_S", 0.2)
    triton = RemoteTriton(f"http://127.0.0.1:{free_port}")
    with pytest.raises(PyTritonServerError, match="Cannot reach Triton at http://127.0.0.1"):
        with triton:
            pass
    assert not triton._workspace.path.exists()  # stopped by the failed __enter__


@pytest.fixture()
def free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_tcp_transport_writes_the_endpoint_and_token_into_the_private_file(tmp_path):
    with RemoteTriton(
        "grpc://localhost", workspace=tmp_path, transport="tcp", triton_lifecycle_policy=OFFLINE
    ) as triton:
        assert triton.grpc_url == "grpc://localhost:8001"
        endpoint = triton.tcp_endpoint
        assert endpoint is not None and endpoint.startswith("tcp://127.0.0.1:")
        _bind(triton)
        triton._repository = triton._remote.model_store(triton._workspace)
        triton._write_name("Remote")
        config, files = triton._remote.model_files("Remote")
        assert json.loads(config)["name"] == "Remote"
        assert {
            "file:1/model.py",
            "file:1/_pytriton_stubside/_wire.py",
            "file:1/_pytriton_stubside/_zmq_channel.py",
        } <= set(files)
        private = json.loads(files["file:1/pytriton_private.json"])
        assert private["tcp"]["endpoint"] == endpoint and private["tcp"]["route"] == "m1"
        assert len(private["tcp"]["token"]) >= 32
        assert private["tcp"]["server_key"] == triton._remote.hub.public_key  # CURVE by default
        assert "token" not in config  # the secret is not in the public model config


def test_local_model_store_writes_into_the_given_repository(tmp_path):
    policy = TritonLifecyclePolicy(launch_triton_on_startup=False, local_model_store=True)
    shared = tmp_path / "shared"
    with RemoteTriton("localhost", config=TritonConfig(model_repository=shared), triton_lifecycle_policy=policy) as t:
        assert t._remote.model_store(t._workspace) == shared
    with RemoteTriton("localhost", workspace=tmp_path / "ws", triton_lifecycle_policy=policy) as t:
        assert t._remote.model_store(t._workspace) == (tmp_path / "ws").resolve()


def test_server_command(monkeypatch, tmp_path):
    root = tmp_path / "tritonserver"
    distribution = ServerDistribution(
        root=root, binary=root / "bin" / "tritonserver", backend_dir=root / "backends", library_dirs=[root / "lib"],
        cache_dir=None,
    )  # fmt: skip
    monkeypatch.setattr(_remote, "find_server", lambda explicit=None: distribution)
    monkeypatch.setattr(
        _remote, "stub_environment", lambda: StubEnvironment(bin_dir=tmp_path / "stub" / "bin", own=True)
    )
    monkeypatch.setattr(_remote, "shared_libpython_dir", lambda: tmp_path / "libpython")
    argv, env = _remote.server_command(
        tmp_path / "repo", TritonConfig(http_port=9000), TritonSecurityConfig(access_token="tok")
    )
    assert argv[0] == str(root / "bin" / "tritonserver")
    assert "--model-control-mode=explicit" in argv and "--disable-auto-complete-config" in argv
    assert f"--model-repository={tmp_path / 'repo'}" in argv and "--http-port=9000" in argv
    assert any(arg.startswith("--http-restricted-api=") and "model-repository" in arg for arg in argv)
    assert not any(arg.startswith("--load-model") for arg in argv)
    assert env["PATH"].startswith(str(tmp_path / "stub" / "bin"))
    assert env["LD_LIBRARY_PATH"].split(":")[:2] == [str(tmp_path / "libpython"), str(root / "lib")]
    line = _remote.command_text(argv, env)
    assert line.startswith("env PATH=") and str(pathlib.Path(argv[0])) in line


def test_cli_prints_the_server_command(monkeypatch, tmp_path, capsys):
    from pytriton import _cli

    root = tmp_path / "tritonserver"
    distribution = ServerDistribution(
        root=root, binary=root / "bin" / "tritonserver", backend_dir=root / "backends", library_dirs=[],
        cache_dir=None,
    )  # fmt: skip
    monkeypatch.setattr(_remote, "find_server", lambda explicit=None: distribution)
    monkeypatch.setattr(_remote, "stub_environment", lambda: StubEnvironment(bin_dir=tmp_path / "bin", own=True))
    monkeypatch.setattr(_remote, "shared_libpython_dir", lambda: tmp_path / "libpython")
    argv = ["server-command", "--model-repository", str(tmp_path / "repo"), "--http-port", "9100"]
    assert _cli.main([*argv, "--access-token", "tok"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("env PATH=") and "--http-port=9100" in line and "triton-access-token=tok" in line
    assert _cli.main(argv) == 0
    generated = capsys.readouterr().err.split(": ")[-1].strip()
    assert len(generated) >= 32


class _FakeTraceClient:
    """The tritonclient client RemoteBackend makes: records update_trace_settings, fails when told."""

    def __init__(self, calls, refuse=False):
        self.calls, self.refuse = calls, refuse

    def update_trace_settings(self, model_name=None, settings=None, headers=None):
        from tritonclient.utils import InferenceServerException

        self.calls.append((model_name, settings, headers))
        if self.refuse:
            raise InferenceServerException("[StatusCode.PERMISSION_DENIED] needs the token")

    def close(self):
        self.calls.append("closed")


@pytest.mark.parametrize("url", ["http://triton.example:8000", "grpc://triton.example:8001"])
def test_trace_settings_go_to_the_remote_server_with_the_token(monkeypatch, url):
    """Per-model trace settings reach the server at ``url``, not TritonConfig's local ports (which they once did)."""
    calls = []
    with RemoteTriton(
        url, access_token="tok", config=TritonConfig(http_port=1, grpc_port=2), triton_lifecycle_policy=OFFLINE
    ) as triton:
        backend = triton._remote
        monkeypatch.setattr(backend, "_client", lambda: _FakeTraceClient(calls))
        backend.send_trace_settings("Traced", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        ((name, settings, headers), closed) = calls
        assert (name, settings, closed) == ("Traced", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}, "closed")
        assert headers and "tok" in headers.values()
        calls.clear()
        monkeypatch.setattr(backend, "_client", lambda: _FakeTraceClient(calls, refuse=True))
        with pytest.raises(
            PyTritonServerError, match="Triton at .*triton.example.* refused the trace settings.*Traced.*token"
        ):
            backend.send_trace_settings("Traced", {"trace_level": None})
        assert calls[-1] == "closed"
