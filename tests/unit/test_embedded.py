"""Embedded ``Triton``: the command line -> in-process options translation, the stub environment, the API guards.

No server is started here (tests/e2e/test_embedded.py runs one).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib

import pytest

import pytriton.inprocess as tritonserver
from pytriton import _embedded
from pytriton.exceptions import PyTritonBadParameterError, PyTritonInvalidOperationError
from pytriton.server.command import LaunchSettings, build_command
from pytriton.server.security import AccessPolicy, TritonSecurityConfig
from pytriton.server.triton_config import TritonConfig
from pytriton.triton import Triton

BINARY = pathlib.Path("/opt/install/bin/tritonserver")


def _command(config: TritonConfig, startup=("a",)):
    return build_command(
        BINARY,
        config,
        LaunchSettings(
            model_repository=pathlib.Path("/w/model-store"),
            backend_directory=pathlib.Path("/opt/install/backends-py3.11"),
            cache_directory=pathlib.Path("/opt/install/caches"),
            shm_region_prefix="pytriton-1-abc-pb",
            startup_models=list(startup),
            access=AccessPolicy(config, TritonSecurityConfig()),
        ),
    )


def test_the_binary_command_line_becomes_the_same_server_options():
    options = _embedded.options_from_command(_command(TritonConfig()), pathlib.Path("/w/log.txt"))
    assert options.model_repository == ["/w/model-store"]
    assert options.model_control_mode is tritonserver.ModelControlMode.EXPLICIT
    assert options.startup_models == ["a"]
    assert options.strict_model_config is True  # --disable-auto-complete-config: pytriton writes full configs
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
    assert options.log_file == "/w/log.txt"
    assert (options.log_info, options.log_warn, options.log_error, options.log_verbose) == (True, True, True, 0)


def test_every_configured_field_is_translated_or_knowingly_dropped(caplog):
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
    )
    with caplog.at_level(logging.WARNING, logger="pytriton"):
        options = _embedded.options_from_command(_command(config, startup=()))
    assert caplog.records == []  # nothing unknown, nothing unsupported in this config
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
    assert options.startup_models == []
    assert options.log_file is None  # no file given: Triton logs to standard error


def test_unsupported_and_unknown_flags_are_dropped_with_a_warning(caplog):
    argv = [str(BINARY), "--model-repository=/r", "--trace-config=rate=1", "--brand-new-flag=1", "--log-error=false"]
    with caplog.at_level(logging.WARNING, logger="pytriton"):
        options = _embedded.options_from_command(argv)
    messages = " ".join(record.getMessage() for record in caplog.records)
    assert "--trace-config" in messages and "tracing is not available" in messages
    assert "--brand-new-flag=1" in messages
    assert options.log_error is False
    with pytest.raises(PyTritonBadParameterError, match="not a boolean"):
        _embedded.options_from_command([str(BINARY), "--strict-readiness=maybe"])
    with pytest.raises(PyTritonBadParameterError, match="setting=value"):
        _embedded.options_from_command([str(BINARY), "--backend-config=python"])
    with pytest.raises(PyTritonBadParameterError, match="Unexpected"):
        _embedded.options_from_command([str(BINARY), "positional"])


def test_a_setting_value_may_contain_commas_and_equal_signs():
    assert _embedded._setting("x", "python,key=a,b=c") == ["python", "key", "a,b=c"]
    assert _embedded._setting("x", "key=a,b") == ["", "key", "a,b"]


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


def test_every_translated_flag_sets_a_field_that_options_has():
    # A misspelt attribute would be set silently on the dataclass and never reach the server.
    fields = {field.name for field in dataclasses.fields(tritonserver.Options)}
    argv = _command(TritonConfig(log_verbose=1, metrics_config=["a=b"], cache_config=["local,size=1"]))
    argv += ["--log-info=false", "--log-warning=false", "--log-error=false", "--model-load-thread-count=2"]
    options = _embedded.options_from_command(argv)
    assert set(vars(options)) == fields
    assert (options.log_info, options.log_warn, options.log_error) == (False, False, False)
    assert options.model_load_thread_count == 2
