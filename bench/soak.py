"""Soak and fault suite: sustained load checked bit-exact, memory over time, and fault probes.

Usage: ``python -m bench.soak [--short] [--out DIR] [--fixed-s S] [--mixed-s S] [--idle-s S]
[--mixed-connections N] [--allocator NAME]`` (``make soak`` runs the full version with 48 mixed
connections, ``make soak-short`` the one CI runs).

1. Starts ``bench/soak_server.py`` in its own process (a ``Triton`` serving identity models on free
   loopback ports) and finds its ``tritonserver`` and stub processes.
2. **fixed**: ``[1,16]`` float32 requests, random data, several connections at once, for ``--fixed-s``.
3. **mixed**: uint8 requests of random sizes from 1 KiB to 8 MiB (log-uniform), for ``--mixed-s``,
   from ``--mixed-connections`` connections.
4. **idle**: no traffic for ``--idle-s``; memory must come back within 20% of where the mixed run
   started (``MEMORY_SLACK``), for the user's process, the server and the stubs, and ``tritonserver``
   within 1.2x of its memory when the soak started (``SERVER_LIMIT``). ``--allocator`` picks the
   server's ``malloc`` (``TritonConfig.server_allocator``) to compare allocators.
5. The fault probes of :mod:`bench.soak_probes` (malformed and hostile requests, BaseException in the
   callable, access tokens, an oversized request, a killed stub, a killed server).
6. Stops the server (SIGTERM) and checks that no process, socket directory or ``/dev/shm`` segment
   of it is left.

Every response of the fixed and mixed runs is compared bit for bit with what was sent. RSS, open fds
and ``/dev/shm`` use are sampled every ``--sample-s``. Writes ``soak.json`` and, with matplotlib,
``soak.png`` to ``--out`` (default ``bench/results/soak``); exits 1 if anything failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np

from bench import soak_probes
from bench.soak_client import HttpClient, Processes, shm_usage

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = ["identity_f32", "identity_u8", "raises"]
MEMORY_SLACK = 0.20  # memory after the idle period may exceed the mixed run's start by this share
SERVER_LIMIT = 1.2  # tritonserver's RSS after the idle period, at most this times its RSS at the soak's start
MIXED_MIN, MIXED_MAX = 1 << 10, 8 << 20
STARTUP_S = 120.0


class Counter:
    """Thread-safe request counts of one phase."""

    def __init__(self) -> None:
        self.ok = 0
        self.failed = 0
        self.bytes = 0
        self.errors: List[str] = []
        self._lock = threading.Lock()

    def add(self, ok: bool, nbytes: int = 0, error: str = "") -> None:
        with self._lock:
            if ok:
                self.ok += 1
                self.bytes += nbytes
            else:
                self.failed += 1
                if len(self.errors) < 10:
                    self.errors.append(error)

    def summary(self, seconds: float) -> Dict[str, Any]:
        return {
            "requests": self.ok + self.failed,
            "failed": self.failed,
            "requests_per_s": round(self.ok / seconds, 1) if seconds else 0.0,
            "mb_per_s": round(self.bytes / 1e6 / seconds, 1) if seconds else 0.0,
            "first_errors": self.errors,
        }


def _fixed_payload(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((1, 16)).astype(np.float32)


def _mixed_payload(rng: np.random.Generator) -> np.ndarray:
    size = int(math.exp(rng.uniform(math.log(MIXED_MIN), math.log(MIXED_MAX))))
    return rng.integers(0, 256, size=(1, size), dtype=np.uint8)


def _worker(model: str, payload: Any, port: int, stop_at: float, counter: Counter, seed: int) -> None:
    """Send ``payload(rng)`` to ``model`` until ``stop_at``; count each answer bit-exact or failed."""
    rng = np.random.default_rng(seed)
    client = HttpClient(port)
    try:
        while time.monotonic() < stop_at:
            sent = payload(rng)
            try:
                answer = client.infer(model, {"INPUT": sent})
            except OSError as exc:
                counter.add(False, error=str(exc))
                continue
            received = answer.outputs.get("OUTPUT")
            exact = answer.status == 200 and received is not None and received.tobytes() == sent.tobytes()
            counter.add(exact, sent.nbytes, "" if exact else f"{answer.status}: {answer.error or 'bytes differ'}")
    finally:
        client.close()


def _fixed_worker(port: int, stop_at: float, counter: Counter, seed: int) -> None:
    _worker("identity_f32", _fixed_payload, port, stop_at, counter, seed)


def _mixed_worker(port: int, stop_at: float, counter: Counter, seed: int) -> None:
    _worker("identity_u8", _mixed_payload, port, stop_at, counter, seed)


def run_load(worker: Any, port: int, seconds: float, connections: int) -> Dict[str, Any]:
    """Run ``connections`` threads of ``worker`` for ``seconds``; return the phase summary."""
    counter = Counter()
    started = time.monotonic()
    stop_at = started + seconds
    threads = [
        threading.Thread(target=worker, args=(port, stop_at, counter, seed), daemon=True) for seed in range(connections)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 120)
    return counter.summary(time.monotonic() - started)


class Sampler:
    """Samples the served processes every ``interval_s`` on a background thread, with phase labels."""

    def __init__(self, user_pid: int, shm_prefix: str, interval_s: float):
        self._user_pid = user_pid
        self._shm_prefix = shm_prefix
        self._interval_s = interval_s
        self._started = time.monotonic()
        self.phase = "start"
        self.rows: List[Dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def sample_now(self) -> Dict[str, Any]:
        processes = Processes.find(self._user_pid, MODELS)
        row = processes.sample(self._shm_prefix)
        row["t_s"] = round(time.monotonic() - self._started, 2)
        row["phase"] = self.phase
        self.rows.append(row)
        return row

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample_now()


def memory_verdict(before: Dict[str, Any], after: Dict[str, Any], slack: float = MEMORY_SLACK) -> Dict[str, Any]:
    """Compare RSS per process (and /dev/shm use) after the idle period with the mixed run's start."""
    verdict: Dict[str, Any] = {"slack": slack, "passed": True, "processes": {}}
    for key in ("user_rss_kib", "server_rss_kib", "stubs_rss_kib", "shm_kib"):
        start, end = before.get(key, 0), after.get(key, 0)
        limit = start * (1 + slack)
        within = end <= limit
        verdict["processes"][key] = {
            "start": start,
            "end": end,
            "ratio": round(end / start, 3) if start else None,
            "within": within,
        }
        verdict["passed"] = verdict["passed"] and within
    return verdict


