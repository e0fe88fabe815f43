"""Access control and privacy against a live server (issue 18, items 1 and 6).

Restricted endpoints refuse callers without the token (HTTP 403, gRPC error) and serve those with
it; Triton's code-loading attack is refused; pytriton's own calls pass; every client can send the
token; inference stays open; the public model config reveals nothing private; shared memory is not
readable by other users; gRPC TLS works.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import pathlib
import pwd
import shutil
import stat
import subprocess
import time
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pytriton._serving.supervisor import wait_detached
from pytriton.client import (
    AsyncioDecoupledModelClient,
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)
from pytriton.client.auth import create_auth_headers
from pytriton.client.exceptions import PyTritonClientError, PyTritonClientPermissionError, PyTritonClientTimeoutError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.stubside import _arena
from pytriton.triton import VALID_TRITON_ENDPOINTS, Triton, TritonConfig, TritonSecurityConfig
from tests.conftest import triton_ports, wait_for
from tests.e2e._kinds import model
from tests.e2e.kind_models import identity_to_y

X = np.arange(6, dtype=np.float32)


def stream(requests):
    for step in range(3):
        yield [{"y": request["x"] + step} for request in requests]


def _bind_identity(triton: Triton, name: str = "Identity", kind: str = "thread") -> None:
    triton.bind(
        name,
        identity_to_y,
        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
        [Tensor(name="y", shape=(-1,), dtype=np.float32)],
        config=ModelConfig(batching=False),
        instance_kind=kind,
    )


class Server:
    """A running Triton plus raw-request helpers."""

    def __init__(self, triton: Triton, ports: Dict[str, int]):
        self.triton = triton
        self.ports = ports
        self.http_url = f"http://127.0.0.1:{ports['http_port']}"
        self.grpc_url = f"grpc://127.0.0.1:{ports['grpc_port']}"

    def request(
        self, method: str, path: str, body: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None
    ) -> Tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.ports["http_port"], timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def token_headers(self) -> Dict[str, str]:
        return create_auth_headers(self.triton.get_access_token(), "http")


def _serve(
    config: TritonConfig, security: Optional[TritonSecurityConfig], ports: Dict[str, int], kinds: Tuple[str, ...] = ()
) -> Iterator[Server]:
    """A server with models Identity and Stream, and Identity on each of ``kinds`` too (tests/e2e/_kinds.py)."""
    with Triton(config=config, security_config=security) as triton:
        _bind_identity(triton)
        for kind in kinds:
            _bind_identity(triton, model("Identity", kind), kind)
        triton.bind(
            "Stream",
            stream,
            [Tensor(name="x", shape=(-1,), dtype=np.float32)],
            [Tensor(name="y", shape=(-1,), dtype=np.float32)],
            config=ModelConfig(batching=False, decoupled=True),
        )
        triton.run()
        yield Server(triton, ports)


@pytest.fixture(scope="module")
def secured() -> Iterator[Server]:
    """The default configuration: nothing about security is set."""
    ports = triton_ports()
    yield from _serve(TritonConfig(**ports), None, ports, kinds=("backend",))


@pytest.fixture(scope="module")
def opted_out() -> Iterator[Server]:
    ports = triton_ports()
    yield from _serve(TritonConfig(**ports), TritonSecurityConfig(restricted_endpoints=[]), ports)


@pytest.fixture(scope="module")
def locked() -> Iterator[Server]:
    """Every endpoint group restricted, inference and health included: only the token gets in."""
    ports = triton_ports()
    security = TritonSecurityConfig(restricted_endpoints=sorted(VALID_TRITON_ENDPOINTS))
    yield from _serve(TritonConfig(**ports), security, ports)


# -- restricted endpoints, HTTP -------------------------------------------------------------------
# (method, path, body): one or more calls of each restricted group, none of them destructive with
# the token except where a test cleans up after itself.
HTTP_RESTRICTED = [
    ("POST", "/v2/repository/index", b"{}"),
    ("GET", "/v2/models/stats", None),
    ("GET", "/v2/models/Identity/stats", None),
    ("GET", "/v2/trace/setting", None),
    ("GET", "/v2/models/Identity/trace/setting", None),
    ("GET", "/v2/logging", None),
    ("GET", "/v2/systemsharedmemory/status", None),
]
HTTP_DESTRUCTIVE = [
    ("POST", "/v2/repository/models/Identity/unload", b"{}"),
    ("POST", "/v2/repository/models/Identity/load", b"{}"),
    ("POST", "/v2/logging", json.dumps({"log_verbose_level": 3}).encode()),
    ("POST", "/v2/trace/setting", json.dumps({"trace_level": ["TIMESTAMPS"]}).encode()),
    (
        "POST",
        "/v2/systemsharedmemory/region/r/register",
        json.dumps({"key": "/x", "offset": 0, "byte_size": 8}).encode(),
    ),
    ("POST", "/v2/systemsharedmemory/unregister", b"{}"),
    ("POST", "/v2/cudasharedmemory/unregister", b"{}"),
]


@pytest.mark.parametrize("method, path, body", HTTP_RESTRICTED + HTTP_DESTRUCTIVE)
def test_http_admin_endpoints_refuse_callers_without_the_token(secured, method, path, body):
    for headers in (None, {"triton-access-token": "wrong"}):
        status, answer = secured.request(method, path, body, headers)
        assert status == 403, (path, answer)
        assert b"restricted" in answer
    # The model is untouched by the refused unload.
    assert secured.request("GET", "/v2/models/Identity/ready")[0] == 200


@pytest.mark.parametrize("method, path, body", HTTP_RESTRICTED)
def test_http_admin_endpoints_serve_the_token(secured, method, path, body):
    status, answer = secured.request(method, path, body, secured.token_headers())
    assert status == 200, (path, answer)


def test_http_shared_memory_and_logging_work_with_the_token(secured):
    headers = secured.token_headers()
    name = f"pytriton-{os.getpid()}-e2e-client-region"
    path = pathlib.Path(_arena.SHM_DIR) / name
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(descriptor, 4096)
        body = json.dumps({"key": f"/{name}", "offset": 0, "byte_size": 4096}).encode()
        assert secured.request("POST", "/v2/systemsharedmemory/region/e2e/register", body, headers)[0] == 200
        status, answer = secured.request("GET", "/v2/systemsharedmemory/status", None, headers)
        assert status == 200 and b"e2e" in answer
        assert secured.request("POST", "/v2/systemsharedmemory/region/e2e/unregister", b"{}", headers)[0] == 200
    finally:
        os.close(descriptor)
        path.unlink()
    status, answer = secured.request("GET", "/v2/logging", None, headers)
    level = json.loads(answer)["log_verbose_level"]
    body = json.dumps({"log_verbose_level": level}).encode()
    assert secured.request("POST", "/v2/logging", body, headers)[0] == 200


# -- restricted endpoints, gRPC -------------------------------------------------------------------
GRPC_RESTRICTED = [
    ("get_model_repository_index", ()),
    ("get_inference_statistics", ()),
    ("get_trace_settings", ()),
    ("get_log_settings", ()),
    ("get_system_shared_memory_status", ()),
    ("load_model", ("Identity",)),
    ("unload_model", ("Identity",)),
    ("update_log_settings", ({"log_verbose_level": 3},)),
    ("register_system_shared_memory", ("r", "/nothing", 8)),
]


@pytest.mark.parametrize("method, args", GRPC_RESTRICTED)
def test_grpc_admin_protocols_refuse_callers_without_the_token(secured, method, args):
    client = grpcclient.InferenceServerClient(secured.grpc_url.split("://")[1])
    try:
        for headers in (None, {"triton-grpc-protocol-triton-access-token": "wrong"}, secured.token_headers()):
            with pytest.raises(InferenceServerException, match="restricted"):
                getattr(client, method)(*args, headers=headers)
        assert client.is_model_ready("Identity")
    finally:
        client.close()


@pytest.mark.parametrize("method", [name for name, args in GRPC_RESTRICTED if not args])
def test_grpc_admin_protocols_serve_the_token(secured, method):
    client = grpcclient.InferenceServerClient(secured.grpc_url.split("://")[1])
    try:
        getattr(client, method)(headers=create_auth_headers(secured.triton.get_access_token(), "grpc"))
    finally:
        client.close()


# -- the attack from the issue --------------------------------------------------------------------
def _attack(server: Server, marker: pathlib.Path) -> int:
    """Ask the server to load a model whose code is in the request (Triton's file override)."""
    code = f"open({str(marker)!r}, 'w').write('ran')\nclass TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
    config = {
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    parameters = {"config": json.dumps(config), "file:1/model.py": base64.b64encode(code.encode()).decode()}
    return server.request(
        "POST", "/v2/repository/models/Injected/load", json.dumps({"parameters": parameters}).encode()
    )[0]


def test_code_loading_attack_is_refused_by_default(secured, tmp_path):
    marker = tmp_path / "ran"
    assert _attack(secured, marker) == 403
    assert not marker.exists()
    assert secured.request("GET", "/v2/models/Injected/ready")[0] != 200


def test_opt_out_restores_open_endpoints_and_with_them_the_attack(opted_out, tmp_path):
    # Shows the attack above is real: with restriction off, the injected code runs.
    assert opted_out.triton.get_access_token() is None
    assert opted_out.request("GET", "/v2/models/stats")[0] == 200
    marker = tmp_path / "ran"
    assert _attack(opted_out, marker) == 200
    assert marker.read_text() == "ran"
    assert opted_out.request("POST", "/v2/repository/models/Injected/unload", b"{}")[0] == 200


# -- pytriton's own calls pass the restriction ----------------------------------------------------
def test_bind_after_run_with_restriction_on(secured):
    _bind_identity(secured.triton, "Late")
    with ModelClient(secured.http_url, "Late") as client:
        np.testing.assert_array_equal(client.infer_sample(x=X)["y"], X)


def test_repository_helper_unloads_and_reloads_with_the_token(secured):
    # The one path for pytriton's repository calls (model reloads use it too).
    _bind_identity(secured.triton, "Reloaded")
    secured.triton._backend.repository_request("unload", "Reloaded")
    assert wait_for(lambda: secured.request("GET", "/v2/models/Reloaded/ready")[0] != 200, timeout_s=30.0)
    # Triton's unload answers before the stubs exit; a load racing their teardown once crashed the
    # server in CI (SIGSEGV), so the reload starts after they have detached, as unbind() does.
    models = secured.triton._versions("Reloaded")
    assert wait_detached(models, time.monotonic() + 30.0)
    secured.triton._backend.repository_request("load", "Reloaded")
    with ModelClient(secured.http_url, "Reloaded") as client:
        np.testing.assert_array_equal(client.infer_sample(x=X)["y"], X)


def _model_stubs(server_pid: int, name: str) -> List[int]:
    """The stub processes of model ``name`` (their command line names the model's directory)."""
    stubs = []
    for pid in _children(server_pid):
        try:
            argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"stub" in argv[0] and any(f"/{name}/".encode() in part for part in argv):
            stubs.append(pid)
    return stubs


def test_a_reload_through_the_repository_api_is_prompt_and_leaves_no_extra_stub(secured):
    """Issue 25, item 8: Triton starts the reloaded model's stubs while the old ones still hold their slots."""
    triton = secured.triton
    triton.bind(
        "ApiReloaded",
        [identity_to_y, identity_to_y],  # two instances: two slots to share with the old load
        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
        [Tensor(name="y", shape=(-1,), dtype=np.float32)],
        config=ModelConfig(batching=False),
    )
    server_pid = triton._backend.server.pid
    before = sorted(_model_stubs(server_pid, "ApiReloaded"))
    assert len(before) == 2
    # Triton reloads only a model whose files changed since its load (it compares modification
    # times); a load of an unchanged one answers at once and keeps its stubs. The model changes, as
    # before a real reload. (Stubs of Python 3.10 and later write model.py's bytecode cache next to
    # it, which is such a change; 3.9 stubs honour PYTHONDONTWRITEBYTECODE, set in CI, and do not.)
    assert triton._repository is not None
    os.utime(triton._repository / "ApiReloaded" / "1")
    started = time.monotonic()
    status, body = secured.request("POST", "/v2/repository/models/ApiReloaded/load", b"{}", secured.token_headers())
    took = time.monotonic() - started
    assert status == 200, body
    assert took < 15.0, f"the reload took {took:.1f} s"  # before: 60 s, then a failed load
    assert wait_for(lambda: len(_model_stubs(server_pid, "ApiReloaded")) == 2, timeout_s=30.0)
    after = sorted(_model_stubs(server_pid, "ApiReloaded"))
    assert not set(after) & set(before), "the old instances are still there"
    for _ in range(5):
        with ModelClient(secured.http_url, "ApiReloaded") as client:
            np.testing.assert_array_equal(client.infer_sample(x=X)["y"], X)
    time.sleep(1.0)  # the old stubs' exit must not look like a death to pytriton (no new generation)
    assert triton._versions("ApiReloaded")[0].generation == 0
    assert sorted(_model_stubs(server_pid, "ApiReloaded")) == after


def test_users_own_http_restriction_on_repository_and_health_still_works():
    ports = triton_ports()
    config = TritonConfig(http_restricted_api="model-repository,health:admin-key=s3cret", **ports)
    with Triton(config=config) as triton:
        _bind_identity(triton)
        triton.run()  # the readiness probe passes the user's health restriction
        _bind_identity(triton, "Late")  # the load passes the user's repository restriction
        server = Server(triton, ports)
        assert server.request("POST", "/v2/repository/index", b"{}")[0] == 403
        assert server.request("POST", "/v2/repository/index", b"{}", server.token_headers())[0] == 403
        assert server.request("POST", "/v2/repository/index", b"{}", {"admin-key": "s3cret"})[0] == 200
        assert server.request("GET", "/v2/models/stats")[0] == 403  # the token still covers the rest
        assert server.request("GET", "/v2/models/stats", None, server.token_headers())[0] == 200
        with ModelClient(server.grpc_url, "Late") as client:
            np.testing.assert_array_equal(client.infer_sample(x=X)["y"], X)


def test_grpc_only_server_loads_through_the_restriction():
    ports = triton_ports()
    config = TritonConfig(allow_http=False, grpc_restricted_protocol="health:admin-key=s3cret", **ports)
    with Triton(config=config) as triton:
        _bind_identity(triton)
        triton.run()
        _bind_identity(triton, "Late")  # gRPC load with the token; the probe with the user's header
        triton._backend.repository_request("unload", "Late")
        assert wait_detached(triton._versions("Late"), time.monotonic() + 30.0)
        triton._backend.repository_request("load", "Late")
        token = triton.get_access_token()
        with ModelClient(f"grpc://127.0.0.1:{ports['grpc_port']}", "Late", access_token=token) as client:
            with pytest.raises(PyTritonClientError):
                client.wait_for_model(2.0)  # health needs admin-key, which the client does not have
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
        try:
            assert client.is_model_ready("Late", headers={"triton-grpc-protocol-admin-key": "s3cret"})
            client.get_model_repository_index(headers=create_auth_headers(token, "grpc"))
        finally:
            client.close()


# -- clients --------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_clients_send_the_token_on_every_call(locked, protocol):
    url = locked.http_url if protocol == "http" else locked.grpc_url
    token = locked.triton.get_access_token()
    with ModelClient(url, "Identity", access_token=token) as client:
        np.testing.assert_array_equal(client.infer_sample(x=X)["y"], X)
        clone = ModelClient.from_existing_client(client)
        np.testing.assert_array_equal(clone.infer_sample(x=X)["y"], X)
        clone.close()
    with FuturesModelClient(url, "Identity", access_token=token, max_workers=2) as futures:
        results = [futures.infer_sample(x=X) for _ in range(4)]
        for result in results:
            np.testing.assert_array_equal(result.result(timeout=60)["y"], X)

    async def asyncio_client() -> None:
        async with AsyncioModelClient(url, "Identity", access_token=token) as client:
            np.testing.assert_array_equal((await client.infer_sample(x=X))["y"], X)

    asyncio.run(asyncio_client())
    # Without the token every step fails: readiness (health), config and inference are restricted
    # here. Over gRPC the readiness wait reports the refusal at once as a permission error instead
    # of retrying it (gRPC's refusal is UNAVAILABLE) until init_timeout_s ends in a timeout error;
    # tritonclient's HTTP readiness call answers False for a 403, so HTTP waits for its timeout.
    expected, init_timeout_s = (
        (PyTritonClientPermissionError, 60.0) if protocol == "grpc" else (PyTritonClientTimeoutError, 1.0)
    )
    with ModelClient(url, "Identity", init_timeout_s=init_timeout_s) as client, pytest.raises(expected):
        client.infer_sample(x=X)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_refused_restricted_call_is_a_permission_error_not_a_retryable_one(secured, protocol):
    url = secured.http_url if protocol == "http" else secured.grpc_url
    with ModelClient(url, "Identity") as client:
        with pytest.raises(PyTritonClientPermissionError, match="access_token=") as refused:
            client.unload_model()
        assert "Unloading model 'Identity' was refused" in refused.value.message
        np.testing.assert_array_equal(client.infer_sample(x=X)["y"], X)  # nothing was unloaded


def test_streaming_clients_send_the_token(locked):
    token = locked.triton.get_access_token()
    with DecoupledModelClient(locked.grpc_url, "Stream", access_token=token) as client:
        chunks = [chunk["y"] for chunk in client.infer_sample(x=X)]
    assert [chunk.tolist() for chunk in chunks] == [(X + step).tolist() for step in range(3)]

    async def asyncio_stream() -> List[np.ndarray]:
        async with AsyncioDecoupledModelClient(locked.grpc_url, "Stream", access_token=token) as client:
            return [chunk["y"] async for chunk in client.infer_sample(x=X)]

    assert len(asyncio.run(asyncio_stream())) == 3
    with DecoupledModelClient(locked.grpc_url, "Stream", init_timeout_s=1.0) as client:
        with pytest.raises(PyTritonClientError):
            list(client.infer_sample(x=X))


def test_bind_after_run_when_every_endpoint_is_locked(locked):
    _bind_identity(locked.triton, "LateLocked")
    token = locked.triton.get_access_token()
    with ModelClient(locked.http_url, "LateLocked", access_token=token) as client:
        np.testing.assert_array_equal(client.infer_sample(x=X)["y"], X)


# -- what stays open ------------------------------------------------------------------------------
def test_inference_health_metadata_and_config_stay_open_to_raw_clients(secured):
    http_client = httpclient.InferenceServerClient(secured.http_url.split("://")[1])
    grpc_client = grpcclient.InferenceServerClient(secured.grpc_url.split("://")[1])
    try:
        for lib, client in ((httpclient, http_client), (grpcclient, grpc_client)):
            assert client.is_server_ready() and client.is_model_ready("Identity")
            assert client.get_server_metadata() and client.get_model_metadata("Identity")
            assert client.get_model_config("Identity")
            tensor = lib.InferInput("x", [6], "FP32")
            tensor.set_data_from_numpy(X)
            np.testing.assert_array_equal(client.infer("Identity", [tensor]).as_numpy("y"), X)
    finally:
        http_client.close()
        grpc_client.close()


def test_public_model_config_holds_no_pid_path_or_prefix(secured, kind):
    triton = secured.triton
    status, body = secured.request("GET", f"/v2/models/{model('Identity', kind)}/config")
    assert status == 200
    config = json.loads(body)
    # only the stub generation, an integer (a raised value makes Triton reload the model)
    assert config["parameters"] == {"pytriton.generation": {"string_value": "0"}}
    text = body.decode()
    socket_dir = str(triton._socket_dir)
    for private in (f"pytriton-{os.getpid()}", socket_dir, triton._shm_prefix, "user_pid", "endpoint_dir", "shm"):
        assert private not in text, private
    assert str(os.getpid()) not in json.dumps(config.get("parameters"))


# -- shared memory is private ---------------------------------------------------------------------
def _children(pid: int) -> List[int]:
    result = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = pathlib.Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                result.append(int(entry))
    return result


def _mapped_segments(pid: int, prefix: str) -> Dict[str, int]:
    """Mode of every shared-memory file ``pid`` maps whose name starts with ``prefix`` (unlinked ones too)."""
    modes = {}
    for line in pathlib.Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith(f"/dev/shm/{prefix}"):
            try:
                modes[parts[5]] = stat.S_IMODE(os.stat(f"/proc/{pid}/map_files/{parts[0]}").st_mode)
            except OSError:  # map_files needs privileges some sandboxes do not grant
                continue
    return modes


def test_shared_memory_has_no_group_or_other_bits(secured, kind):
    triton = secured.triton
    big = np.ones(3 << 20, dtype=np.float32)  # 12 MiB: grows the backend's 4 MiB region
    with ModelClient(secured.http_url, model("Identity", kind)) as client:
        np.testing.assert_array_equal(client.infer_sample(x=X)["y"], X)
        np.testing.assert_array_equal(client.infer_sample(x=big)["y"], big)
    named = {
        name: stat.S_IMODE(os.stat(pathlib.Path(_arena.SHM_DIR) / name).st_mode)
        for name in os.listdir(_arena.SHM_DIR)
        if name.startswith(triton._shm_prefix)
    }
    backend = {name: mode for name, mode in named.items() if name.startswith(f"{triton._shm_prefix}-pb")}
    assert len(backend) >= 2, named  # one region per model instance
    assert all(mode & 0o077 == 0 for mode in named.values()), {name: oct(mode) for name, mode in named.items()}
    assert triton._backend.server is not None and triton._backend.server.pid is not None
    mapped: Dict[str, int] = {}
    for pid in [os.getpid(), *_children(triton._backend.server.pid)]:
        mapped.update(_mapped_segments(pid, triton._shm_prefix))
    if os.geteuid() == 0 and kind == "thread":  # map_files is readable to root: the arenas (unlinked once mapped)
        assert any("-m" in name for name in mapped), mapped
    assert all(mode & 0o077 == 0 for mode in mapped.values()), {name: oct(mode) for name, mode in mapped.items()}


def _read_as_nobody(path: pathlib.Path) -> subprocess.CompletedProcess:
    # A system tool, not this interpreter: another user may not be able to reach the interpreter's
    # files at all (pyenv under a 0700 home), which would fail the control for the wrong reason.
    nobody = pwd.getpwnam("nobody")
    command = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
               "head", "-c", "1", str(path)]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=30)  # noqa: S603


