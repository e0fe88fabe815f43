"""Thread instances against process instances (``bind(..., instance_kind="process")``), in one run.

Usage: ``python -m bench.instances [--quick] [--out DIR]``, also ``python -m bench --only instances``;
``make bench`` runs it after the other scenarios. Results: ``DIR/instances.json`` and
``DIR/instances.md`` (default ``bench/results/``).

One ``Triton`` serves:

* ``cpu_t1``, ``cpu_t2``, ``cpu_p1``, ``cpu_p2``: a pure-Python CPU-bound callable (a loop of about
  2 ms per request, :func:`cpu_work`; it never releases the GIL) with 1 or 2 thread instances and 1
  or 2 process instances, one request per batch (``max_batch_size=1``). Throughput with ``CONCURRENCY`` requests in flight from one gRPC asyncio
  client process; the figure of interest is the speed-up of 2 instances over 1 of the same kind;
* ``id_thread``, ``id_process``: the ``[1,16]`` fp32 identity with one thread instance and one
  process instance, sequential p50/p99 over HTTP, measured interleaved in one client (blocks of 50
  requests alternate between the two models).

A round measures every model once, and rounds alternate the order; each figure is the median over
the rounds. The load generators are separate processes and share the machine's CPUs with the
server and the workers, so the speed-up of 2 processes stays below the number of cores.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

from pytriton.model_config import ModelConfig, Tensor

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONCURRENCY = 8
LOOP_ITERATIONS = 60_000  # about 2 ms of pure Python on the 2-core reference machine (measured per run)
CPU_MODELS = ("cpu_t1", "cpu_t2", "cpu_p1", "cpu_p2")
IDENTITY_MODELS = ("id_thread", "id_process")


def cpu_work(requests):
    """About 2 ms of pure-Python work per request (a loop that holds the GIL), then the identity."""
    results = []
    for request in requests:
        total = 0
        for index in range(LOOP_ITERATIONS * len(request["INPUT"])):
            total += index & 7
        results.append({"OUTPUT": request["INPUT"]})
    return results


def identity(requests):
    return [{"OUTPUT": request["INPUT"]} for request in requests]


def loop_ms(repeats: int = 20) -> float:
    """The median time of one request's work in :func:`cpu_work`, in this process, in ms."""
    request = [{"INPUT": np.ones((1, 16), np.float32)}]
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        cpu_work(request)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e3


def bind_models(triton: Any) -> None:
    tensors = dict(
        inputs=[Tensor(name="INPUT", shape=(16,), dtype=np.float32)],
        outputs=[Tensor(name="OUTPUT", shape=(16,), dtype=np.float32)],
    )
    # One request per batch for the CPU-bound models: the dynamic batcher would otherwise gather every
    # request in flight into one batch for one instance while the other waits, hiding parallelism.
    for name, kind, count in (("t1", "thread", 1), ("t2", "thread", 2), ("p1", "process", 1), ("p2", "process", 2)):
        triton.bind(
            f"cpu_{name}", [cpu_work] * count, instance_kind=kind, config=ModelConfig(max_batch_size=1), **tensors
        )
    triton.bind("id_thread", identity, instance_kind="thread", config=ModelConfig(max_batch_size=8), **tensors)
    triton.bind("id_process", identity, instance_kind="process", config=ModelConfig(max_batch_size=8), **tensors)


def summarize(rounds: List[Dict[str, Dict[str, float]]]) -> Dict[str, Dict[str, float]]:
    """Median of each model's figures over ``rounds``; speed-ups of 2 instances over 1 and p50 ratios.

    ``speedup`` (``cpu_t2``, ``cpu_p2``) is the median requests/s of the 2-instance model over its
    1-instance twin's; ``p50_ratio`` (``id_process``) is the process identity's median p50 over the
    thread identity's (lower is better).
    """
    models = list(dict.fromkeys(model for measured in rounds for model in measured))
    summary: Dict[str, Dict[str, float]] = {}
    for model in models:
        figures: Dict[str, float] = {}
        for figure in ("requests_per_s", "p50_ms", "p99_ms"):
            values = [measured[model][figure] for measured in rounds if figure in measured.get(model, {})]
            if values:
                figures[figure] = float(statistics.median(values))
        summary[model] = figures
    for two, one in (("cpu_t2", "cpu_t1"), ("cpu_p2", "cpu_p1"), ("cpu_p1", "cpu_t1")):
        if summary.get(one, {}).get("requests_per_s") and "requests_per_s" in summary.get(two, {}):
            summary[two]["speedup" if two[-1] == "2" else "vs_thread"] = (
                summary[two]["requests_per_s"] / summary[one]["requests_per_s"]
            )
    if summary.get("id_thread", {}).get("p50_ms") and "p50_ms" in summary.get("id_process", {}):
        summary["id_process"]["p50_ratio"] = summary["id_process"]["p50_ms"] / summary["id_thread"]["p50_ms"]
    return summary


