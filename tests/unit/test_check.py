"""The one INFO line Triton.run() logs with its addresses and restricted endpoint groups."""

from __future__ import annotations

import inspect
import json
import logging

from pytriton.server.security import TritonSecurityConfig
from pytriton.triton import Triton, TritonConfig


def test_endpoints_line_names_addresses_and_restrictions():
    triton = Triton(config=TritonConfig(http_port=18000, grpc_port=18001, metrics_port=18002))
    try:
        line = triton._endpoints_line()
    finally:
        triton.stop()
    assert "\n" not in line
    assert "HTTP 127.0.0.1:18000" in line
    assert "GRPC 127.0.0.1:18001" in line
    assert "metrics 127.0.0.1:18002" in line
    assert "http: shared-memory,model-repository" in line
    assert "grpc: shared-memory,model-repository" in line


def test_endpoints_line_without_restriction():
    triton = Triton(
        config=TritonConfig(http_port=18010, grpc_port=18011, metrics_port=18012),
        security_config=TritonSecurityConfig(restricted_endpoints=[]),
    )
    try:
        line = triton._endpoints_line()
    finally:
        triton.stop()
    assert line.endswith("restricted endpoints (http: none; grpc: none)")


def test_run_logs_the_line_on_pytriton_triton_logger():
    source = inspect.getsource(Triton.run)
    assert 'LOGGER.info("%s", self._endpoints_line())' in source
    assert logging.getLogger("pytriton.triton") is __import__("pytriton.triton", fromlist=["LOGGER"]).LOGGER


# --- pytriton check (no server: the parts that read the system are replaced) ---

import pytriton._check as check  # noqa: E402


def test_environment_keeps_relevant_names_and_redacts_secrets():
    env = {
        "PYTRITON_HOME": "/x",
        "PYTRITON_API_TOKEN": "s3cr3t",
        "TRITON_PASSWORD": "hunter2",
        "MY_API_TOKEN": "s3cr3t",
        "HOME": "/root",
    }
    found = check.relevant_environment(env)
    assert found == {"PYTRITON_API_TOKEN": check.REDACTED, "PYTRITON_HOME": "/x", "TRITON_PASSWORD": check.REDACTED}


def test_shm_low_and_unusable_fail_with_a_fix():
    assert check.check_shm(lambda path: 2**30)[0].status == check.OK
    low = check.check_shm(lambda path: 2**20)[0]
    assert low.status == check.FAIL and "shm-size" in low.fix

    def broken(path):
        raise OSError("no such file")

    assert check.check_shm(broken)[0].status == check.FAIL


def test_ports_follow_the_env_config_and_report_taken_ones():
    env = {"PYTRITON_TRITON_CONFIG_HTTP_PORT": "18123"}
    items = check.check_ports(env, port_free=lambda address, port: port != 18123)
    by_name = {item.name: item for item in items}
    assert by_name["http port 0.0.0.0:18123"].status == check.FAIL
    assert by_name["grpc port 0.0.0.0:8001"].status == check.OK
    assert "http_port" in by_name["http port 0.0.0.0:18123"].fix


def test_missing_server_fails_naming_install_server(monkeypatch):
    from pytriton.exceptions import PyTritonServerError
    from pytriton.server import distribution

    def missing(explicit_dir=None):
        raise PyTritonServerError("no server")

    monkeypatch.setattr(distribution, "find_server", missing)
    items = {item.name: item for item in check.check_server()}
    assert items["server install"].status == check.FAIL
    assert "pytriton install-server" in items["server install"].fix


def test_report_exit_code_and_failure_line(monkeypatch, capsys):
    monkeypatch.setattr(check, "check_shm", lambda: [check.Item("/dev/shm", check.FAIL, "1 MiB free", "grow it")])
    monkeypatch.setattr(check, "smoke_test", lambda: [check.Item("smoke test", check.OK, "fine")])
    assert check.main(json_output=False, smoke=False) == 1
    out = capsys.readouterr().out
    assert "FAILED: /dev/shm: grow it" in out
    monkeypatch.setattr(check, "check_shm", lambda: [check.Item("/dev/shm", check.OK, "plenty")])
    monkeypatch.setattr(check, "check_ports", lambda environ, ports=None: [])
    monkeypatch.setattr(check, "check_server", lambda: [])
    monkeypatch.setattr(check, "check_numpy", lambda: [])
    monkeypatch.setattr(check, "check_python", lambda: [])
    assert check.main(json_output=True, smoke=False) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and all(item["name"] != "smoke test" for item in report["items"])


def test_cli_has_check_with_flags(monkeypatch):
    from pytriton import _cli

    seen = {}

    def fake_main(json_output, smoke, ports):
        seen.update(json_output=json_output, smoke=smoke, ports=ports)
        return 3

    monkeypatch.setattr(check, "main", fake_main)
    assert _cli.main(["check", "--json", "--no-smoke"]) == 3
    assert seen == {"json_output": True, "smoke": False, "ports": {"http": None, "grpc": None, "metrics": None}}
    assert _cli.main(["check", "--http-port", "9000", "--metrics-port=9002"]) == 3
    assert seen == {"json_output": False, "smoke": True, "ports": {"http": 9000, "grpc": None, "metrics": 9002}}


def test_ports_given_on_the_command_line_win_and_each_item_says_where_it_came_from():
    env = {"PYTRITON_TRITON_CONFIG_HTTP_PORT": "18123", "PYTRITON_TRITON_CONFIG_GRPC_PORT": "18124"}
    checked = []

    def port_free(address, port):
        checked.append(port)
        return True

    items = check.check_ports(env, port_free=port_free, ports={"http": 19000, "grpc": None})
    assert checked == [19000, 18124, 8002]
    assert [item.detail for item in items] == [
        "free (from --http-port)",
        "free (from PYTRITON_TRITON_CONFIG_GRPC_PORT)",
        "free (from default)",
    ]


def test_a_taken_port_names_a_fix_a_command_line_can_use():
    item = check.check_ports({}, port_free=lambda address, port: port != 8001)[1]
    assert item.status == check.FAIL and item.name == "grpc port 0.0.0.0:8001"
    assert "PYTRITON_TRITON_CONFIG_GRPC_PORT=<port>" in item.fix
    assert "pytriton check --grpc-port <port>" in item.fix


def _time_wait_port():
    """A loopback port whose only socket is a connection in TIME_WAIT, left as a stopped server leaves it.

    The listener sets SO_REUSEADDR as tritonserver's do; the server side closes first, so the TIME_WAIT
    entry holds the listening port.
    """
    import socket
    import time

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()
        time.sleep(0.05)  # the client sees the FIN before it closes: the server side is the active closer
        client.close()
    return port


def test_a_port_in_time_wait_is_free_and_a_listening_one_is_not():
    import socket

    port = _time_wait_port()
    with socket.socket() as plain:  # the old probe: no SO_REUSEADDR, so TIME_WAIT looked "in use"
        try:
            plain.bind(("127.0.0.1", port))
            time_wait_blocks_a_plain_bind = False
        except OSError:
            time_wait_blocks_a_plain_bind = True
    assert time_wait_blocks_a_plain_bind
    item = check.check_ports({}, ports={"http": port})[0]
    assert item.status == check.OK, item
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        taken = listener.getsockname()[1]
        item = check.check_ports({"PYTRITON_TRITON_CONFIG_HTTP_ADDRESS": "127.0.0.1"}, ports={"http": taken})[0]
        assert item.status == check.FAIL and item.detail == "in use (from --http-port)"