def _can_switch_to_nobody() -> bool:
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return False
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


# The file modes are checked above on every machine; this adds the real thing where it can.
@pytest.mark.skipif(not _can_switch_to_nobody(), reason="needs root, a 'nobody' user and setpriv")
def test_another_user_cannot_open_the_backend_regions(secured, tmp_path):
    prefix = f"{secured.triton._shm_prefix}-pb"
    regions = [pathlib.Path(_arena.SHM_DIR) / name for name in os.listdir(_arena.SHM_DIR) if name.startswith(prefix)]
    assert regions
    # Control: the same user can read a 0644 segment, so a refusal below is the mode's doing.
    control = pathlib.Path(_arena.SHM_DIR) / f"pytriton-{os.getpid()}-e2e-control"
    control.write_bytes(b"x")
    control.chmod(0o644)
    try:
        control_result = _read_as_nobody(control)
        assert control_result.returncode == 0, control_result.stderr
    finally:
        control.unlink()
    for region in regions:
        result = _read_as_nobody(region)
        assert result.returncode != 0 and "Permission denied" in result.stderr, (region, result.stderr)


# -- gRPC over TLS --------------------------------------------------------------------------------
def _openssl(*args: str, cwd: pathlib.Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)  # noqa: S603, S607


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Dict[str, pathlib.Path]:
    """A throw-away CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.fail("The TLS tests generate certificates with the openssl command-line tool; install openssl.")
    folder = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=pytriton-test-ca", cwd=folder)  # fmt: skip
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other-ca.key", "-out", "other-ca.pem",
             "-days", "2", "-subj", "/CN=unrelated-ca", cwd=folder)  # fmt: skip
    (folder / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (folder / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={'localhost' if name == 'server' else 'pytriton-client'}", cwd=folder)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=folder)  # fmt: skip
    names = ("ca.pem", "other-ca.pem", "server.pem", "server.key", "client.pem", "client.key")
    return {name: folder / name for name in names}


def _tls_server(certificates: Dict[str, pathlib.Path], mutual: bool) -> Iterator[Server]:
    ports = triton_ports()
    config = TritonConfig(
        grpc_use_ssl=True,
        grpc_use_ssl_mutual=mutual,
        grpc_server_cert=certificates["server.pem"],
        grpc_server_key=certificates["server.key"],
        grpc_root_cert=certificates["ca.pem"],
        **ports,
    )
    yield from _serve(config, None, ports)


@pytest.fixture(scope="module")
def tls_server(certificates) -> Iterator[Server]:
    yield from _tls_server(certificates, mutual=False)


@pytest.fixture(scope="module")
def mutual_tls_server(certificates) -> Iterator[Server]:
    yield from _tls_server(certificates, mutual=True)


def test_grpc_clients_over_tls(tls_server, certificates):
    url = tls_server.grpc_url.replace("grpc://", "grpcs://")
    ca = certificates["ca.pem"]
    with ModelClient(url, "Identity", root_certificates=ca) as client:
        np.testing.assert_array_equal(client.infer_sample(x=X)["y"], X)

    async def asyncio_client() -> None:
        async with AsyncioModelClient(url, "Identity", root_certificates=str(ca)) as client:
            np.testing.assert_array_equal((await client.infer_sample(x=X))["y"], X)

    asyncio.run(asyncio_client())
    with DecoupledModelClient(url, "Stream", root_certificates=ca) as client:
        assert len(list(client.infer_sample(x=X))) == 3
    # The server speaks TLS only: a plaintext client, or one that does not trust its CA, gets nowhere.
    with ModelClient(tls_server.grpc_url, "Identity", init_timeout_s=1.0) as client:
        with pytest.raises(PyTritonClientError):
            client.infer_sample(x=X)
    with ModelClient(url, "Identity", init_timeout_s=1.0, root_certificates=certificates["other-ca.pem"]) as client:
        with pytest.raises(PyTritonClientError):
            client.infer_sample(x=X)


def test_grpc_mutual_tls_needs_the_client_certificate(mutual_tls_server, certificates):
    url = mutual_tls_server.grpc_url.replace("grpc://", "grpcs://")
    ca, key, chain = certificates["ca.pem"], certificates["client.key"], certificates["client.pem"]
    with ModelClient(url, "Identity", root_certificates=ca, private_key=key, certificate_chain=chain) as client:
        np.testing.assert_array_equal(client.infer_sample(x=X)["y"], X)
    with ModelClient(url, "Identity", init_timeout_s=1.0, root_certificates=ca) as client:
        with pytest.raises(PyTritonClientError):
            client.infer_sample(x=X)
