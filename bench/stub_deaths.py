"""What stub deaths leave behind in tritonserver: its thread count, its Python-backend regions, failed requests.

Usage: ``python -m bench.stub_deaths [--deaths N] [--instances K] [--mode traffic|idle]``.

One ``Triton`` serves an identity model ``Echo`` (``K`` thread instances, 2 by default) and a second
one, ``Other``. Each round ``SIGKILL``s one of ``Echo``'s stubs and waits until the model serves 5
requests in a row again, with its stubs all back. Meanwhile a healthy client (one thread, one
request in flight) sends requests to ``Other`` and to ``Echo`` without a pause and counts what fails:
``Other`` must see no failure at all; an ``Echo`` request that Triton routed to the dead instance
fails with "Stub process ... is not healthy" (the crashing instance's share, counted apart), any
other ``Echo`` failure counts as a healthy failure. Printed per round and at the end: the entries
of ``/proc/<tritonserver pid>/task`` and the ``/dev/shm`` regions with the server's region prefix
(of whichever tritonserver runs at that moment), and the healthy client's counts.

``--mode traffic`` (the issue's case) sends requests as soon as the stub is killed, so some reach
the dead instance before pytriton's new generation is ready; ``--mode idle`` sends none (and stops
the healthy client) until the new generation's stub runs (and one more second). On Triton 2.51 only
the first pins the old generation (about 36 threads and one 4 MiB region per death): a request
handed to a dead stub's instance keeps that model generation alive for as long as its server runs
(docs/architecture.md, "Stub death").
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import tritonclient.http as httpclient

from pytriton.model_config import Tensor
from pytriton.server import _recycle
from pytriton.triton import Triton, TritonConfig
from tests.conftest import free_ports


def echo(requests):
    return [dict(request.items()) for request in requests]


def _stubs(server_pid: int, model: str) -> List[int]:
    """Pids of the live stub processes of ``model`` under the server."""
    return _recycle.model_stubs(server_pid, model)


def _infer(client: httpclient.InferenceServerClient, model: str) -> None:
    x = np.arange(4, dtype=np.float32)[None]
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer(model, [tensor]).as_numpy("x"), x)


def _serves(url: str, streak: int = 5, timeout_s: float = 60.0) -> bool:
    """True once ``streak`` requests in a row are answered correctly (bounded by ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    good = 0
    while time.monotonic() < deadline and good < streak:
        client = httpclient.InferenceServerClient(url, network_timeout=30)
        try:
            _infer(client, "Echo")
            good += 1
        except Exception:  # noqa: BLE001 - the dead instance's requests fail until it is replaced
            good = 0
            time.sleep(0.05)
        finally:
            client.close()
    return good >= streak


class HealthyClient:
    """One thread sending ``Other``, ``Echo``, ``Other``, ... requests until :meth:`stop`; counts failures.

    ``counts``: ``ok``, ``other_failed`` (any failure of ``Other``), ``echo_dead_instance`` (an ``Echo``
    request routed to the dead instance: "not healthy"), ``echo_failed`` (any other ``Echo`` failure).
    ``errors`` keeps the first few failure texts; ``outage_s`` adds up, over each run of healthy failures,
    the time from its first failure to the next answer (the failure count alone depends on how fast a
    refused connection comes back).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.counts: Dict[str, int] = {"ok": 0, "other_failed": 0, "echo_dead_instance": 0, "echo_failed": 0}
        self.errors: List[str] = []
        self.outage_s = 0.0
        self._failing_since: Optional[float] = None
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._thread = threading.Thread(target=self._run, name="healthy-client", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def pause(self, paused: bool) -> None:
        (self._paused.set if paused else self._paused.clear)()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def healthy_failures(self) -> int:
        return self.counts["other_failed"] + self.counts["echo_failed"]

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=30)
        turn = 0
        try:
            while not self._stop.is_set():
                if self._paused.is_set():
                    time.sleep(0.02)
                    continue
                model = ("Other", "Echo")[turn % 2]
                turn += 1
                try:
                    _infer(client, model)
                    self.counts["ok"] += 1
                    if self._failing_since is not None:
                        self.outage_s += time.monotonic() - self._failing_since
                        self._failing_since = None
                except Exception as exc:  # noqa: BLE001 - counted, the client goes on
                    text = str(exc)
                    if model == "Other":
                        key = "other_failed"
                    else:
                        key = "echo_dead_instance" if "not healthy" in text else "echo_failed"
                    self.counts[key] += 1
                    if key != "echo_dead_instance" and self._failing_since is None:
                        self._failing_since = time.monotonic()
                    if key != "echo_dead_instance" and len(self.errors) < 5:
                        self.errors.append(f"{model}: {text[:200]}")
                    client.close()  # a new connection after a failure
                    client = httpclient.InferenceServerClient(self.url, network_timeout=30)
        finally:
            client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deaths", type=int, default=30)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--mode", choices=("traffic", "idle"), default="traffic")
    args = parser.parse_args()
    http, grpc, metrics = free_ports(3)
    triton = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
    x = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
    triton.bind("Echo", [echo] * args.instances, x, x)
    triton.bind("Other", echo, x, x)
    triton.run()
    url = f"127.0.0.1:{http}"
    healthy = HealthyClient(url)
    try:
        local = triton._local  # the launched server's capabilities (pytriton/_serving/backend.py)
        assert local is not None
        prefix = local.region_prefix
        assert prefix is not None

        def server_pid() -> int:
            server = local.server
            assert server is not None and server.pid is not None
            return server.pid

        def figure() -> Tuple[int, int]:
            deadline = time.monotonic() + 60
            while True:  # while the server is being replaced, its pid is gone for a moment
                try:
                    threads = len(os.listdir(f"/proc/{server_pid()}/task"))
                    break
                except (OSError, AssertionError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            regions = [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]
            return threads, len(regions)

        first_pid = server_pid()
        assert _serves(url)
        time.sleep(1.0)
        start = figure()
        print(f"start: {start[0]} server threads, {start[1]} regions", flush=True)
        healthy.start()
        for death in range(args.deaths):
            pid = server_pid()
            before = _stubs(pid, "Echo")
            if args.mode == "idle":
                healthy.pause(True)
            os.kill(before[0], signal.SIGKILL)
            began = time.monotonic()
            if args.mode == "idle":  # nothing reaches the dead instance: wait for its replacement first
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    now = _stubs(pid, "Echo")
                    if len(now) == args.instances and before[0] not in now:
                        break
                    time.sleep(0.02)
                time.sleep(1.0)
                healthy.pause(False)
            ok = _serves(url)
            deadline = time.monotonic() + 20
            while len(_stubs(server_pid(), "Echo")) != args.instances and time.monotonic() < deadline:
                time.sleep(0.05)
            threads, regions = figure()
            print(
                f"death {death + 1}: serving={ok} after {time.monotonic() - began:.2f} s; {threads} threads, "
                f"{regions} regions; healthy client {healthy.counts}",
                flush=True,
            )
        time.sleep(3.0)
        healthy.stop()
        # Whatever is still settling (a recycle under way) is given a bounded moment.
        deadline = time.monotonic() + 30
        end = figure()
        while (end[0] > start[0] * 1.1 or end[1] > start[1] + 2) and time.monotonic() < deadline:
            time.sleep(0.5)
            end = figure()
        _serves(url)  # a replacement server counts once it serves again (threads start with its models)
        time.sleep(1.0)
        end = figure()
        print(
            f"{args.deaths} deaths ({args.mode}, {args.instances} instance(s)): server threads {start[0]} -> {end[0]}, "
            f"regions {start[1]} -> {end[1]}; healthy client: {healthy.counts['ok']} answered, "
            f"{healthy.healthy_failures()} failed (Other {healthy.counts['other_failed']}, Echo "
            f"{healthy.counts['echo_failed']}; {healthy.outage_s:.2f} s without an answer), "
            f"{healthy.counts['echo_dead_instance']} routed to the dead instance; "
            f"server processes: {'same' if server_pid() == first_pid else 'replaced'}"
        )
        for error in healthy.errors:
            print(f"  healthy failure: {error}")
    finally:
        healthy.stop()
        triton.stop()


if __name__ == "__main__":
    main()
