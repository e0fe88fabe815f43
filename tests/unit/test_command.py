import dataclasses
import pathlib

from pytriton._serving.plan import LaunchPlan
from pytriton.server.command import LaunchSettings
from pytriton.server.triton_config import TritonConfig

LAUNCH = LaunchSettings(
    model_repository=pathlib.Path("/ws/model store"),
    backend_directory=pathlib.Path("/srv/backends-py3.11"),
    cache_directory=pathlib.Path("/srv/caches"),
    shm_region_prefix="pytriton-1-abc-pb",
    startup_models=["A", "B"],
)


def _argv(config):
    return LaunchPlan.build(pathlib.Path("/srv/bin/tritonserver"), config, LAUNCH).to_argv()


def test_defaults_bind_every_interface_and_load_models_explicitly():
    argv = _argv(TritonConfig())
    assert argv[0] == "/srv/bin/tritonserver"
    for flag in (
        "--http-address=0.0.0.0",
        "--grpc-address=0.0.0.0",
        "--metrics-address=0.0.0.0",
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
        "--model-control-mode=explicit",
        "--load-model=A",
        "--load-model=B",
        "--disable-auto-complete-config",
        "--strict-readiness=true",
        "--backend-directory=/srv/backends-py3.11",
        "--cache-directory=/srv/caches",
        "--backend-config=python,shm-region-prefix-name=pytriton-1-abc-pb",
    ):
        assert flag in argv, flag


def test_values_with_spaces_stay_one_argument():
    argv = _argv(TritonConfig(id="my server", http_header_forward_pattern="x-.* y"))
    assert "--model-repository=/ws/model store" in argv
    assert "--id=my server" in argv
    assert "--http-header-forward-pattern=x-.* y" in argv


def test_booleans_lists_and_user_addresses():
    config = TritonConfig(
        allow_grpc=False,
        allow_metrics=True,
        http_address="0.0.0.0",
        cache_config=["local,size=1024", "local,foo=bar"],
        log_verbose=2,
        grpc_keepalive_permit_without_calls=True,
        disable_auto_complete_config=False,
    )
    argv = _argv(config)
    assert "--allow-grpc=false" in argv
    assert "--allow-metrics=true" in argv
    assert "--http-address=0.0.0.0" in argv
    assert argv.count("--cache-config=local,size=1024") == 1
    assert "--cache-config=local,foo=bar" in argv
    assert "--log-verbose=2" in argv
    assert "--grpc-keepalive-permit-without-calls=true" in argv
    assert "--disable-auto-complete-config" not in argv


def test_pytriton_only_fields_are_not_flags():
    argv = _argv(TritonConfig(python_backend_shm_default_byte_size=1 << 20, tritonserver_dir=pathlib.Path("/x")))
    assert not any(arg.startswith(("--tritonserver-dir", "--python-backend")) for arg in argv)
    assert "--backend-config=python,shm-default-byte-size=1048576" in argv


def test_restriction_flags_come_from_the_access_policy():
    from pytriton.server.security import AccessPolicy, TritonSecurityConfig

    config = TritonConfig(http_restricted_api="statistics:k=v")
    # Without a policy, the config's own restriction is written once, as given.
    argv = _argv(config)
    assert [arg for arg in argv if "restricted" in arg] == ["--http-restricted-api=statistics:k=v"]
    launch = dataclasses.replace(LAUNCH, access=AccessPolicy(config, TritonSecurityConfig(access_token="t")))
    argv = LaunchPlan.build(pathlib.Path("/srv/bin/tritonserver"), config, launch).to_argv()
    assert [arg for arg in argv if "restricted" in arg] == [
        "--http-restricted-api=statistics:k=v",
        "--http-restricted-api=shared-memory,model-repository,trace,logging:triton-access-token=t",
        "--grpc-restricted-protocol=shared-memory,model-repository,statistics,trace,logging:triton-access-token=t",
    ]
    opted_out = dataclasses.replace(
        LAUNCH, access=AccessPolicy(TritonConfig(), TritonSecurityConfig(restricted_endpoints=[]))
    )
    argv = LaunchPlan.build(pathlib.Path("/x"), TritonConfig(), opted_out).to_argv()
    assert not [arg for arg in argv if "restricted" in arg]


def test_grpc_allocation_pool_is_off_unless_configured():
    # Pooled gRPC objects keep the buffers of the largest tensors they carried (docs/architecture.md).
    assert "--grpc-infer-allocation-pool-size=0" in _argv(TritonConfig())
    argv = _argv(TritonConfig(grpc_infer_allocation_pool_size=8))
    assert "--grpc-infer-allocation-pool-size=8" in argv and "--grpc-infer-allocation-pool-size=0" not in argv


def test_request_size_limit_is_not_a_server_flag():
    argv = _argv(TritonConfig(max_request_bytes=1024))
    assert not any("max-request-bytes" in arg for arg in argv)
