"""The soak suite's own logic, without a server: response decoding, memory verdicts, process discovery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np

from bench import soak
from bench.soak_client import HttpClient, Processes, _decode_outputs


def test_binary_outputs_are_decoded_bit_exact() -> None:
    array = np.arange(6, dtype=np.float32).reshape(1, 6) / 7
    header = json.dumps(
        {"outputs": [{"name": "OUTPUT", "datatype": "FP32", "shape": [1, 6], "parameters": {"binary_data_size": 24}}]}
    ).encode()
    outputs = _decode_outputs({"inference-header-content-length": str(len(header))}, header + array.tobytes())
    assert outputs["OUTPUT"].tobytes() == array.tobytes()
    assert outputs["OUTPUT"].shape == (1, 6)


def test_the_client_sends_binary_inputs_and_reads_errors() -> None:
    seen = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen["length"] = int(self.headers["Inference-Header-Content-Length"])
            seen["body"] = body
            payload = json.dumps({"error": "no such model"}).encode()
            self.send_response(400)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *_: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    client = HttpClient(server.server_address[1], timeout_s=10)
    try:
        answer = client.infer("m", {"INPUT": np.array([[1, 2, 3]], dtype=np.uint8)})
    finally:
        client.close()
        thread.join(timeout=10)
        server.server_close()
    assert answer.status == 400 and answer.error == "no such model"
    header = json.loads(seen["body"][: seen["length"]])
    assert header["inputs"][0]["datatype"] == "UINT8" and header["inputs"][0]["shape"] == [1, 3]
    assert seen["body"][seen["length"] :] == b"\x01\x02\x03"


def test_memory_within_the_slack_passes_and_beyond_fails() -> None:
    before = {"user_rss_kib": 1000, "server_rss_kib": 1000, "stubs_rss_kib": 1000, "shm_kib": 100}
    assert soak.memory_verdict(before, dict(before, server_rss_kib=1190))["passed"]
    verdict = soak.memory_verdict(before, dict(before, stubs_rss_kib=1300))
    assert not verdict["passed"]
    assert not verdict["processes"]["stubs_rss_kib"]["within"]
    assert verdict["processes"]["user_rss_kib"]["within"]


def test_processes_are_found_by_parent_and_command_line() -> None:
    # a stand-in "tritonserver" (by its argv) with one child naming a model directory
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)',"
        " 'triton_python_backend_stub', '/repo/identity_f32/1/model.py'])\n"
        "print('started', flush=True)\n"
        "time.sleep(30)\n"
    )
    server = subprocess.Popen([sys.executable, "-c", script, "tritonserver"], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"started"
        found = Processes.find(os.getpid(), ["identity_f32", "raises"])
        assert found.server == server.pid
        assert list(found.stubs.values()) == ["identity_f32"]
        row = found.sample("pytriton-no-such-prefix-")
        assert row["server_rss_kib"] > 0 and row["stubs"] == 1 and row["shm_segments"] == 0
    finally:
        subprocess.run(["pkill", "-P", str(server.pid)], check=False)
        server.kill()
        server.wait()


def test_a_failure_shows_pytritons_messages_and_the_whole_last_thread_dump() -> None:
    dump = ["Thread 0x01 (most recent call first):", '  File "x.py", line 1 in supervise', ""] * 30
    dump += ["Current thread 0x02 (most recent call first):", '  File "y.py", line 2 in serve']
    log = (
        ["I1127 server line"] * 100
        + ["soak-server ERROR pytriton._serving.supervisor: tritonserver died"]
        + ["noise"] * 50
    )
    evidence = soak.log_evidence("\n".join(log + dump))
    assert evidence[0] == "soak-server ERROR pytriton._serving.supervisor: tritonserver died" and evidence[1] == "..."
    assert evidence[2:] == dump  # every thread of the dump, not only the last 40 lines
    short = soak.log_evidence("\n".join(["a", "b", "soak-server WARNING x"]))
    assert short == ["a", "b", "soak-server WARNING x"]  # a short log without a dump: the tail as it is
