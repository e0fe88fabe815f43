"""The OpenAI frontend's input and connection limits, measured against a frontend on a fake backend.

Run: ``.venv/bin/python -m bench.openai_limits`` (no Triton: the frontend's backend answers at once).
It starts the frontend in a child process (so that its memory is its own) and reports:

- connections: 200 raw connections (100 send nothing, 100 half a request's headers), how many the
  frontend still holds 15 s later, and whether a chat completion succeeds meanwhile;
- /health while one 100 MiB chat body is sent: the longest /health answer (polled every 20 ms);
- memory: the child's resident memory before, peak and after eight 100 MiB bodies at once;
- status codes of a lone surrogate, deep nesting and a 100 KB model name (and the answer's size).

Works on any version of the frontend (it passes no limit arguments), so that before and after compare.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import httpx

MIB = 1 << 20
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def _serve() -> None:
    from pytriton.openai import ChatModel, OpenAIFrontend
    from tests.unit.test_openai_app import TEXT_CONFIG, FakeBackend

    class Backend(FakeBackend):
        async def config(self, model, version):  # type: ignore[no-untyped-def]
            return TEXT_CONFIG

    OpenAIFrontend._backend_factory = lambda self: Backend  # type: ignore[method-assign,assignment,return-value]
    with OpenAIFrontend("grpc://unused:1", [ChatModel("tiny", "chat")], port=0) as frontend:
        print(frontend.port, flush=True)
        sys.stdin.read()


def _memory(pid: int) -> dict:
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) // 1024
    return fields


def _held(sockets: list) -> int:
    """How many of ``sockets`` the server has not closed (a closed one reads EOF or an error)."""
    held = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            held += sock.recv(65536, socket.MSG_PEEK) != b"" and 0  # data (an error answer): not held open
        except BlockingIOError:
            held += 1
        except OSError:
            pass
    return held


def main() -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.openai_limits", "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    port = int(child.stdout.readline())
    base = f"http://127.0.0.1:{port}"
    client = httpx.Client(timeout=120)
    results: dict = {}
    try:
        assert client.post(base + "/v1/chat/completions", json=CHAT).status_code == 200
        results["memory_start_mib"] = _memory(child.pid)["VmRSS"]

        # Connections: idle and partial-header ones.
        sockets = []
        for index in range(200):
            sock = socket.create_connection(("127.0.0.1", port))
            if index % 2:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            sockets.append(sock)
        time.sleep(15)
        results["connections_held_after_15s"] = f"{_held(sockets)} of 200"
        results["chat_meanwhile"] = client.post(base + "/v1/chat/completions", json=CHAT).status_code
        for sock in sockets:
            sock.close()

        # /health while a 100 MiB body is sent and handled.
        big = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * (100 * MIB)}]}).encode()
        worst, done = [0.0], threading.Event()

        def poll() -> None:
            with httpx.Client(timeout=120) as probe:
                while not done.is_set():
                    start = time.perf_counter()
                    probe.get(base + "/health")
                    worst[0] = max(worst[0], time.perf_counter() - start)
                    time.sleep(0.02)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            status = client.post(base + "/v1/chat/completions", content=big).status_code
        finally:
            done.set()
            poller.join()
        results["100MiB_body_status"] = status
        results["health_longest_ms_during_100MiB_body"] = round(worst[0] * 1000)

        # /health while a 15 MiB body of small messages (under the default limit) is parsed and handled.
        many = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "ab"}] * (15 * MIB // 36)})
        worst[0], polls, done = 0.0, [0], threading.Event()

        def poll_many() -> None:
            with httpx.Client(timeout=120) as probe:
                while not done.is_set():
                    start = time.perf_counter()
                    probe.get(base + "/health")
                    worst[0] = max(worst[0], time.perf_counter() - start)
                    polls[0] += 1
                    time.sleep(0.02)

        poller = threading.Thread(target=poll_many)
        poller.start()
        time.sleep(0.1)
        try:
            start = time.perf_counter()
            status = client.post(base + "/v1/chat/completions", content=many.encode()).status_code
            took = time.perf_counter() - start
        finally:
            done.set()
            poller.join()
        results["15MiB_messages_status"] = f"{status} in {took * 1000:.0f} ms"
        results["health_longest_ms_during_15MiB_messages"] = f"{worst[0] * 1000:.0f} ({polls[0]} polls)"

        # Memory: eight at once.
        def post() -> None:
            with httpx.Client(timeout=120) as own:
                try:
                    own.post(base + "/v1/chat/completions", content=big)
                except httpx.HTTPError:
                    pass

        posters = [threading.Thread(target=post) for _ in range(8)]
        for thread in posters:
            thread.start()
        for thread in posters:
            thread.join()
        time.sleep(1)
        memory = _memory(child.pid)
        results["memory_peak_mib"], results["memory_after_eight_mib"] = memory["VmHWM"], memory["VmRSS"]

        # Status codes of hostile bodies.
        surrogate = b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}'
        deep = b'{"model": "tiny", "messages": [{"role": "user", "content": ' + b"[" * 100000 + b"]" * 100000 + b"}]}"
        nested = (
            b'{"model": "tiny", "messages": [{"role": "user", "content": "x", "n": ' + b"[" * 900 + b"]" * 900 + b"}]}"
        )
        long_name = json.dumps({**CHAT, "model": "m" * 100_000}).encode()
        for name, body in (("lone_surrogate", surrogate), ("nesting_100000", deep), ("nesting_900", nested),
                           ("model_name_100KB", long_name)):  # fmt: skip
            response = client.post(base + "/v1/chat/completions", content=body)
            results[f"{name}_status"] = f"{response.status_code} ({len(response.content)} bytes)"
        results["chat_at_end"] = client.post(base + "/v1/chat/completions", json=CHAT).status_code
    finally:
        child.stdin.close()
        child.wait(30)
    for name, value in results.items():
        print(f"{name}: {value}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        _serve()
    else:
        main()
