"""pytriton/_serving/endpoints.py without a server: the start-up probe against fake endpoints on 127.0.0.1."""

from __future__ import annotations

import http.server
import socket
import threading

from pytriton._serving.endpoints import ServerEndpoints
from pytriton.server.security import AccessPolicy, TritonSecurityConfig
from pytriton.server.settings import resolve
from pytriton.server.triton_config import TritonConfig


class _Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the handler's name
        self.send_response(200 if self.path == "/v2/health/ready" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_start_probe_waits_for_the_metrics_port_after_the_server_answers_ready():
    """Triton opens /metrics after HTTP: run() must not return before a scrape can connect."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    metrics_port = _free_port()
    listener = None
    try:
        http_port = server.server_address[1]
        config = TritonConfig(http_address="127.0.0.1", http_port=http_port, metrics_port=metrics_port)
        access = AccessPolicy(config, TritonSecurityConfig(access_token="secret"))
        probe = ServerEndpoints(resolve(config, environ={}), access).ready_probe()
        assert not probe()  # HTTP says ready, /metrics does not listen yet
        listener = socket.create_server(("127.0.0.1", metrics_port))
        assert probe()
        off = TritonConfig(
            http_address="127.0.0.1", http_port=http_port, metrics_port=metrics_port, allow_metrics=False
        )
        listener.close()
        listener = None
        assert ServerEndpoints(resolve(off, environ={}), access).ready_probe()()  # metrics off: HTTP alone
        anywhere = TritonConfig(http_address="127.0.0.1", http_port=http_port, metrics_port=0)
        assert ServerEndpoints(resolve(anywhere, environ={}), access).ready_probe()()  # no port known to wait for
    finally:
        if listener is not None:
            listener.close()
        server.shutdown()
        server.server_close()
        thread.join(10)
