"""The full benchmark behind ``make bench``: every scenario; writes results.json, results.md and results.png.

Usage: ``python -m bench [--out DIR] [--quick] [--only inprocess|remote|instances]`` (``make bench``
runs the full suite; ``--only inprocess`` runs only the in-process scenarios of bench/inprocess.py,
``--only remote`` RemoteTriton's transports, bench/remote.py, ``--only instances`` the
thread/process instance scenarios of bench/instances.py; the full suite runs all three too).
Each figure of the project is measured next to the plain Python-backend baseline, on the same
tritonserver binary and in the same run, and reported with the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np

from bench import host, inprocess, instances, remote, report
from bench._common import (
    ROOT,
    environment,
    free_ports,
    load,
    load_plain_models,
    model_stats,
    parallel_load,
    startup_plain,
)
from bench.models import BatchCounter, bind_project_models, write_plain_models
from pytriton.server.security import GRPC_HEADER_PREFIX, TRITON_ACCESS_HEADER
from pytriton.triton import Triton, TritonConfig

PERF_ANALYZER_DIR = ROOT / "bench" / ".tools"


# -- start-up ---------------------------------------------------------------------------------------
def startup_project(repeats: int) -> Dict[str, Any]:
    ready, stop = [], []
    for _ in range(repeats):
        http_port, grpc_port, metrics_port = free_ports(3)
        started = time.monotonic()
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.startup_child", str(http_port), str(grpc_port), str(metrics_port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        assert child.stdout is not None and child.stdin is not None
        if child.stdout.readline().split()[:1] != ["ready"]:  # "ready <run() seconds>"
            raise RuntimeError("project start-up child failed")
        ready.append(time.monotonic() - started)
        child.stdin.write("stop\n")
        child.stdin.flush()
        stop.append(float(child.stdout.readline()))
        child.wait(30)
    return {"ready_s": float(np.median(ready)), "stop_s": float(np.median(stop)), "runs": repeats}


# -- perf_analyzer -----------------------------------------------------------------------------------
def perf_analyzer(
    protocol: str, port: int, model: str, concurrency: int, interval_ms: int, token: Optional[str] = None
) -> Dict[str, Any]:
    binary = PERF_ANALYZER_DIR / "perf_analyzer"
    with tempfile.NamedTemporaryFile(suffix=".csv") as csv_file:
        command = [
            str(binary), "-m", model, "-i", protocol, "-u", f"127.0.0.1:{port}", "-b", "1",
            "--concurrency-range", f"{concurrency}:{concurrency}", "--measurement-interval", str(interval_ms),
            "--shape", "INPUT:16", "-f", csv_file.name, "--stability-percentage", "50", "--max-trials", "8",
        ]  # fmt: skip
        if token:
            # perf_analyzer reads the model's statistics, which the server restricts (docs/security.md).
            # Its only way to send the token is a header on its command line: visible to local users,
            # acceptable for this benchmark's own short-lived server on 127.0.0.1.
            header = TRITON_ACCESS_HEADER if protocol == "http" else GRPC_HEADER_PREFIX + TRITON_ACCESS_HEADER
            command += ["-H", f"{header}:{token}"]
        env = dict(os.environ, LD_LIBRARY_PATH=str(PERF_ANALYZER_DIR / "lib"))
        completed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
        if completed.returncode != 0:
            raise RuntimeError(completed.stdout[-1000:] + completed.stderr[-1000:])
        header, values = pathlib.Path(csv_file.name).read_text().strip().splitlines()[:2]
    row = dict(zip(header.split(","), values.split(",")))
    return {
        "requests_per_s": float(row["Inferences/Second"]),
        "p50_ms": float(row["p50 latency"]) / 1e3,
        "p99_ms": float(row["p99 latency"]) / 1e3,
    }


# -- the run ---------------------------------------------------------------------------------------------
def pair(measure: Any, project_model: str, plain_model: str, rounds: int = 2) -> Dict[str, Any]:
    """Measure project and baseline alternately (ABAB...) and keep each side's median round."""
    project: List[Dict[str, Any]] = []
    plain: List[Dict[str, Any]] = []
    for index in range(rounds):
        order = [(project_model, project), (plain_model, plain)]
        for model, sink in order if index % 2 == 0 else reversed(order):
            sink.append(measure(model))
    key = next(k for k in ("p50_ms", "requests_per_s", "mb_per_s", "responses_per_s") if k in project[0])
    pick = lambda runs: sorted(runs, key=lambda r: r[key])[len(runs) // 2]  # noqa: E731
    return {"project": pick(project), "baseline": pick(plain)}


def run(out: pathlib.Path, quick: bool) -> Dict[str, Any]:
    results: Dict[str, Any] = {"environment": environment(), "command": "make bench", "scenarios": {}}
    scenarios = results["scenarios"]
    steal = host.StealMeter()
    results["host"] = {"before": host.probe()}
    repeats = 2 if quick else 3
    print("start-up ...", flush=True)
    scenarios["startup"] = {"project": startup_project(repeats), "baseline": startup_plain(repeats)}

    http_port, grpc_port, metrics_port = free_ports(3)
    repository = pathlib.Path(tempfile.mkdtemp(prefix="pytriton-bench-repo-"))
    plain_names = write_plain_models(repository)
    counter = BatchCounter()
    config = TritonConfig(
        http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, model_repository=repository
    )
    try:
        with Triton(config=config) as triton:
            bind_project_models(triton, counter)
            triton.run()
            load_plain_models(http_port, plain_names, triton.get_access_token())
            count = 1500 if quick else 5000

            print("sequential latency ...", flush=True)
            # Every model of a protocol in one client, alternating blocks of 50 requests, so host
            # drift during the run hits project and baseline alike (load.latency_interleaved).
            latency = {
                protocol: load({
                    "scenario": "latency_interleaved", "protocol": protocol, "port": port, "count": count,
                    "models": ["proxy_identity", "plain_identity"] + (["plain_busy"] if protocol == "http" else []),
                    "max_s": 90.0,
                })
                for protocol, port in (("http", http_port), ("grpc", grpc_port))
            }  # fmt: skip
            for protocol, measured in latency.items():
                scenarios[f"latency_{protocol}"] = {
                    "project": measured["proxy_identity"], "baseline": measured["plain_identity"]
                }  # fmt: skip
            scenarios["latency_http_busy_reference"] = {
                "project": latency["http"]["plain_busy"], "baseline": latency["http"]["plain_identity"]
            }  # fmt: skip
            # Where the time goes inside the server, as Triton itself accounts it (means over the
            # sequential runs above): compute_infer is the model's execute(), i.e. the proxy's round
            # trip to the user's process for pytriton.
            scenarios["latency_server_side"] = {
                "project": model_stats(http_port, "proxy_identity", triton.get_access_token()),
                "baseline": model_stats(http_port, "plain_identity", triton.get_access_token()),
            }

            print("throughput ...", flush=True)
            for protocol, port in (("http", http_port), ("grpc", grpc_port)):
                for concurrency in (8, 32):
                    scenarios[f"throughput_{protocol}_c{concurrency}"] = pair(
                        lambda m, p=port, proto=protocol, c=concurrency: parallel_load(
                            {"scenario": "throughput", "protocol": proto, "port": p, "model": m, "concurrency": c,
                             "duration_s": 2.0 if quick else 3.0}, processes=2),
                        "proxy_identity", "plain_identity",
                    )  # fmt: skip

            print("large tensors ...", flush=True)
            for mib in (1, 16, 64):
                scenarios[f"large_{mib}mib_http"] = pair(
                    lambda m, size=mib: load({"scenario": "large_http", "port": http_port, "model": m,
                                              "bytes": size << 20, "count": 30 if size < 64 else 10}),
                    "proxy_large", "plain_large", rounds=2 if quick else 3,
                )  # fmt: skip

            print("dynamic batching ...", flush=True)
            batching: Dict[str, Any] = {}
            for side, model in (("project", "proxy_batched"), ("baseline", "plain_batched")):
                before = model_stats(http_port, model, triton.get_access_token())
                measured = parallel_load(
                    {
                        "scenario": "throughput",
                        "protocol": "grpc",
                        "port": grpc_port,
                        "model": model,
                        "concurrency": 32,
                        "duration_s": 3.0,
                    },
                    processes=2,
                )
                after = model_stats(http_port, model, triton.get_access_token())
                executions = max(1, after["executions"] - before["executions"])
                measured["avg_batch_size"] = (after["inferences"] - before["inferences"]) / executions
                batching[side] = measured
            batching["project"]["avg_batch_size_seen_by_callable"] = (
                float(np.mean(counter.sizes)) if counter.sizes else 0.0
            )
            scenarios["dynamic_batching_grpc_c32"] = batching

            print("streaming ...", flush=True)
            scenarios["streaming_grpc"] = pair(
                lambda m: load({"scenario": "stream_grpc", "port": grpc_port, "model": m, "responses": 200,
                                "repeats": 10 if quick else 20}),
                "proxy_stream", "plain_stream",
            )  # fmt: skip

            print("client overhead ...", flush=True)
            for protocol, port in (("http", http_port), ("grpc", grpc_port)):
                scenarios[f"client_overhead_{protocol}"] = load(
                    {"scenario": "client_overhead", "protocol": protocol, "port": port, "model": "plain_identity",
                     "count": 1000 if quick else 3000}
                )  # fmt: skip

            print("perf_analyzer ...", flush=True)
            if (PERF_ANALYZER_DIR / "perf_analyzer").exists():
                for protocol, port, concurrency in (("http", http_port, 1), ("grpc", grpc_port, 32)):
                    try:
                        scenarios[f"perf_analyzer_{protocol}_c{concurrency}"] = pair(
                            lambda m, proto=protocol, p=port, c=concurrency: perf_analyzer(
                                proto, p, m, c, 3000, triton.get_access_token()
                            ),
                            "proxy_identity", "plain_identity", rounds=1 if quick else 3,
                        )  # fmt: skip
                    except Exception as exc:  # reported, never hidden
                        scenarios[f"perf_analyzer_{protocol}_c{concurrency}"] = {"error": str(exc)[-500:]}
            else:
                scenarios["perf_analyzer"] = {
                    "error": f"perf_analyzer not found in {PERF_ANALYZER_DIR}; run bench/setup_perf_analyzer.sh"
                }
    finally:
        shutil.rmtree(repository, ignore_errors=True)
    print("in-process ...", flush=True)
    try:
        scenarios["inprocess"] = inprocess.run_scenarios(quick)
    except Exception as exc:  # reported, never hidden
        scenarios["inprocess"] = {"error": str(exc)[-500:]}
    print("thread and process instances ...", flush=True)
    try:
        scenarios["instances"] = instances.run_scenarios(quick)
    except Exception as exc:  # reported, never hidden
        scenarios["instances"] = {"error": str(exc)[-500:]}
    print("RemoteTriton's transports ...", flush=True)
    try:
        scenarios["remote"] = remote.run_scenarios(quick)
    except Exception as exc:  # reported, never hidden
        scenarios["remote"] = {"error": str(exc)[-500:]}
    results["host"]["after"] = host.probe()
    results["host"]["steal_percent"] = steal.percent()
    out.mkdir(parents=True, exist_ok=True)
    results["targets"] = report.check_targets(results)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    table = report.table(results) + "\nTargets:\n\n" + report.targets_table(results["targets"])
    if "summary" in scenarios.get("inprocess", {}):
        section = {"environment": results["environment"], "command": "make bench", "inprocess": scenarios["inprocess"]}
        table += "\nIn-process scenarios (bench/inprocess.py):\n\n" + report.inprocess_table(section)
    if "summary" in scenarios.get("instances", {}):
        section = {"environment": results["environment"], "command": "make bench", "instances": scenarios["instances"]}
        table += "\nThread and process instances (bench/instances.py):\n\n" + instances.table(section)
    if "p50_ms" in scenarios.get("remote", {}):
        table += "\nRemoteTriton's transports, sequential HTTP (bench/remote.py):\n\n" + remote.table(
            scenarios["remote"]
        )
    (out / "results.md").write_text(table)
    report.chart(results, out / "results.png")
    print(table)
    return results


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (for smoke runs)")
    parser.add_argument(
        "--only",
        choices=["inprocess", "remote", "instances"],
        help="run only these scenarios (bench/inprocess.py, bench/remote.py, bench/instances.py)",
    )
    args = parser.parse_args(argv)
    # Turn SIGTERM into SystemExit so that an interrupted run still stops its servers and removes
    # its temporary model repository (the finally blocks run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.only == "inprocess":
        return inprocess.main(["--out", str(args.out)] + (["--quick"] if args.quick else []))
    if args.only == "remote":
        return remote.main(["--out", str(args.out)] + (["--quick"] if args.quick else []))
    if args.only == "instances":
        return instances.main(["--out", str(args.out)] + (["--quick"] if args.quick else []))
    started = time.monotonic()
    run(args.out, args.quick)
    print(f"bench finished in {time.monotonic() - started:.0f} s; results in {args.out}")
    return 0
