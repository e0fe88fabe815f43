"""Does memory come back? RSS of the server, the stubs and the user process around large requests.

``python -m bench.memory [--size-mib 256] [--idle-s 10] [--mixed-s 60] [--json PATH]`` starts a
``Triton`` in this process with one identity model (``uint8 [-1]``, one instance), then measures:

1. ``baseline``: after a few small warm-up requests;
2. ``after_burst``: right after ``--bursts`` requests of ``--size-mib`` MiB (``--burst-protocol``);
3. ``after_idle``: after ``--idle-s`` seconds without traffic;
4. ``mixed``: during ``--mixed-s`` seconds (or ``--mixed-requests`` requests) of requests with sizes drawn log-uniformly from 1 KiB
   to 8 MiB (4 client threads), sampled every ``--sample-s`` seconds, then after ``--idle-s``.

The clients run in a child process, so their own buffers do not count. For each process it
reports RSS and its shared-memory part (``RssShmem`` in ``/proc/<pid>/status``: mapped
shared-memory segments, including unlinked ones), and the bytes the pytriton and Python-backend
segments still occupy in ``/dev/shm`` plus the system's ``Shmem`` (``/proc/meminfo``), which also
counts segments that are mapped but no longer named (and those of other programs); ``shared`` is
every ``/dev/shm`` segment these processes map, counted once; ``total`` is the private memory of
all processes plus ``shared``. The model returns a fresh copy
of its input, so outputs use the worker's arena as most callables' outputs do. Every loop is bounded in count and time.
The results are printed as a table and, with ``--json``, written as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List

import numpy as np

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

MIB = 1 << 20


def _status_kib(pid: int, *fields: str) -> Dict[str, int]:
    values = {field: 0 for field in fields}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, rest = line.partition(":")
                if key in values:
                    values[key] = int(rest.split()[0])
    except FileNotFoundError:
        pass
    return values


def _children(pid: int) -> List[int]:
    found: List[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found.extend(int(child) for child in children.read().split())
        except FileNotFoundError:
            continue
    return found


def _shared_by_inode(pid: int, seen: Dict[int, int]) -> None:
    """Record, per ``/dev/shm`` file mapped by ``pid``, the largest resident size (KiB) seen so far.

    A process may map one file several times (the Python backend remaps its region as it grows):
    its mappings of one file are summed, and the largest sum over the processes is kept.
    """
    mine: Dict[int, int] = {}
    inode = None
    try:
        with open(f"/proc/{pid}/smaps") as smaps:
            for line in smaps:
                first = line.split(None, 6)
                if "-" in first[0] and len(first) >= 5 and ":" in first[3]:  # a mapping's header line
                    inode = int(first[4]) if len(first) >= 6 and first[5].startswith("/dev/shm/") else None
                elif inode is not None and first[0] == "Rss:":
                    mine[inode] = mine.get(inode, 0) + int(first[1])
    except FileNotFoundError:
        return
    for key, kib in mine.items():
        seen[key] = max(seen.get(key, 0), kib)


def _meminfo_kib(field: str) -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _shm_bytes(prefix: str) -> int:
    total = 0
    for name in os.listdir("/dev/shm"):
        if name.startswith(prefix):
            try:
                total += os.stat(os.path.join("/dev/shm", name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def snapshot(triton: Triton, label: str) -> Dict[str, Any]:
    """Memory of every process involved, in MiB."""
    process = triton._local.server if triton._local is not None else None  # noqa: SLF001 (bench-only peek)
    server = process.pid if process is not None else None
    processes = {"user": os.getpid()}
    if server is not None:
        processes["server"] = server
        for index, stub in enumerate(sorted(_children(server))):
            processes[f"stub{index}"] = stub
    row: Dict[str, Any] = {"label": label}
    shared: Dict[int, int] = {}
    for name, pid in processes.items():
        _shared_by_inode(pid, shared)
        kib = _status_kib(pid, "VmRSS", "RssShmem")
        row[f"{name}_rss"] = round(kib["VmRSS"] / 1024, 1)
        row[f"{name}_shm"] = round(kib["RssShmem"] / 1024, 1)
    row["dev_shm"] = round(_shm_bytes(triton._shm_prefix) / MIB, 1)  # noqa: SLF001
    row["sys_shmem"] = round(_meminfo_kib("Shmem") / 1024, 1)
    # Memory actually held: private memory of every process, plus every shared-memory segment
    # they map (named or not), counted once at its largest resident size.
    row["shared"] = round(sum(shared.values()) / 1024, 1)
    private = sum(row[f"{name}_rss"] - row[f"{name}_shm"] for name in processes)
    row["total"] = round(private + row["shared"], 1)
    return row


_CLIENT = r"""
import sys, threading, time
import numpy as np
url, grpc_url, mode, value, count = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
budget = int(sys.argv[6])  # mixed: stop after this many requests (or `value` seconds)
protocol = mode.split("-")[-1]
if protocol == "grpc":
    import tritonclient.grpc as client_module
    url = grpc_url
