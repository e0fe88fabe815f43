"""``pytriton check --json`` against the real installed server, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pytriton.server import versions
from tests.conftest import triton_ports


def test_check_json_passes_and_never_prints_secrets():
    ports = triton_ports()
    env = dict(os.environ)
    env.update(
        MY_API_TOKEN="s3cr3t-value-1",
        PYTRITON_ACCESS_TOKEN="s3cr3t-value-2",
        PYTRITON_TRITON_CONFIG_HTTP_PORT=str(ports["http_port"]),
        PYTRITON_TRITON_CONFIG_GRPC_PORT=str(ports["grpc_port"]),
        PYTRITON_TRITON_CONFIG_METRICS_PORT=str(ports["metrics_port"]),
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytriton", "check", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert "s3cr3t" not in done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["ok"] is True
    items = {item["name"]: item for item in report["items"]}
    for name in ("platform", "glibc", "python", "shared libpython", "numpy (yours)", "numpy (stub)", "/dev/shm"):
        assert name in items
    selected = versions.selected_version()  # 2.51.0, or the build `make test-triton-older` chose
    assert items["server install"]["status"] == "ok" and selected in items["server install"]["detail"]
    assert items["server version"]["status"] == "ok" and f"Triton {selected}" in items["server version"]["detail"]
    assert "sha256" in items["server wheel pin"]["detail"]
    assert items[f"http port 127.0.0.1:{ports['http_port']}"]["status"] == "ok"
    assert items["smoke test"]["status"] == "ok"
    assert report["environment"]["PYTRITON_ACCESS_TOKEN"] == "<redacted>"
    assert "MY_API_TOKEN" not in report["environment"]


def test_run_logs_one_line_with_addresses_and_restrictions(caplog):
    import logging

    from pytriton.triton import Triton, TritonConfig

    ports = triton_ports()
    with caplog.at_level(logging.INFO, logger="pytriton.triton"):
        with Triton(config=TritonConfig(**ports)) as triton:
            triton.run()
    lines = [r.getMessage() for r in caplog.records if r.name == "pytriton.triton" and "listening" in r.getMessage()]
    assert len(lines) == 1
    line = lines[0]
    assert "\n" not in line
    assert f"HTTP 127.0.0.1:{ports['http_port']}" in line and f"GRPC 127.0.0.1:{ports['grpc_port']}" in line
    assert f"metrics 127.0.0.1:{ports['metrics_port']}" in line
    assert "http: shared-memory,model-repository" in line and "grpc: shared-memory,model-repository" in line


def test_version_read_from_the_install_is_what_the_running_server_reports():
    """The version read from the install's files (no server started) equals the live server's metadata."""
    import json as json_module
    import urllib.request

    from pytriton.triton import Triton, TritonConfig

    ports = triton_ports()
    with Triton(config=TritonConfig(**ports)) as triton:
        triton.run()
        url = f"http://127.0.0.1:{ports['http_port']}/v2"
        with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 - loopback only
            metadata = json_module.loads(answer.read())
    assert metadata["version"] == versions.server_version() == versions.selected_version()
