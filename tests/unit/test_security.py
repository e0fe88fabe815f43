"""TritonSecurityConfig, the restriction flags and headers, client auth/TLS options, private files."""

import asyncio
import json
import os
import pathlib
import stat
import threading

import numpy as np
import pytest
import tritonclient.grpc
import tritonclient.http
from tritonclient._request import Request

from pytriton.client._url import parse_url
from pytriton.client.auth import ClientSecurity, create_auth_headers, extract_access_token_from_headers
from pytriton.client.exceptions import PyTritonClientValueError
from pytriton.exceptions import PyTritonBadParameterError, PyTritonValidationError
from pytriton.model_config.model_config import ModelConfig
from pytriton.model_config.tensor import Tensor
from pytriton.proxy._binding import BindingContext, BoundModel
from pytriton.proxy.stubside import _arena, _segments, _wire
from pytriton.server.security import (
    DEFAULT_PROTECTED_ENDPOINTS,
    TRITON_ACCESS_HEADER,
    VALID_TRITON_ENDPOINTS,
    AccessPolicy,
    TritonSecurityConfig,
)
from pytriton.server.triton_config import TritonConfig
from pytriton.triton import Triton


# -- TritonSecurityConfig -------------------------------------------------------------------------
def test_defaults_restrict_admin_endpoints_with_a_fresh_random_token():
    first, second = TritonSecurityConfig(), TritonSecurityConfig()
    assert first.restricted_endpoints == ["shared-memory", "model-repository", "statistics", "trace", "logging"]
    assert first.restricted_endpoints == DEFAULT_PROTECTED_ENDPOINTS
    assert first.restricted_endpoints is not DEFAULT_PROTECTED_ENDPOINTS
    assert isinstance(first.access_token, str) and len(first.access_token) >= 32
    assert first.access_token != second.access_token
    assert first.access_token not in repr(first)
    assert not {"inference", "health", "metadata", "model-config"} & set(first.restricted_endpoints)


def test_explicit_token_and_endpoints_are_kept():
    config = TritonSecurityConfig(access_token="my-token:1=2", restricted_endpoints=("statistics", "trace"))
    assert config.access_token == "my-token:1=2"
    assert config.restricted_endpoints == ["statistics", "trace"]


def test_empty_endpoints_turn_restriction_off_and_generate_no_token():
    config = TritonSecurityConfig(restricted_endpoints=[])
    assert config.restricted_endpoints == [] and config.access_token is None


@pytest.mark.parametrize(
    "endpoints, message",
    [
        (["statistics", "bogus"], "Invalid endpoint names in TritonSecurityConfig.restricted_endpoints: bogus"),
        (["model_repository"], "model_repository"),
        (["trace", "trace"], "more than once"),
        ("statistics", "must be a list"),
        (5, "must be a list"),
    ],
)
def test_bad_endpoints_are_rejected(endpoints, message):
    with pytest.raises(PyTritonValidationError, match=message):
        TritonSecurityConfig(restricted_endpoints=endpoints)


@pytest.mark.parametrize("token", ["", "with space", "tab\t", "naïve", 123])
def test_bad_tokens_are_rejected(token):
    with pytest.raises(PyTritonValidationError, match="visible ASCII"):
        TritonSecurityConfig(access_token=token)


def test_valid_endpoints_are_the_servers_groups():
    groups = "health metadata inference shared-memory model-config model-repository statistics trace logging"
    assert set(groups.split()) == VALID_TRITON_ENDPOINTS
    TritonSecurityConfig._validate_endpoint_names(DEFAULT_PROTECTED_ENDPOINTS)


# -- AccessPolicy: flags and headers --------------------------------------------------------------
def test_default_policy_flags_and_headers():
    security = TritonSecurityConfig(access_token="tok")
    policy = AccessPolicy(TritonConfig(), security)
    group = "shared-memory,model-repository,statistics,trace,logging:triton-access-token=tok"
    assert policy.flags() == [f"--http-restricted-api={group}", f"--grpc-restricted-protocol={group}"]
    assert policy.http_headers("model-repository") == {"triton-access-token": "tok"}
    assert policy.grpc_headers("statistics") == {"triton-grpc-protocol-triton-access-token": "tok"}
    assert policy.http_headers("health") == {} and policy.grpc_headers("inference") == {}


