"""examples/production/ as its README runs it: the server in one process, client.py and curl in others.

One server for the module (started as the image starts it, ``pytriton serve server:create_app``,
on free ports, in its own session so that its process group can be checked), called by the client script over HTTP and gRPC, by curl
and by plain urllib with the README's JSON request; then stopped with SIGINT, as Ctrl-C does,
which must end it with status 0 and leave no process, shared-memory segment or workspace file.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, Optional

import pytest

from tests.conftest import process_group_alive, shm_entries, triton_ports, wait_for

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "production"
TOKEN = "production-example-token"
# The request of the example's README (one flower, batch-first: shape [1, 4]).
REQUEST = {"inputs": [{"name": "features", "shape": [1, 4], "datatype": "FP32", "data": [5.1, 3.5, 1.4, 0.2]}]}
START_TIMEOUT_S = 90.0
# Straight to 127.0.0.1, whatever proxy the environment names.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str, headers: Optional[Dict[str, str]] = None) -> int:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with OPENER.open(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Dict[str, Any]]:
    ports = triton_ports()
    workspace = tmp_path_factory.mktemp("workspace")
    log = tmp_path_factory.mktemp("log") / "server.log"
    env = {**os.environ, "SERVER_WORKSPACE": str(workspace), "SERVER_ACCESS_TOKEN": TOKEN}
    # The command the image runs (deploy/Dockerfile's CMD), its options for a run on loopback.
    command = [
        sys.executable,
        "-m",
        "pytriton",
        "serve",
        "server:create_app",
        "--app-dir",
        str(EXAMPLE),
        "--host",
        "127.0.0.1",
        "--http-port",
        str(ports["http_port"]),
        "--grpc-port",
        str(ports["grpc_port"]),
        "--metrics-port",
        str(ports["metrics_port"]),
    ]
    with log.open("wb") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    info = {"process": process, "ports": ports, "workspace": workspace, "log": log}
    try:
        ready_url = f"http://127.0.0.1:{ports['http_port']}/v2/health/ready"
        started = wait_for(lambda: process.poll() is not None or _get(ready_url) == 200, START_TIMEOUT_S, 0.2)
        if not started or process.poll() is not None:
            pytest.fail(f"the example server did not become ready:\n{log.read_text()[-3000:]}")
        yield info
    finally:
        if process.poll() is None:  # a test failed before the SIGINT test: stop it all the same
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def _client(url: str) -> str:
    completed = subprocess.run(
        [sys.executable, str(EXAMPLE / "client.py"), "--url", url, "--timeout", "30"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_client_script_classifies_the_three_flowers(server, scheme):
    port = server["ports"][f"{scheme}_port"]
    lines = _client(f"{scheme}://127.0.0.1:{port}").splitlines()
    assert [line.split(" -> ")[1].split()[0] for line in lines] == ["setosa", "versicolor", "virginica"], lines


def _check_response(body: Dict[str, Any]) -> None:
    outputs = {output["name"]: output for output in body["outputs"]}
    assert outputs["label"]["data"] == [0] and outputs["label"]["datatype"] == "INT64"
    probabilities = outputs["probabilities"]["data"]
    assert outputs["probabilities"]["shape"] == [1, 3]
    assert abs(sum(probabilities) - 1.0) < 1e-4 and probabilities[0] > 0.9


def test_curl_command_of_the_readme(server):
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed (the same request is checked through urllib by the next test)")
    url = f"http://127.0.0.1:{server['ports']['http_port']}/v2/models/Classifier/infer"
    completed = subprocess.run(
        [curl, "-sS", "--fail", "--noproxy", "*", "-X", "POST", url, "-d", json.dumps(REQUEST)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    _check_response(json.loads(completed.stdout))


def test_the_same_request_over_urllib(server):
    url = f"http://127.0.0.1:{server['ports']['http_port']}/v2/models/Classifier/infer"
    request = urllib.request.Request(url, data=json.dumps(REQUEST).encode(), method="POST")
    with OPENER.open(request, timeout=30) as response:
        _check_response(json.loads(response.read()))


def test_management_endpoints_need_the_token_from_the_environment(server):
    stats = f"http://127.0.0.1:{server['ports']['http_port']}/v2/models/stats"
    assert _get(stats) == 403
    assert _get(stats, {"triton-access-token": TOKEN}) == 200


def test_sigint_stops_the_server_cleanly_and_leaves_nothing(server):
    """Last in the module: Ctrl-C ends the server with status 0; nothing of it is left."""
    process = server["process"]
    os.kill(process.pid, signal.SIGINT)
    try:
        code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not stop within 60 s of SIGINT:\n{server['log'].read_text()[-3000:]}")
    assert code == 0, server["log"].read_text()[-3000:]
    assert wait_for(lambda: not process_group_alive(process.pid), 10), "stub or server processes left behind"
    prefix = f"pytriton-{process.pid}-"
    assert wait_for(lambda: not shm_entries(prefix), 10), f"/dev/shm leftovers: {shm_entries(prefix)}"
    assert list(server["workspace"].iterdir()) == [], "files left in SERVER_WORKSPACE"
    deadline = time.monotonic() + 10
    while _get(f"http://127.0.0.1:{server['ports']['http_port']}/v2/health/live") != 0:
        assert time.monotonic() < deadline, "the HTTP port still answers after the server exited"
        time.sleep(0.1)
