import logging
import pathlib

import pytest

from pytriton.exceptions import PyTritonValidationError
from pytriton.server.triton_config import TritonConfig, parse_bool


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("on", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("off", False),
    ],
)
def test_env_booleans_parse_both_ways(raw, expected):
    config = TritonConfig.from_env({"PYTRITON_TRITON_CONFIG_ALLOW_METRICS": raw})
    assert config.allow_metrics is expected


def test_env_false_is_not_truthy_string():
    # The reference implementation read "false" as True; it must be a real False here.
    config = TritonConfig.from_env({"PYTRITON_TRITON_CONFIG_EXIT_ON_ERROR": "false"})
    assert config.exit_on_error is False


def test_env_ints_paths_strings():
    config = TritonConfig.from_env(
        {
            "PYTRITON_TRITON_CONFIG_GRPC_PORT": "45436",
            "PYTRITON_TRITON_CONFIG_LOG_VERBOSE": "4",
            "PYTRITON_TRITON_CONFIG_LOG_FILE": "/tmp/x.log",
            "PYTRITON_TRITON_CONFIG_ID": "my server",
            "UNRELATED": "1",
        }
    )
    assert config.grpc_port == 45436
    assert config.log_verbose == 4
    assert config.log_file == pathlib.Path("/tmp/x.log")
    assert config.id == "my server"


def test_env_list_fields_are_indexed_in_order():
    config = TritonConfig.from_env(
        {
            "PYTRITON_TRITON_CONFIG_CACHE_CONFIG_1": "local,size=2048",
            "PYTRITON_TRITON_CONFIG_CACHE_CONFIG_0": "local,size=1024",
            "PYTRITON_TRITON_CONFIG_TRACE_CONFIG": "rate=100",
        }
    )
    assert config.cache_config == ["local,size=1024", "local,size=2048"]
    assert config.trace_config == ["rate=100"]


def test_env_unknown_name_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="pytriton.server.triton_config"):
        config = TritonConfig.from_env({"PYTRITON_TRITON_CONFIG_NO_SUCH_FIELD": "1"})
    assert config == TritonConfig()
    assert "PYTRITON_TRITON_CONFIG_NO_SUCH_FIELD" in caplog.text


@pytest.mark.parametrize(
    "name, raw",
    [("PYTRITON_TRITON_CONFIG_HTTP_PORT", "eighty"), ("PYTRITON_TRITON_CONFIG_ALLOW_GRPC", "maybe")],
)
def test_env_bad_value_names_the_variable(name, raw):
    with pytest.raises(PyTritonValidationError, match=name):
        TritonConfig.from_env({name: raw})


def test_http_and_grpc_cannot_both_be_disabled():
    with pytest.raises(PyTritonValidationError, match="allow_http"):
        TritonConfig(allow_http=False, allow_grpc=False)
    with pytest.raises(PyTritonValidationError, match=r"grpc_use_ssl=True\) needs allow_http"):
        TritonConfig(allow_http=False, grpc_use_ssl=True)


def test_bad_port_and_bad_types():
    with pytest.raises(PyTritonValidationError, match="http_port"):
        TritonConfig(http_port=70000)
    with pytest.raises(PyTritonValidationError, match="log_verbose"):
        TritonConfig(log_verbose="loud")


def test_dict_round_trip_and_unknown_keys(caplog):
    config = TritonConfig(http_port=1234, allow_grpc=False, cache_config=["local,size=1"])
    assert TritonConfig.from_dict(config.to_dict()) == config
    # As in NVIDIA PyTriton: an unknown key is logged and ignored, known keys still apply.
    with caplog.at_level("WARNING", logger="pytriton.server.triton_config"):
        assert TritonConfig.from_dict({"bogus": 1, "http_port": 1234}) == TritonConfig(http_port=1234)
    assert "bogus" in caplog.text


def test_config_is_keyword_only_and_defaults_none():
    assert all(value is None for value in TritonConfig().to_dict().values())
    with pytest.raises(TypeError, match="keyword arguments only"):
        TritonConfig("my-id")


def test_parse_bool_rejects_other_ints():
    with pytest.raises(ValueError):
        parse_bool(2)


@pytest.mark.parametrize("variable", ["PYTRITON_PROXY_SPIN_US", "PYTRITON_WORKER_SPIN_US"])
def test_polling_windows_from_the_environment(monkeypatch, variable):
    from pytriton.proxy._binding import poll_window_us

    monkeypatch.delenv(variable, raising=False)
    assert poll_window_us(variable, 1000) == 1000
    monkeypatch.setenv(variable, " 250 ")
    assert poll_window_us(variable, 1000) == 250
    monkeypatch.setenv(variable, "0")
    assert poll_window_us(variable, 1000) == 0
    for bad in ("1ms", "-5", "2000000", "0.5"):
        monkeypatch.setenv(variable, bad)
        with pytest.raises(PyTritonValidationError, match=rf"{variable}='{bad}'.*microseconds"):
            poll_window_us(variable, 1000)


def test_triton_resolves_the_polling_windows_and_exit_timeout_once_at_construction(monkeypatch):
    from pytriton.proxy._binding import PollingWindows
    from pytriton.triton import EXIT_TIMEOUT_S, Triton

    monkeypatch.setenv("PYTRITON_WORKER_SPIN_US", "fast")
    with pytest.raises(PyTritonValidationError, match="PYTRITON_WORKER_SPIN_US='fast' is not a polling window"):
        Triton()
    monkeypatch.setenv("PYTRITON_PROXY_SPIN_US", "40")
    monkeypatch.setenv("PYTRITON_WORKER_SPIN_US", "30")
    triton = Triton()
    try:
        monkeypatch.setenv("PYTRITON_PROXY_SPIN_US", "0")  # read once: a later change does not apply
        assert triton._binding_context().polling == PollingWindows(proxy_us=40, worker_us=30)
        assert triton._settings.exit_timeout_s == EXIT_TIMEOUT_S
    finally:
        triton.stop()
    monkeypatch.delenv("PYTRITON_PROXY_SPIN_US")
    monkeypatch.delenv("PYTRITON_WORKER_SPIN_US")
    triton = Triton(config=TritonConfig(exit_timeout_secs=5))
    try:
        assert triton._binding_context().polling == PollingWindows(proxy_us=0, worker_us=0)
        assert triton._settings.exit_timeout_s == 5.0
    finally:
        triton.stop()


def test_max_request_bytes_from_field_and_environment():
    from pytriton.server.settings import resolve

    assert resolve(TritonConfig(), environ={}).max_request_bytes == 2 * 1024**3
    assert resolve(TritonConfig(max_request_bytes=0), environ={}).max_request_bytes == 0  # no limit
    environ = {"PYTRITON_TRITON_CONFIG_MAX_REQUEST_BYTES": "1048576"}
    assert resolve(None, environ=environ).max_request_bytes == 1 << 20
    with pytest.raises(PyTritonValidationError, match="max_request_bytes=-1 is negative"):
        TritonConfig(max_request_bytes=-1)