def test_opt_out_writes_no_flags():
    assert AccessPolicy(TritonConfig(), TritonSecurityConfig(restricted_endpoints=[])).flags() == []
    assert AccessPolicy(TritonConfig()).flags() == []


def test_users_own_restriction_keeps_its_header_and_the_token_covers_the_rest():
    config = TritonConfig(http_restricted_api="model-repository,health:admin-key=s3cret")
    policy = AccessPolicy(config, TritonSecurityConfig(access_token="tok"))
    assert policy.flags() == [
        "--http-restricted-api=model-repository,health:admin-key=s3cret",
        "--http-restricted-api=shared-memory,statistics,trace,logging:triton-access-token=tok",
        "--grpc-restricted-protocol=shared-memory,model-repository,statistics,trace,logging:triton-access-token=tok",
    ]
    # Triton refuses an API named in two groups: each appears once per protocol.
    for protocol in ("http", "grpc"):
        apis = policy.restricted(protocol)
        assert len(apis) == len(set(apis))
    assert policy.http_headers("model-repository") == {"admin-key": "s3cret"}
    assert policy.http_headers("health") == {"admin-key": "s3cret"}
    assert policy.grpc_headers("model-repository") == {"triton-grpc-protocol-triton-access-token": "tok"}


def test_users_restriction_alone_when_security_is_off():
    config = TritonConfig(grpc_restricted_protocol="statistics:k=v")
    policy = AccessPolicy(config, TritonSecurityConfig(restricted_endpoints=[]))
    assert policy.flags() == ["--grpc-restricted-protocol=statistics:k=v"]
    assert policy.grpc_headers("statistics") == {"triton-grpc-protocol-k": "v"}


@pytest.mark.parametrize(
    "value, message",
    [
        ("model-repository,k=v", "is not '<apis>:<header>=<value>'"),
        ("model-repository:k", "is not '<apis>:<header>=<value>'"),
        ("model-repository:=v", "is not '<apis>:<header>=<value>'"),
        ("bogus:k=v", "Invalid endpoint names in TritonConfig.http_restricted_api: bogus"),
        ("statistics:bad key=v", "not a valid header name"),
    ],
)
def test_bad_user_restrictions_fail_before_the_server_starts(value, message):
    with pytest.raises(PyTritonValidationError, match=message):
        AccessPolicy(TritonConfig(http_restricted_api=value), TritonSecurityConfig())
    with pytest.raises(PyTritonValidationError, match=message):  # from Triton() too, before any workspace exists
        Triton(config=TritonConfig(http_restricted_api=value))


def test_triton_exposes_the_token_and_checks_the_type():
    triton = Triton(security_config=TritonSecurityConfig(access_token="abc"))
    try:
        assert triton.get_access_token() == "abc"
    finally:
        triton.stop()
    triton = Triton()
    try:
        assert triton.get_access_token() and len(triton.get_access_token()) >= 32
    finally:
        triton.stop()
    triton = Triton(security_config=TritonSecurityConfig(restricted_endpoints=[]))
    try:
        assert triton.get_access_token() is None
    finally:
        triton.stop()
    with pytest.raises(PyTritonBadParameterError, match="TritonSecurityConfig"):
        Triton(security_config={"access_token": "x"})  # type: ignore[arg-type]


# -- clients --------------------------------------------------------------------------------------
def test_auth_headers_per_protocol():
    assert create_auth_headers("t", "http") == {TRITON_ACCESS_HEADER: "t"}
    assert create_auth_headers("t", "GRPC") == {"triton-grpc-protocol-triton-access-token": "t"}
    with pytest.raises(ValueError):
        create_auth_headers("", "http")
    with pytest.raises(ValueError):
        create_auth_headers("t", "ftp")
    assert extract_access_token_from_headers({"Triton-Access-Token": "a"}) == "a"
    assert extract_access_token_from_headers({"triton-grpc-protocol-triton-access-token": "b"}) == "b"
    assert extract_access_token_from_headers({"other": "c"}) is None
    assert extract_access_token_from_headers(None) is None
    with pytest.raises(ValueError, match="two different"):
        extract_access_token_from_headers({"triton-access-token": "a", "triton-grpc-protocol-triton-access-token": "b"})


