"""The launch plan (pytriton/_serving/plan.py): built once, changed with ``replace``, rendered to argv and to in-process options.

No server is started here; tests/unit/test_command.py checks more of the argv rendering, and the
e2e suites (test_lifecycle, test_embedded, test_drain, test_security) start servers from plans.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib

import pytest

import pytriton.inprocess as tritonserver
from pytriton._platform import launch as _launch
from pytriton._serving.plan import LaunchPlan, PythonBackendOptions
from pytriton.exceptions import PyTritonBadParameterError
from pytriton.server.command import NOT_FLAGS, LaunchSettings
from pytriton.server.security import AccessPolicy, TritonSecurityConfig
from pytriton.server.triton_config import TritonConfig

BINARY = pathlib.Path("/opt/install/bin/tritonserver")
TOKEN = "s3cret-token"


def _plan(config: TritonConfig, startup=("a",), token: str = TOKEN) -> LaunchPlan:
    return LaunchPlan.build(
        BINARY,
        config,
        LaunchSettings(
            model_repository=pathlib.Path("/w/model-store"),
            backend_directory=pathlib.Path("/opt/install/backends-py3.11"),
            cache_directory=pathlib.Path("/opt/install/caches"),
            shm_region_prefix="pytriton-1-abc-pb",
            startup_models=list(startup),
            access=AccessPolicy(config, TritonSecurityConfig(access_token=token)),
        ),
    )


# -- the plan itself ---------------------------------------------------------------------------
def test_the_plan_is_frozen_and_changed_only_by_replace():
    plan = _plan(TritonConfig())
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.exit_timeout_secs = 5  # type: ignore[misc]
    changed = dataclasses.replace(plan, log_file=pathlib.Path("/w/log"))
    assert plan.log_file is None and "--log-file=/w/log" in changed.to_argv()
    assert not any(arg.startswith("--log-file") for arg in plan.to_argv())
    assert hash(plan) == hash(_plan(TritonConfig()))  # the same inputs make the same plan


def test_every_config_field_is_typed_a_network_flag_or_pytritons_own():
    # A new TritonConfig field must be placed on purpose: a typed field of the plan (and then in
    # the in-process options), an endpoint flag, or a pytriton-only setting.
    typed = {field.name for field in dataclasses.fields(LaunchPlan)}
    endpoints = {name for name, _ in _plan(TritonConfig(allow_sagemaker=True, sagemaker_port=1)).endpoints}
    network = ("allow_http", "allow_grpc", "allow_sagemaker", "allow_vertex_ai", "http_", "grpc_", "sagemaker_")
    assert all(name.startswith((*network, "vertex_ai_", "metrics_port", "metrics_address")) for name in endpoints)
    renamed = {"id": "server_id", "disable_auto_complete_config": "auto_complete_config"}
    for field in dataclasses.fields(TritonConfig):
        name = renamed.get(field.name, field.name)
        placed = name in typed or field.name in NOT_FLAGS or field.name.startswith((*network, "vertex_ai_"))
        placed = placed or field.name in ("metrics_port", "metrics_address")
        assert placed, f"TritonConfig.{field.name} is not placed in the launch plan"


def test_the_drain_raises_the_exit_timeout_and_never_lowers_it():
    plan = _plan(TritonConfig())
    assert plan.exit_timeout_secs is None and not any("exit-timeout" in arg for arg in plan.to_argv())
    longer = plan.with_exit_timeout_at_least(30.5)
    assert longer.exit_timeout_secs == 32 and "--exit-timeout-secs=32" in longer.to_argv()
    kept = _plan(TritonConfig(exit_timeout_secs=100)).with_exit_timeout_at_least(3)
    assert [arg for arg in kept.to_argv() if "exit-timeout" in arg] == ["--exit-timeout-secs=100"]
    assert plan.exit_timeout_secs is None  # the original plan is unchanged


def test_a_restart_loads_only_the_models_still_bound():
    plan = _plan(TritonConfig(), startup=("a", "b", "c"))
    again = plan.loading_only({"c", "a", "z"})
    assert again.startup_models == ("a", "c")
    assert [arg for arg in again.to_argv() if arg.startswith("--load-model=")] == ["--load-model=a", "--load-model=c"]


# -- the token ---------------------------------------------------------------------------------
def test_the_token_is_not_in_repr_and_the_private_launch_hides_its_flags():
    plan = _plan(TritonConfig(http_restricted_api="statistics:k=v"))
    assert TOKEN not in repr(plan) and TOKEN not in str(plan)
    argv = plan.to_argv()
    restricted = [arg for arg in argv if arg.startswith(("--http-restricted-api=", "--grpc-restricted-protocol="))]
    assert len(restricted) == 3 and sum(TOKEN in arg for arg in restricted) == 2
    shown, env, hidden = _launch.hide_secrets(argv, {})
    assert not any(TOKEN in arg or "k=v" in arg for arg in shown)  # every restriction flag goes by the environment
    assert sorted(env[name] for name in hidden.values()) == sorted(restricted)
    assert all(shown[index].endswith(_launch.PLACEHOLDER) for index in hidden)
    # In process nothing listens: the restrictions are not rendered at all.
    options = plan.to_inprocess_options()
    assert TOKEN not in repr(options)


# -- to in-process options ---------------------------------------------------------------------
def test_the_default_plan_becomes_the_same_server_in_process():
    plan = dataclasses.replace(_plan(TritonConfig()), log_file=pathlib.Path("/w/log.txt"))
    options = plan.to_inprocess_options()
    assert options.model_repository == ["/w/model-store"]
    assert options.model_control_mode is tritonserver.ModelControlMode.EXPLICIT
    assert options.startup_models == ["a"]
    assert options.strict_model_config is True  # no auto-completion: pytriton writes full configs
    assert options.strict_readiness is True and options.exit_on_error is True
    assert options.backend_directory == "/opt/install/backends-py3.11"
    assert options.cache_directory == "/opt/install/caches"
    assert options.repo_agent_directory == "/opt/install/repoagents"
    # The Python backend gets exactly what the binary gets: the instance's prefix and the shm sizes.
    assert options.backend_configuration == {
        "python": {
            "shm-region-prefix-name": "pytriton-1-abc-pb",
            "shm-default-byte-size": str(4 << 20),
            "shm-growth-byte-size": str(16 << 20),
        }
    }
    assert "--backend-config=python,shm-region-prefix-name=pytriton-1-abc-pb" in plan.to_argv()
    assert options.log_file == "/w/log.txt"
    assert (options.log_info, options.log_warn, options.log_error, options.log_verbose) == (True, True, True, 0)


def test_every_configured_field_reaches_the_in_process_options(caplog):
    config = TritonConfig(
        id="srv",
        log_verbose=2,
        log_format="ISO8601",
        exit_timeout_secs=7,
        exit_on_error=False,
        strict_readiness=False,
        allow_metrics=False,
        allow_gpu_metrics=False,
        allow_cpu_metrics=False,
        metrics_interval_ms=500,
        metrics_config=["summary_latencies=true", "counter_latencies,enabled=false"],
        cache_config=["local,size=1048576"],
        cache_directory="/c",
        buffer_manager_thread_count=3,
        pinned_memory_pool_byte_size=1024,
        python_backend_shm_default_byte_size=1 << 20,
        python_backend_shm_growth_byte_size=2 << 20,
        http_port=1234,
        grpc_port=1235,
        http_thread_count=2,
        grpc_infer_allocation_pool_size=3,
        allow_sagemaker=True,
        sagemaker_port=9,
        allow_vertex_ai=False,
        disable_auto_complete_config=False,
    )
    plan = _plan(config, startup=())
    with caplog.at_level(logging.WARNING, logger="pytriton"):
        options = plan.to_inprocess_options()
    assert caplog.records == []  # nothing unsupported in this config
    assert options.server_id == "srv"
    assert options.log_verbose == 2 and options.log_format is tritonserver.LogFormat.ISO8601
    assert options.exit_timeout == 7 and options.exit_on_error is False and options.strict_readiness is False
    assert (options.metrics, options.gpu_metrics, options.cpu_metrics) == (False, False, False)
    assert options.metrics_interval == 500
    assert options.metrics_configuration == {
        "": {"summary_latencies": "true"},
        "counter_latencies": {"enabled": "false"},
    }
    assert options.cache_config == {"local": {"size": "1048576"}}
    assert options.cache_directory == "/c"
    assert options.buffer_manager_thread_count == 3 and options.pinned_memory_pool_size == 1024
    assert options.backend_configuration["python"]["shm-default-byte-size"] == str(1 << 20)
    assert options.backend_configuration["python"]["shm-growth-byte-size"] == str(2 << 20)
    assert options.strict_model_config is False
    assert options.startup_models == []
    assert options.log_file is None  # no file given: Triton logs to standard error
    # Every rendered value is a field Options has (a misspelt attribute would never reach the server).
    assert set(vars(options)) == {field.name for field in dataclasses.fields(tritonserver.Options)}
    # The same plan renders the network flags for the binary.
    argv = plan.to_argv()
    for flag in ("--http-port=1234", "--grpc-infer-allocation-pool-size=3", "--sagemaker-port=9", "--id=srv"):
        assert flag in argv, flag


def test_tracing_is_dropped_in_process_with_a_warning(caplog):
    plan = _plan(TritonConfig(trace_config=["rate=1"]))
    assert "--trace-config=rate=1" in plan.to_argv()
    with caplog.at_level(logging.WARNING, logger="pytriton"):
        plan.to_inprocess_options()
    messages = " ".join(record.getMessage() for record in caplog.records)
    assert "--trace-config" in messages and "tracing is not available" in messages


def test_a_setting_value_may_contain_commas_and_equal_signs_and_must_have_one():
    plan = _plan(TritonConfig(cache_config=["python,key=a,b=c"], metrics_config=["key=a,b"]))
    options = plan.to_inprocess_options()
    assert options.cache_config == {"python": {"key": "a,b=c"}}
    assert options.metrics_configuration == {"": {"key": "a,b"}}
    with pytest.raises(PyTritonBadParameterError, match="setting=value"):
        dataclasses.replace(plan, cache_config=("python",)).to_inprocess_options()


def test_a_plan_made_by_hand_renders_the_servers_defaults():
    plan = LaunchPlan(
        binary=pathlib.Path("/b/bin/tritonserver"),
        model_repository=pathlib.Path("/r"),
        backend_directory=pathlib.Path("/b/backends"),
        python_backend=PythonBackendOptions(shm_region_prefix="p"),
    )
    assert plan.to_argv() == [
        "/b/bin/tritonserver",
        "--model-repository=/r",
        "--log-verbose=0",
        "--exit-on-error=true",
        "--strict-readiness=true",
        "--backend-directory=/b/backends",
        "--disable-auto-complete-config",
        "--model-control-mode=explicit",
        "--backend-config=python,shm-region-prefix-name=p",
        f"--backend-config=python,shm-default-byte-size={4 << 20}",
        f"--backend-config=python,shm-growth-byte-size={16 << 20}",
    ]
    assert plan.to_inprocess_options().exit_timeout == tritonserver.Options().exit_timeout