def server_memory_verdict(start: Dict[str, Any], end: Dict[str, Any], limit: float = SERVER_LIMIT) -> Dict[str, Any]:
    """tritonserver's RSS after the idle period against its RSS when the soak started (issue 25, item 6)."""
    before, after = start.get("server_rss_kib", 0), end.get("server_rss_kib", 0)
    ratio = round(after / before, 3) if before else None
    return {
        "limit": limit,
        "start": before,
        "end": after,
        "ratio": ratio,
        "passed": bool(before) and after <= before * limit,
    }


def _start_server(workdir: pathlib.Path, allocator: Optional[str] = None) -> tuple:
    info_path = workdir / "server.json"
    log_path = workdir / "server.log"
    log = log_path.open("wb")
    env = dict(os.environ)
    if allocator:
        env["PYTRITON_TRITON_CONFIG_SERVER_ALLOCATOR"] = allocator
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.soak_server", str(info_path)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + STARTUP_S
    while not info_path.exists():
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            raise RuntimeError(f"the soak server did not start; its output:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.1)
    return child, json.loads(info_path.read_text()), log_path


def _stop_server(child: subprocess.Popen, info: Dict[str, Any], seen_pids: List[int]) -> Dict[str, Any]:
    """SIGTERM the server process, then look for anything it left behind."""
    started = time.monotonic()
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    stop_s = time.monotonic() - started
    time.sleep(0.5)  # the watchdog and the kernel finish their part
    alive = [pid for pid in seen_pids if os.path.exists(f"/proc/{pid}") and _state(pid) not in ("Z", "X")]
    prefix = f"pytriton-{info['pid']}-"
    sockets = [name for name in os.listdir(tempfile.gettempdir()) if name.startswith(prefix)]
    leftovers = {"processes": alive, "socket_dirs": sockets, "shm": shm_usage(prefix)["shm_segments"]}
    return {
        "exit_code": child.returncode,
        "stop_s": round(stop_s, 2),
        "leftovers": leftovers,
        "clean": not alive and not sockets and not leftovers["shm"],
    }


def _state(pid: int) -> str:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    return stat[stat.rfind(")") + 2 :].split()[0]


def _plot(report: Dict[str, Any], path: pathlib.Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = report["samples"]
    times = [row["t_s"] for row in rows]
    figure, (memory, shm) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for key, label in (
        ("user_rss_kib", "user process"),
        ("server_rss_kib", "tritonserver"),
        ("stubs_rss_kib", "stubs (sum)"),
    ):
        memory.plot(times, [row[key] / 1024 for row in rows], label=label)
    shm.plot(times, [row["shm_kib"] / 1024 for row in rows], label="/dev/shm in use", color="tab:purple")
    previous = None
    for row in rows:
        if row["phase"] != previous:
            for axis in (memory, shm):
                axis.axvline(row["t_s"], color="grey", linewidth=0.6, linestyle=":")
            memory.annotate(row["phase"], (row["t_s"], 0), xytext=(2, 2), textcoords="offset points", fontsize=8)
            previous = row["phase"]
    memory.set_ylabel("RSS (MiB)")
    shm.set_ylabel("MiB")
    shm.set_xlabel("seconds since start")
    memory.legend(loc="upper left")
    shm.legend(loc="upper left")
    memory.set_title(f"pytriton soak: {report['verdict']}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


_DUMP_LINE = re.compile(r"^(Thread 0x|Current thread 0x|  File |\s*$)")


def log_evidence(server_log: str, messages: int = 60, tail: int = 40) -> List[str]:
    """What a failed soak prints of the serving process's log (the whole log is in ``server.log``).

    pytriton's own last ``messages`` log lines (``soak-server ...``: restarts, replaced stubs), then
    the last ``tail`` lines, widened to the whole thread dump they end in: a probe that timed out
    dumps every thread, and the one that matters (the supervisor's) is rarely among the last lines.
    """
    lines = server_log.splitlines()
    start = len(lines)
    while start > 0 and _DUMP_LINE.match(lines[start - 1]):
        start -= 1
    start = min(start, max(0, len(lines) - tail))
    notes = [line for line in lines[:start] if line.startswith("soak-server ")][-messages:]
    return [*notes, *(["..."] if notes else []), *lines[start:]]


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """The whole soak; returns the report (also written to ``args.out``)."""
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: Dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "out"}, "phases": {}}
    with tempfile.TemporaryDirectory(prefix="pytriton-soak-") as workdir:
        child, info, log_path = _start_server(pathlib.Path(workdir), args.allocator)
        sampler = Sampler(info["pid"], f"pytriton-{info['pid']}-", args.sample_s)
        seen: List[int] = []
        try:
            target = soak_probes.Target(info, MODELS)
            processes = target.processes()
            seen.extend([pid for pid in (processes.server, *processes.stubs) if pid])
            for _ in range(50):  # warm every path once: first-touch costs are not growth
                target.identity_ok()
            sampler.start()
            sampler.phase = "fixed"
            report["phases"]["fixed_start"] = sampler.sample_now()
            report["phases"]["fixed"] = run_load(_fixed_worker, info["http_port"], args.fixed_s, args.connections)
            sampler.phase = "mixed"
            mixed_start = sampler.sample_now()
            report["phases"]["mixed"] = run_load(_mixed_worker, info["http_port"], args.mixed_s, args.mixed_connections)
            sampler.phase = "idle"
            report["phases"]["mixed_end"] = sampler.sample_now()
            time.sleep(args.idle_s)
            idle_end = sampler.sample_now()
            report["memory"] = memory_verdict(mixed_start, idle_end)
            report["server_memory"] = server_memory_verdict(report["phases"]["fixed_start"], idle_end)
            sampler.phase = "probes"
            report["probes"] = _run_probes(target, info, seen)
            sampler.phase = "stop"
        finally:
            sampler.stop()
            report["stop"] = _stop_server(child, info, seen)
            server_log = log_path.read_text(errors="replace")
            report["server_log_tail"] = log_evidence(server_log)
            (out / "server.log").write_text(server_log)  # the whole log, thread dumps included
    report["samples"] = sampler.rows
    failed_requests = report["phases"]["fixed"]["failed"] + report["phases"]["mixed"]["failed"]
    failed_probes = sorted(name for name, probe in report["probes"].items() if not probe["passed"])
    report["failed_requests"] = failed_requests
    report["failed_probes"] = failed_probes
    report["passed"] = (
        not failed_requests
        and report["memory"]["passed"]
        and report["server_memory"]["passed"]
        and not failed_probes
        and report["stop"]["clean"]
    )
    report["verdict"] = "passed" if report["passed"] else "FAILED"
    (out / "soak.json").write_text(json.dumps(report, indent=2))
    report["plot"] = str(out / "soak.png") if _plot(report, out / "soak.png") else None
    return report


def _run_probes(target: soak_probes.Target, info: Dict[str, Any], seen: List[int]) -> Dict[str, Any]:
    probes = {
        "malformed": lambda: soak_probes.probe_malformed(target),
        "base_exceptions": lambda: soak_probes.probe_base_exceptions(target),
        "tokens": lambda: soak_probes.probe_tokens(target),
        "oversized": lambda: soak_probes.probe_oversized(target, info.get("max_request_bytes")),
        "huge_shape": lambda: soak_probes.probe_huge_shape(target),
        "deep_json": lambda: soak_probes.probe_deep_json(target),
        "stub_killed": lambda: soak_probes.probe_stub_killed(target),
        "server_killed": lambda: soak_probes.probe_server_killed(target),
    }
    results = {}
    for name, probe in probes.items():
        started = time.monotonic()
        try:
            results[name] = probe()
        except Exception as exc:  # a probe that blew up is a failed probe, with the reason
            results[name] = {"passed": False, "detail": f"probe raised {type(exc).__name__}: {exc}"}
        results[name]["seconds"] = round(time.monotonic() - started, 2)
        processes = target.processes()  # restarted processes must be gone at the end as well
        seen.extend(pid for pid in (processes.server, *processes.stubs) if pid and pid not in seen)
        print(
            f"  probe {name:16s} {'ok  ' if results[name]['passed'] else 'FAIL'} {results[name]['detail']}", flush=True
        )
    return results


def _summary_lines(report: Dict[str, Any]) -> List[str]:
    fixed, mixed, memory = report["phases"]["fixed"], report["phases"]["mixed"], report["memory"]
    lines = [
        f"fixed [1,16] fp32: {fixed['requests']} requests, {fixed['failed']} failed, {fixed['requests_per_s']} req/s",
        f"mixed 1 KiB-8 MiB: {mixed['requests']} requests, {mixed['failed']} failed, {mixed['mb_per_s']} MB/s",
        "memory after idle vs mixed start (limit +{:.0%}):".format(memory["slack"]),
    ]
    for key, entry in memory["processes"].items():
        lines.append(
            f"  {key:15s} {entry['start'] / 1024:8.1f} MiB -> {entry['end'] / 1024:8.1f} MiB {'ok' if entry['within'] else 'OVER'}"
        )
    lines.append(f"stop: {report['stop']['stop_s']} s, leftovers {report['stop']['leftovers']}")
    server = report.get("server_memory")
    if server:
        lines.append(
            f"tritonserver after idle vs soak start (limit {server['limit']}x): {server['start'] / 1024:.1f} MiB -> "
            f"{server['end'] / 1024:.1f} MiB ({server['ratio']}x) {'ok' if server['passed'] else 'OVER'}"
        )
    lines.append(f"verdict: {report['verdict']} (failed probes: {report['failed_probes'] or 'none'})")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="the CI version: 20 s fixed, 20 s mixed, 25 s idle")
    parser.add_argument("--fixed-s", type=float, default=120.0)
    parser.add_argument("--mixed-s", type=float, default=120.0)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--mixed-connections", type=int, default=2, help="connections of the mixed-size run")
    parser.add_argument("--sample-s", type=float, default=1.0)
    parser.add_argument(
        "--allocator",
        default=None,
        help="the server's malloc: auto, jemalloc, tcmalloc, glibc or a library path (TritonConfig.server_allocator)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "soak"))
    args = parser.parse_args(argv)
    if args.short:
        args.fixed_s, args.mixed_s, args.idle_s = 20.0, 20.0, 25.0
    report = run(args)
    for line in _summary_lines(report):
        print(line)
    print(f"report: {pathlib.Path(args.out) / 'soak.json'}" + (f", plot: {report['plot']}" if report["plot"] else ""))
    if not report["passed"]:  # the evidence where CI shows it, not only in the report file
        print(f"the serving process's last log lines (all of it: {pathlib.Path(args.out) / 'server.log'}):")
        for line in report["server_log_tail"]:
            print(f"  | {line}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