else:
    import tritonclient.http as client_module

def make_client():
    if protocol == "grpc":
        return client_module.InferenceServerClient(url)
    return client_module.InferenceServerClient(url, network_timeout=600, connection_timeout=600)

def send(client, nbytes, rng):
    x = rng.integers(0, 255, size=(1, nbytes), dtype=np.uint8)
    tensor = client_module.InferInput("x", [1, nbytes], "UINT8")
    tensor.set_data_from_numpy(x)
    out = client.infer("Identity", [tensor])
    assert np.array_equal(out.as_numpy("x"), x), "result differs"

if mode.startswith("burst"):
    client = make_client()
    rng = np.random.default_rng(0)
    for _ in range(count):
        send(client, int(value), rng)
    client.close()
else:  # mixed: `value` seconds or `budget` requests, `count` threads, log-uniform 1 KiB .. 8 MiB
    deadline = time.monotonic() + value
    done, failed = [0], []

    def worker(seed):
        client = make_client()
        rng = np.random.default_rng(seed)
        while time.monotonic() < deadline and not failed and done[0] < budget:
            try:
                send(client, int(2 ** rng.uniform(10, 23)), rng)
                done[0] += 1
            except Exception as exc:
                failed.append(repr(exc))
        client.close()

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(value + 300)
    print(f"mixed over {protocol}: {done[0]} requests, {len(failed)} failed {failed[:1]}", flush=True)
    sys.exit(1 if failed else 0)
"""


def _client(urls: List[str], mode: str, value: float, count: int, budget: int = 0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CLIENT, *urls, mode, str(value), str(count), str(budget)])


def fresh_copy(requests: Any) -> Any:
    # A new output array, as most callables produce: it travels through the worker's own arena.
    return [{"x": request["x"].copy()} for request in requests]


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--bursts", type=int, default=1)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--mixed-s", type=float, default=60.0)
    parser.add_argument("--mixed-requests", type=int, default=1_000_000, help="stop the mixed run after this many")
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--burst-protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http", help="of the mixed run")
    parser.add_argument("--threads", type=int, default=4, help="client threads of the mixed run")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from tests.conftest import triton_ports  # free loopback ports

    ports = triton_ports()
    rows: List[Dict[str, Any]] = []
    config = TritonConfig(
        http_port=ports["http_port"], grpc_port=ports["grpc_port"], metrics_port=ports["metrics_port"]
    )
    with Triton(config=config) as triton:
        triton.bind(
            "Identity",
            fresh_copy,
            [Tensor(name="x", shape=(-1,), dtype=np.uint8)],
            [Tensor(name="x", shape=(-1,), dtype=np.uint8)],
            config=ModelConfig(max_batch_size=1),
        )
        triton.run()
        urls = [f"127.0.0.1:{ports['http_port']}", f"127.0.0.1:{ports['grpc_port']}"]

        def run_client(mode: str, value: float, count: int, timeout_s: float) -> None:
            process = _client(urls, mode, value, count)
            if process.wait(timeout_s) != 0:
                raise SystemExit(f"client ({mode}) failed")

        run_client("burst-http", 1024, 20, 120)
        rows.append(snapshot(triton, "baseline"))
        if args.size_mib > 0:
            run_client(f"burst-{args.burst_protocol}", args.size_mib * MIB, args.bursts, 900)
            rows.append(snapshot(triton, f"after {args.bursts}x{args.size_mib} MiB"))
            time.sleep(args.idle_s)
            rows.append(snapshot(triton, f"after {args.idle_s:g} s idle"))
        if args.mixed_s > 0:
            process = _client(urls, f"mixed-{args.protocol}", args.mixed_s, args.threads, args.mixed_requests)
            started = time.monotonic()
            while process.poll() is None and time.monotonic() < started + args.mixed_s + 300:
                time.sleep(min(args.sample_s, max(0.1, started + args.mixed_s - time.monotonic())))
                if process.poll() is None:
                    rows.append(snapshot(triton, f"mixed {time.monotonic() - started:.0f} s"))
            if process.wait(300) != 0:
                raise SystemExit("mixed client failed")
            rows.append(snapshot(triton, "mixed end"))
            time.sleep(args.idle_s)
            rows.append(snapshot(triton, f"mixed + {args.idle_s:g} s idle"))
    columns = [key for key in rows[0] if key != "label"]
    print(f"{'phase':<24}" + "".join(f"{column:>12}" for column in columns))
    for row in rows:
        print(f"{row['label']:<24}" + "".join(f"{row.get(column, ''):>12}" for column in columns))
    print("MiB; *_shm: shared-memory pages inside *_rss; dev_shm: our segments still named; sys_shmem: system Shmem")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