@pytest.mark.parametrize(
    "url, lib, header",
    [
        ("http://127.0.0.1:1", tritonclient.http, "triton-access-token"),
        ("grpc://127.0.0.1:1", tritonclient.grpc, "triton-grpc-protocol-triton-access-token"),
    ],
)
def test_client_plugin_adds_the_token_to_every_request(url, lib, header):
    parsed = parse_url(url)
    client = ClientSecurity(access_token="tok").apply(lib.InferenceServerClient(parsed.address), parsed)
    try:
        request = Request({"x-user": "1"})
        client.plugin()(request)
        assert request.headers == {"x-user": "1", header: "tok"}
    finally:
        client.close()
    bare = ClientSecurity().apply(lib.InferenceServerClient(parsed.address), parsed)
    try:
        assert bare.plugin() is None
    finally:
        bare.close()


def test_grpcs_urls_and_tls_options(tmp_path):
    url = parse_url("grpcs://example.org")
    assert (url.scheme, url.port, url.protocol, url.tls) == ("grpcs", 8001, "grpc", True)
    assert parse_url("grpc://h").tls is False
    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    security = ClientSecurity(root_certificates=ca)
    security.check(url)
    assert security.grpc_options(url) == {
        "ssl": True, "root_certificates": str(ca), "private_key": None, "certificate_chain": None,
    }  # fmt: skip
    assert ClientSecurity().grpc_options(parse_url("grpc://h")) == {}
    with pytest.raises(PyTritonClientValueError, match="grpcs://"):
        ClientSecurity(root_certificates=ca).check(parse_url("grpc://h"))
    with pytest.raises(PyTritonClientValueError, match="both private_key and certificate_chain"):
        ClientSecurity(private_key=ca).check(url)
    with pytest.raises(PyTritonClientValueError, match="not a readable file"):
        ClientSecurity(root_certificates=tmp_path / "missing.pem").check(url)
    with pytest.raises(PyTritonClientValueError, match="access_token"):
        ClientSecurity(access_token="").check(url)


def test_every_client_takes_access_token_and_tls_keywords(tmp_path):
    from pytriton.client import (
        AsyncioDecoupledModelClient,
        AsyncioModelClient,
        DecoupledModelClient,
        FuturesModelClient,
        ModelClient,
    )

    for cls in (ModelClient, FuturesModelClient):
        client = cls("grpc://127.0.0.1:1", "m", access_token="tok")
        assert client._security.access_token == "tok"
        client.close()

    async def asyncio_client():
        client = AsyncioModelClient("grpc://127.0.0.1:1", "m", access_token="tok")
        assert client._client.plugin() is not None
        await client.close()

    asyncio.run(asyncio_client())
    for cls in (ModelClient, FuturesModelClient, AsyncioModelClient, DecoupledModelClient, AsyncioDecoupledModelClient):
        with pytest.raises(PyTritonClientValueError, match="grpcs://"):
            cls("grpc://127.0.0.1:1", "m", root_certificates=tmp_path)
    DecoupledModelClient("grpc://127.0.0.1:1", "m", access_token="tok").close()
    assert AsyncioDecoupledModelClient("grpc://127.0.0.1:1", "m", access_token="t")._sync._security.access_token == "t"
    plain = ModelClient("http://127.0.0.1:1", "m", access_token="tok")
    copy = ModelClient.from_existing_client(plain)
    assert copy._security == plain._security
    plain.close()
    copy.close()


