"""server/settings.py: one frozen resolution of TritonConfig, the environment and pytriton's defaults."""

import dataclasses

import pytest

from pytriton.exceptions import PyTritonValidationError
from pytriton.proxy._binding import PollingWindows
from pytriton.server.settings import (
    EXIT_TIMEOUT_S,
    RECYCLE_BYTE_SIZE,
    RECYCLE_IDLE_S,
    SERVER_DATA_HEADROOM_BYTES,
    Endpoint,
    resolve,
)
from pytriton.triton import Triton, TritonConfig


def test_defaults():
    settings = resolve(None, environ={})
    assert settings.http == Endpoint(enabled=True, address="0.0.0.0", port=8000)
    assert settings.grpc == Endpoint(enabled=True, address="0.0.0.0", port=8001)
    assert settings.metrics == Endpoint(enabled=True, address="0.0.0.0", port=8002)
    assert settings.http.client_host == "127.0.0.1"  # a wildcard is reached on loopback
    assert settings.exit_timeout_s == EXIT_TIMEOUT_S and settings.drain_delay_s == 0.0
    assert (settings.recycle_byte_size, settings.recycle_idle_s) == (RECYCLE_BYTE_SIZE, RECYCLE_IDLE_S)
    assert settings.max_request_bytes == 2 * 1024**3 and settings.callable_metrics is True
    assert settings.polling == PollingWindows(proxy_us=0, worker_us=0)


def test_explicit_config_over_environment_over_defaults():
    environ = {
        "PYTRITON_TRITON_CONFIG_HTTP_PORT": "9000",
        "PYTRITON_TRITON_CONFIG_GRPC_ADDRESS": "127.0.0.2",
        "PYTRITON_TRITON_CONFIG_EXIT_TIMEOUT_SECS": "7",
        "PYTRITON_PROXY_SPIN_US": "40",
    }
    settings = resolve(TritonConfig(http_port=9100, allow_metrics=False, drain_delay_secs=2), environ=environ)
    assert settings.http.port == 9100  # the explicit field wins
    assert settings.grpc == Endpoint(enabled=True, address="127.0.0.2", port=8001)
    assert settings.grpc.client_host == "127.0.0.2"
    assert settings.metrics.enabled is False and settings.callable_metrics is False  # no /metrics to export on
    assert settings.exit_timeout_s == 7.0 and settings.drain_delay_s == 2.0
    assert settings.polling.proxy_us == 40
    assert settings.config.http_port == 9100 and settings.config.exit_timeout_secs == 7


def test_recycling_thresholds_are_clamped():
    config = TritonConfig(python_backend_shm_recycle_byte_size=-5, python_backend_shm_recycle_idle_secs=0)
    settings = resolve(config, environ={})
    assert settings.recycle_byte_size == 0 and settings.recycle_idle_s == 1.0


def test_settings_are_frozen_and_independent_of_the_users_object():
    config = TritonConfig(http_port=9200)
    triton = Triton(config=config)
    try:
        config.http_port = 9300  # TritonConfig stays mutable, as in NVIDIA PyTriton; Triton resolved it already
        assert triton._settings.http.port == 9200 and triton.http_url.endswith(":9200")
        with pytest.raises(dataclasses.FrozenInstanceError):
            triton._settings.exit_timeout_s = 1.0  # type: ignore[misc]
    finally:
        triton.stop()


def test_invalid_environment_fails_at_resolution():
    with pytest.raises(PyTritonValidationError):
        resolve(None, environ={"PYTRITON_TRITON_CONFIG_HTTP_PORT": "eighty"})
    with pytest.raises(PyTritonValidationError, match="PYTRITON_WORKER_SPIN_US"):
        resolve(None, environ={"PYTRITON_WORKER_SPIN_US": "fast"})


def test_the_servers_memory_cap_follows_the_request_limit():
    assert resolve(None, environ={}).server_data_headroom == SERVER_DATA_HEADROOM_BYTES + 2 * (2 << 30)
    assert resolve(
        TritonConfig(max_request_bytes=1 << 20), environ={}
    ).server_data_headroom == SERVER_DATA_HEADROOM_BYTES + (2 << 20)
    assert resolve(TritonConfig(max_request_bytes=0), environ={}).server_data_headroom == 0  # no limit, no cap
