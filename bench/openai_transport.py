"""Stock uvicorn against pytriton's HTTP protocol (pytriton/_platform/uvicorn_http.py) in front of the OpenAI frontend.

Run: ``.venv/bin/python -m bench.openai_transport [--requests N]`` (no Triton: the frontend's backend answers
at once, as in bench/openai_limits.py). The same frontend is started twice in child processes:

- ``stock``: uvicorn's own protocol with only its public settings: ``limit_concurrency=100``
  (its connection bound: 503 beyond it) and the frontend's ``timeout_keep_alive``;
- ``pytriton``: the protocol subclass the frontend uses, with ``max_connections=100`` (one more evicts the
  connection waiting longest for its headers) and the 10 s header timeout.

For each it reports: 200 raw connections (100 send nothing, 100 half a request's headers), how many are
still held 12 s later and the status of a chat completion sent meanwhile (a client locked out or
served); then the p50 and p90 of ``N`` chat completions, one at a time on one kept-alive connection.
This is the benchmark that keeps the subclass (docs/architecture.md, the platform layer).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import subprocess
import sys
import time
from typing import Dict, List

from bench.openai_limits import CHAT, _held, _serve

LIMIT = 100


def _serve_variant(variant: str) -> None:
    from pytriton.openai import OpenAIFrontend

    if variant == "stock":
        import uvicorn

        class StockConfig(uvicorn.Config):
            def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
                kwargs["http"] = "auto"  # uvicorn's own protocol class
                kwargs["limit_concurrency"] = LIMIT
                super().__init__(*args, **kwargs)

        uvicorn.Config = StockConfig  # type: ignore[misc]  # the frontend reads uvicorn.Config when it starts
    else:
        original = OpenAIFrontend.__init__

        def limited(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            original(self, *args, max_connections=LIMIT, **kwargs)

        OpenAIFrontend.__init__ = limited  # type: ignore[method-assign]
    _serve()


def _chat(connection: http.client.HTTPConnection) -> int:
    connection.request("POST", "/v1/chat/completions", json.dumps(CHAT), {"content-type": "application/json"})
    response = connection.getresponse()
    response.read()
    return response.status


def measure(variant: str, requests: int) -> Dict[str, object]:
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.openai_transport", "--serve", variant],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    results: Dict[str, object] = {"variant": variant}
    try:
        port = int(child.stdout.readline())
        sockets: List[socket.socket] = []
        for index in range(2 * LIMIT):
            sock = socket.create_connection(("127.0.0.1", port))
            if index % 2:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            sockets.append(sock)
        time.sleep(12)
        results["held_after_12s"] = f"{_held(sockets)} of {2 * LIMIT}"
        meanwhile = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            results["chat_meanwhile"] = _chat(meanwhile)
        except OSError as exc:
            results["chat_meanwhile"] = type(exc).__name__
        meanwhile.close()
        for sock in sockets:
            sock.close()
        time.sleep(1)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.connect()
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(50):  # warm-up
            _chat(connection)
        took = []
        for _ in range(requests):
            start = time.perf_counter()
            assert _chat(connection) == 200
            took.append((time.perf_counter() - start) * 1e6)
        connection.close()
        took.sort()
        results["chat_p50_us"] = round(statistics.median(took))
        results["chat_p90_us"] = round(took[int(len(took) * 0.9)])
    finally:
        child.stdin.close()
        child.wait(30)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    for variant in ("stock", "pytriton"):
        print(json.dumps(measure(variant, args.requests)), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        _serve_variant(sys.argv[2])
    else:
        main()