# -- private files and segments -------------------------------------------------------------------
def test_stub_parameters_live_in_a_private_file_not_in_the_served_config(tmp_path):
    context = BindingContext(
        user_pid=4242, shm_prefix="pytriton-4242-ab", socket_dir=tmp_path / "s", on_unrecoverable=print
    )
    model = BoundModel(
        index=1, model_name="m", model_version=3, infer_funcs=lambda requests: requests,
        inputs=[Tensor(name="x", shape=(-1,), dtype=np.float32)], outputs=[Tensor(name="y", shape=(-1,), dtype=np.float32)],
        config=ModelConfig(), strict=False, context=context,
    )  # fmt: skip
    repository = tmp_path / "repo"
    os.umask(0o022)
    model.write_repository(repository)
    pbtxt = (repository / "m" / "config.pbtxt").read_text()
    for secret in ("4242", str(tmp_path), "pytriton-4242", "endpoint", "shm_prefix", "slots"):
        assert secret not in pbtxt
    # The one public parameter is the stub generation (an integer that makes a reload visible to Triton).
    assert pbtxt.count("key:") == 1 and 'key: "pytriton.generation"' in pbtxt
    private = repository / "m" / "3" / _wire.PRIVATE_FILE
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    for directory in (repository / "m", repository / "m" / "3"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    params = json.loads(private.read_text())
    assert params["user_pid"] == 4242 and params["endpoint_dir"] == str(tmp_path / "s" / "m1")
    assert params["shm_prefix"] == "pytriton-4242-ab-m1" and params["backend_shm_prefix"] == "pytriton-4242-ab-pb"
    assert params["slots"] == 1
    private.chmod(0o644)  # a rewrite (e.g. a reload) makes it private again
    model.write_repository(repository)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_arena_segments_are_private_even_with_an_open_umask():
    previous = os.umask(0)
    arena = _arena.SharedArena(f"pytriton-{os.getpid()}-unittest-arena", initial_size=4096)
    try:
        arena.reserve(10)
        assert arena.name is not None
        mode = stat.S_IMODE(os.stat(pathlib.Path(_arena.SHM_DIR) / arena.name).st_mode)
        assert mode == 0o600
    finally:
        os.umask(previous)
        arena.close()


def test_make_private_closes_group_and_other_bits():
    prefix = f"pytriton-{os.getpid()}-unittest-pb"
    paths = [pathlib.Path(_arena.SHM_DIR) / f"{prefix}{index}" for index in range(2)]
    other = pathlib.Path(_arena.SHM_DIR) / f"pytriton-{os.getpid()}-unittest-other"
    try:
        for path in [*paths, other]:
            path.write_bytes(b"x")
            path.chmod(0o644)
        assert sorted(_segments.make_private(prefix)) == sorted(path.name for path in paths)
        assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in paths)
        assert stat.S_IMODE(other.stat().st_mode) == 0o644
        assert _segments.make_private(prefix) == []  # already private: nothing to change
    finally:
        for path in [*paths, other]:
            path.unlink(missing_ok=True)


def test_shm_guard_makes_new_and_reopened_entries_private_at_once():
    from pytriton.server._shm_guard import ShmGuard
    from tests.conftest import wait_for

    prefix = f"pytriton-{os.getpid()}-unittest-guard-pb"
    ours = pathlib.Path(_arena.SHM_DIR) / f"{prefix}region"
    theirs = pathlib.Path(_arena.SHM_DIR) / f"pytriton-{os.getpid()}-unittest-guard-other"
    guard = ShmGuard(prefix)
    assert guard.start()
    threads = {thread.name for thread in threading.enumerate()}
    assert "pytriton-shm-guard" in threads
    try:
        for path in (ours, theirs):
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.fchmod(descriptor, 0o644)  # what Triton's backend does right after creating a region
            os.close(descriptor)
        assert wait_for(lambda: stat.S_IMODE(ours.stat().st_mode) == 0o600, timeout_s=5.0)
        ours.chmod(0o644)  # set back later: closed again
        assert wait_for(lambda: stat.S_IMODE(ours.stat().st_mode) == 0o600, timeout_s=5.0)
        assert stat.S_IMODE(theirs.stat().st_mode) == 0o644  # not ours: untouched
    finally:
        guard.stop()
        guard.stop()
        ours.unlink(missing_ok=True)
        theirs.unlink(missing_ok=True)
    assert "pytriton-shm-guard" not in {thread.name for thread in threading.enumerate()}


def test_grpc_metadata_renames_the_http_token_header_only():
    from pytriton.client.auth import grpc_metadata

    assert grpc_metadata(None) is None
    assert grpc_metadata({"Triton-Access-Token": "t", "X-Trace": "1"}) == {
        "triton-grpc-protocol-triton-access-token": "t",
        "x-trace": "1",
    }
    already = {"triton-grpc-protocol-triton-access-token": "t"}
    assert grpc_metadata(already) == already


def test_unary_grpc_request_headers_carry_the_token_under_tritons_grpc_key():
    import tritonclient.grpc

    from pytriton.client._core import ClientCore
    from pytriton.client._url import parse_url
    from pytriton.model_config.generator import from_dict

    config = from_dict(
        {
            "name": "M",
            "max_batch_size": 0,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}],
        }
    )
    core = ClientCore(parse_url("grpc://fake:1"), "M", None, 1.0, 1.0)
    arrays = {"x": np.zeros(1, np.float32)}
    request = core.build_request(arrays, config, None, {"triton-access-token": "t"}, tritonclient.grpc)
    assert request["headers"] == {"triton-grpc-protocol-triton-access-token": "t"}
