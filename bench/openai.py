"""The OpenAI frontend's cost: added latency per request and time to first token, against gRPC, in one run.

Usage: ``python -m bench.openai [--quick] [--rounds N --count M] [--against CHECKOUT] [--out DIR]``. Results: ``DIR/openai.json`` and
``DIR/openai.md`` (default ``bench/results/``); the table is printed too.

Two server processes (``python -m bench.openai --serve MODE``), each binding the same two trivial
models and putting an :class:`~pytriton.openai.OpenAIFrontend` in front of them:

* ``grpc``: a launched ``Triton``; the frontend reaches it over gRPC;
* ``inprocess``: ``Triton(embedded=True)``; the frontend calls it in-process.

The models: ``chat`` (ordinary; returns a fixed short text) and ``chat_stream`` (decoupled; yields
:data:`STREAM_TOKENS` one-word responses at once). This process is the client, one request in
flight: tritonclient's gRPC client calling ``chat`` directly and pytriton's ``DecoupledModelClient``
streaming ``chat_stream`` directly (the baselines), and the standard library's HTTP client on a
kept-alive connection posting OpenAI chat requests to each frontend (the payload a real client
sends, messages as JSON).

Figures, each the median over the rounds of the per-round p50: per request, the frontend's p50 over
the direct gRPC p50 (goal <= 1.3x), the median of the per-round ratios, and their difference; time to first token (first content chunk
of a stream against the first response of the direct gRPC stream), and its difference (goal <= 1 ms).
A round measures every path; the order of the paths rotates from round to round.

``--against CHECKOUT`` (another checkout of this repository, e.g. a worktree of ``main``) adds a
third server started from that checkout's code, in ``grpc`` mode, measured in the same rounds
against its own direct gRPC paths (rows prefixed ``against_``): an A/B in one run, on one host.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
STREAM_TOKENS = 16
MESSAGES = [{"role": "user", "content": "Say something short."}]
GOAL_P50_RATIO = 1.3
GOAL_TTFT_EXTRA_MS = 1.0
AGAINST = "against_"  # the prefix of the paths of --against's server


# -- the server side ------------------------------------------------------------------------------
def _chat(messages: np.ndarray) -> Dict[str, np.ndarray]:
    return {"text": np.full((len(messages), 1), b"ok", dtype=object)}


def _chat_stream(messages: np.ndarray) -> Iterator[Dict[str, np.ndarray]]:
    for index in range(STREAM_TOKENS):
        yield {"text": np.array([[f"w{index} ".encode()]], dtype=object)}


def serve(mode: str) -> None:
    """Bind the models, start Triton and the frontend, print their addresses, serve until stdin closes."""
    from bench._common import free_ports
    from pytriton.decorators import batch
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.openai import ChatModel, OpenAIFrontend
    from pytriton.triton import Triton, TritonConfig

    if mode == "inprocess":
        triton = Triton(embedded=True)
    else:
        http_port, grpc_port, metrics_port = free_ports(3)
        triton = Triton(config=TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port))
    with triton:
        inputs = [Tensor(name="messages", shape=(1,), dtype=bytes)]
        outputs = [Tensor(name="text", shape=(1,), dtype=bytes)]
        triton.bind("chat", batch(_chat), inputs, outputs, config=ModelConfig(max_batch_size=8))
        stream_config = ModelConfig(max_batch_size=1, decoupled=True)
        triton.bind("chat_stream", batch(_chat_stream), inputs, outputs, config=stream_config)
        triton.run()
        models = [ChatModel("chat", "chat", stream_model="chat_stream")]
        with OpenAIFrontend(triton, models, port=0) as frontend:
            grpc_url = None if mode == "inprocess" else triton.grpc_url
            print(json.dumps({"openai": frontend.url, "grpc": grpc_url}), flush=True)
            sys.stdin.read()  # until the parent closes it


class _Server:
    def __init__(self, mode: str, root: pathlib.Path = ROOT) -> None:
        # cwd=root: ``-m`` puts it first on sys.path, so that checkout's pytriton serves.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.openai", "--serve", mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, cwd=root,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # the child prints its addresses once it serves
        if not line:
            self.stop()
            raise RuntimeError(f"the {mode} benchmark server did not start (exit code {self.process.returncode})")
        self.urls: Dict[str, str] = json.loads(line)

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# -- the client side ------------------------------------------------------------------------------
class _Reconnected(Exception):
    """The server had closed an idle connection: the call is repeated on a new one."""


def _timed(function: Callable[[], float], count: int, warmup: int) -> List[float]:
    """``count`` results of ``function`` (each returns the milliseconds it measured), after ``warmup`` calls."""

    def once() -> float:
        try:
            return function()
        except _Reconnected:
            return function()

    for _ in range(warmup):
        once()
    return [once() for _ in range(count)]


def _direct_paths(grpc_url: str) -> Dict[str, Callable[[], float]]:
    import tritonclient.grpc as grpcclient

    from pytriton.client import DecoupledModelClient

    client = grpcclient.InferenceServerClient(grpc_url[len("grpc://") :])
    stream_client = DecoupledModelClient(grpc_url, "chat_stream")
    payload = np.array([[json.dumps(MESSAGES).encode()]], dtype=object)

    def infer() -> float:
        start = time.perf_counter()
        tensor = grpcclient.InferInput("messages", [1, 1], "BYTES")
        tensor.set_data_from_numpy(payload)
        client.infer("chat", [tensor])
        return (time.perf_counter() - start) * 1e3

    def first_token() -> float:
        start = time.perf_counter()
        first = None
        for _ in stream_client.infer_sample(payload[0]):
            first = first if first is not None else time.perf_counter()
        return ((first or time.perf_counter()) - start) * 1e3

    return {"grpc_direct": infer, "grpc_direct_stream": first_token}


def _frontend_paths(name: str, url: str) -> Dict[str, Callable[[], float]]:
    """Requests with the standard library's client on one kept-alive connection (httpx's own per-request
    cost, about as large as the frontend's, would otherwise be part of the figure)."""
    import http.client
    import socket
    import urllib.parse

    parsed = urllib.parse.urlparse(url)
    connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port)
    path = parsed.path + "/chat/completions"
    headers = {"Content-Type": "application/json"}
    body = json.dumps({"model": "chat", "messages": MESSAGES})
    stream_body = json.dumps({"model": "chat", "messages": MESSAGES, "stream": True})

    def send(payload: str) -> http.client.HTTPResponse:
        """Post ``payload``; on a connection the server closed while idle (uvicorn's keep-alive
        timeout, between rounds) connect again, outside the timed part, and post once more."""
        if connection.sock is None:
            connection.connect()
            sock: Any = connection.sock
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            connection.request("POST", path, body=payload, headers=headers)
            return connection.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            connection.close()
            raise _Reconnected() from None

    def infer() -> float:
        start = time.perf_counter()
        response = send(body)
        json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"{name}: HTTP {response.status}")
        return (time.perf_counter() - start) * 1e3

    def first_token() -> float:
        start = time.perf_counter()
        first = None
        response = send(stream_body)
        for line in iter(response.readline, b""):
            if first is None and b'"content":"w' in line:
                first = time.perf_counter()
        return ((first or time.perf_counter()) - start) * 1e3

    return {name: infer, f"{name}_stream": first_token}