ROWS = (
    ("cpu_t1", "CPU-bound ~2 ms, 1 thread instance"),
    ("cpu_t2", "CPU-bound ~2 ms, 2 thread instances"),
    ("cpu_p1", "CPU-bound ~2 ms, 1 process instance"),
    ("cpu_p2", "CPU-bound ~2 ms, 2 process instances"),
    ("id_thread", "identity [1,16] fp32, 1 thread instance"),
    ("id_process", "identity [1,16] fp32, 1 process instance"),
)


def table(results: Dict[str, Any]) -> str:
    """Markdown: one row per model with its throughput or latency and the ratio that matters for it."""
    env, section = results["environment"], results["instances"]
    summary = section["summary"]
    lines = [
        f"Command: `{results['command']}`; {env['time']}; pytriton {env['pytriton']}, tritonserver "
        f"{env['tritonserver']}, Python {env['python']}, {env['cpu_count']} CPUs ({env['machine']}); median of "
        f"{len(section['rounds'])} round(s); one request's work took {section['loop_ms']:.2f} ms in the bench process.",
        "",
        f"| model | gRPC, {section['concurrency']} in flight | 2 instances / 1 | sequential HTTP p50 | p99 | "
        "p50 / thread |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for model, label in ROWS:
        figures = summary.get(model)
        if not figures:
            continue
        rate = f"{figures['requests_per_s']:.0f} req/s" if "requests_per_s" in figures else ""
        speedup = f"{figures['speedup']:.2f}x" if "speedup" in figures else ""
        p50 = f"{figures['p50_ms']:.3f} ms" if "p50_ms" in figures else ""
        p99 = f"{figures['p99_ms']:.3f} ms" if "p99_ms" in figures else ""
        ratio = f"{figures['p50_ratio']:.2f}x" if "p50_ratio" in figures else ""
        lines.append(f"| {label} | {rate} | {speedup} | {p50} | {p99} | {ratio} |")
    return "\n".join(lines) + "\n"


def _round(http_port: int, grpc_port: int, count: int, duration_s: float, reverse: bool) -> Dict[str, Any]:
    from bench._common import load

    measured: Dict[str, Dict[str, float]] = {}
    for model in reversed(CPU_MODELS) if reverse else CPU_MODELS:
        spec = {"scenario": "throughput", "protocol": "grpc", "port": grpc_port, "model": model,
                "concurrency": CONCURRENCY, "duration_s": duration_s}  # fmt: skip
        measured[model] = {"requests_per_s": load(spec)["requests_per_s"]}
    models = list(reversed(IDENTITY_MODELS)) if reverse else list(IDENTITY_MODELS)
    latency = load({"scenario": "latency_interleaved", "protocol": "http", "port": http_port, "count": count,
                    "models": models, "max_s": 60.0})  # fmt: skip
    for model in IDENTITY_MODELS:
        measured[model] = {"p50_ms": latency[model]["p50_ms"], "p99_ms": latency[model]["p99_ms"]}
    return measured


def run_scenarios(quick: bool) -> Dict[str, Any]:
    """Measure every model (1 round with ``quick``, else 3); returns the rounds and their summary."""
    from bench._common import free_ports
    from pytriton.triton import Triton, TritonConfig

    rounds_count, count, duration_s = (1, 1000, 2.0) if quick else (3, 2000, 3.0)
    http_port, grpc_port, metrics_port = free_ports(3)
    rounds: List[Dict[str, Dict[str, float]]] = []
    work_ms = loop_ms()
    with Triton(config=TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)) as triton:
        bind_models(triton)
        triton.run()
        for index in range(rounds_count):
            print(f"instance scenarios, round {index + 1} of {rounds_count} ...", flush=True)
            rounds.append(_round(http_port, grpc_port, count, duration_s, reverse=index % 2 == 1))
    return {
        "rounds": rounds,
        "summary": summarize(rounds),
        "concurrency": CONCURRENCY,
        "requests": count,
        "loop_ms": work_ms,
    }


def main(argv: Optional[List[str]] = None) -> int:
    from bench import host, report
    from bench._common import environment

    parser = argparse.ArgumentParser(prog="python -m bench.instances")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
    parser.add_argument("--quick", action="store_true", help="one round, shorter runs")
    args = parser.parse_args(argv)
    # SIGTERM as SystemExit, so that an interrupted run still stops its server and its worker processes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    steal = host.StealMeter()
    before = host.probe()
    results = {
        "environment": environment(),
        "command": "python -m bench --only instances" + (" --quick" if args.quick else ""),
        "instances": run_scenarios(args.quick),
    }
    results["host"] = {"before": before, "after": host.probe(), "steal_percent": steal.percent()}
    report.write(args.out, "instances", results, table(results))
    print(f"instance scenarios finished in {time.monotonic() - started:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
