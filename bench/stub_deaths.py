"""What stub deaths leave behind in tritonserver: its thread count and its Python-backend regions.

Usage: ``python -m bench.stub_deaths [--deaths N] [--instances K] [--mode traffic|idle]``.

One ``Triton`` serves an identity model (thread instances). Each round ``SIGKILL``s one of the
model's stubs and waits until the model serves 5 requests in a row again, with its stubs all back.
Printed per round and at the end: ``/proc/<tritonserver pid>/task`` entries and ``/dev/shm``
regions with the server's region prefix.

``--mode traffic`` (the issue's case) sends requests as soon as the stub is killed, so some reach
the dead instance before pytriton's new generation is ready; ``--mode idle`` sends none until the
new generation's stub runs (and one more second). On Triton 2.51 only the first leaks (about 36
threads and one 4 MiB region per death): a request handed to a dead stub's instance keeps that
model generation alive for good (docs/architecture.md, "Stub death").
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from typing import List, Tuple

import numpy as np
import tritonclient.http as httpclient

from pytriton.model_config import Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import free_ports


def echo(requests):
    return [dict(request.items()) for request in requests]


def _stubs(server_pid: int, model: str) -> List[int]:
    """Pids of the live stub processes of ``model`` under the server."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                args = cmdline.read()
        except OSError:
            continue
        is_stub = b"triton_python_backend_stub" in args and f"/{model}/".encode() in args
        if is_stub and int(fields[1]) == server_pid and fields[0] != b"Z":
            pids.append(int(entry))
    return sorted(pids)


def _serves(url: str, streak: int = 5, timeout_s: float = 60.0) -> bool:
    """True once ``streak`` requests in a row are answered correctly (bounded by ``timeout_s``)."""
    x = np.arange(4, dtype=np.float32)[None]
    deadline = time.monotonic() + timeout_s
    good = 0
    while time.monotonic() < deadline and good < streak:
        client = httpclient.InferenceServerClient(url, network_timeout=30)
        try:
            tensor = httpclient.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            np.testing.assert_array_equal(client.infer("Echo", [tensor]).as_numpy("x"), x)
            good += 1
        except Exception:  # noqa: BLE001 - the dead instance's requests fail until it is replaced
            good = 0
            time.sleep(0.05)
        finally:
            client.close()
    return good >= streak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deaths", type=int, default=30)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--mode", choices=("traffic", "idle"), default="traffic")
    args = parser.parse_args()
    http, grpc, metrics = free_ports(3)
    triton = Triton(config=TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics))
    x = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
    triton.bind("Echo", [echo] * args.instances, x, x)
    triton.run()
    url = f"127.0.0.1:{http}"
    try:
        local = triton._local  # the launched server's capabilities (pytriton/_serving/backend.py)
        assert local is not None
        server = local.server
        assert server is not None and server.pid is not None
        pid, prefix = server.pid, local.region_prefix
        assert prefix is not None

        def figure() -> Tuple[int, int]:
            regions = [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]
            return len(os.listdir(f"/proc/{pid}/task")), len(regions)

        assert _serves(url)
        time.sleep(1.0)
        start = figure()
        print(f"start: {start[0]} server threads, {start[1]} regions", flush=True)
        for death in range(args.deaths):
            before = _stubs(pid, "Echo")
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
            ok = _serves(url)
            deadline = time.monotonic() + 20
            while len(_stubs(pid, "Echo")) != args.instances and time.monotonic() < deadline:
                time.sleep(0.05)
            threads, regions = figure()
            print(
                f"death {death + 1}: serving={ok} after {time.monotonic() - began:.2f} s; {threads} threads, {regions} regions"
            )
        time.sleep(3.0)
        end = figure()
        server = local.server
        print(
            f"{args.deaths} deaths ({args.mode}, {args.instances} instance(s)): server threads {start[0]} -> {end[0]}, "
            f"regions {start[1]} -> {end[1]}; same server process: {server is not None and server.pid == pid}"
        )
    finally:
        triton.stop()


if __name__ == "__main__":
    main()