def _percentile(values: List[float], q: float) -> float:
    return float(np.percentile(values, q))


def run(quick: bool, rounds_count: int = 3, count: int = 400, against: Optional[pathlib.Path] = None) -> Dict[str, Any]:
    """Start both servers, measure every path in rounds (``rounds_count`` of ``count`` requests), summarise.

    More, shorter rounds put each path's requests closer in time to the direct ones they are compared
    with, which matters on a host whose load swings within seconds.
    """
    rounds_count, count, warmup = (1, 150, 20) if quick else (rounds_count, count, 40)
    servers = [_Server("grpc"), _Server("inprocess")]
    try:
        if against is not None:
            servers.append(_Server("grpc", against))
        paths = {
            **_direct_paths(servers[0].urls["grpc"]),
            **_frontend_paths("openai_grpc", servers[0].urls["openai"]),
            **_frontend_paths("openai_inprocess", servers[1].urls["openai"]),
        }
        if against is not None:
            other = {
                **_direct_paths(servers[2].urls["grpc"]),
                **_frontend_paths("openai_grpc", servers[2].urls["openai"]),
            }
            paths.update({f"{AGAINST}{name}": path for name, path in other.items()})
        rounds: List[Dict[str, Dict[str, float]]] = []
        names = list(paths)
        for index in range(rounds_count):
            print(f"openai scenarios, round {index + 1} of {rounds_count} ...", flush=True)
            order = names[index % len(names) :] + names[: index % len(names)]
            measured = {}
            for name in order:
                values = _timed(paths[name], count, warmup)
                measured[name] = {"p50_ms": _percentile(values, 50), "p99_ms": _percentile(values, 99)}
            rounds.append(measured)
    finally:
        for server in servers:
            server.stop()
    return {"rounds": rounds, "summary": summarize(rounds), "count_per_round": count, "quick": quick}


def summarize(rounds: List[Dict[str, Dict[str, float]]]) -> Dict[str, Any]:
    """Median p50/p99 per path over the rounds, and the frontend's ratios and differences to direct gRPC."""
    paths: Dict[str, Dict[str, float]] = {}
    for name in rounds[0]:
        paths[name] = {
            figure: float(statistics.median(measured[name][figure] for measured in rounds))
            for figure in ("p50_ms", "p99_ms")
        }
    comparisons: Dict[str, Dict[str, Any]] = {}
    frontends = [("openai_grpc", ""), ("openai_inprocess", "")]
    if f"{AGAINST}openai_grpc" in paths:
        frontends.append((f"{AGAINST}openai_grpc", AGAINST))
    for frontend, prefix in frontends:
        baseline = f"{prefix}grpc_direct"  # each checkout against its own server's direct path
        request, direct = paths[frontend]["p50_ms"], paths[baseline]["p50_ms"]
        ttft, direct_ttft = paths[f"{frontend}_stream"]["p50_ms"], paths[f"{baseline}_stream"]["p50_ms"]
        per_round = [measured[frontend]["p50_ms"] / measured[baseline]["p50_ms"] for measured in rounds]
        comparisons[frontend] = {
            "p50_ratio": request / direct,
            # Each round measures both within seconds of each other: on a host whose load swings, the
            # median of the per-round ratios is steadier than the ratio of the medians.
            "p50_ratio_per_round": float(statistics.median(per_round)),
            "added_ms": request - direct,
            "p50_goal_met": request / direct <= GOAL_P50_RATIO,
            "ttft_extra_ms": ttft - direct_ttft,
            "ttft_goal_met": ttft - direct_ttft <= GOAL_TTFT_EXTRA_MS,
        }
    return {"paths": paths, "comparisons": comparisons}


def table(results: Dict[str, Any]) -> str:
    """Markdown tables of :func:`summarize`'s figures."""
    summary = results["summary"]
    lines = [
        "| path | p50 ms | p99 ms |",
        "| --- | ---: | ---: |",
        *(f"| {name} | {f['p50_ms']:.3f} | {f['p99_ms']:.3f} |" for name, f in summary["paths"].items()),
        "",
        f"| frontend | p50 / direct gRPC (goal <= {GOAL_P50_RATIO}x) | median of per-round ratios | added per request | "
        f"first token minus direct gRPC (goal <= {GOAL_TTFT_EXTRA_MS:g} ms) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, c in summary["comparisons"].items():
        lines.append(
            f"| {name} | {c['p50_ratio']:.2f}x {'met' if c['p50_goal_met'] else 'NOT met'} | "
            f"{c['p50_ratio_per_round']:.2f}x | {c['added_ms']:.3f} ms | "
            f"{c['ttft_extra_ms']:+.3f} ms {'met' if c['ttft_goal_met'] else 'NOT met'} |"
        )
    rows = "stream rows: time to the first content token" + ("; --quick: one round" if results.get("quick") else "")
    return "\n".join([*lines, "", f"{results['count_per_round']} requests per path per round, one in flight; {rows}."])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--count", type=int, default=400, help="requests per path per round (default 400)")
    parser.add_argument("--against", type=pathlib.Path, help="another checkout to measure in the same rounds")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
    parser.add_argument("--serve", choices=["grpc", "inprocess"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    results = run(args.quick, args.rounds, args.count, args.against)
    from bench import report

    report.write(args.out, "openai", results, table(results))


if __name__ == "__main__":
    main()
