"""The three instance kinds against the plain Python-backend model, in one server and one run.

Usage: ``python -m bench.kinds [--rounds N] [--quick] [--out DIR]``. Results: ``DIR/kinds.json`` and
``DIR/kinds.md`` (default ``bench/results/``).

One ``Triton`` serves the plain Python-backend identity models (``plain_dynamic``, ``plain_dynamic_large``:
``execute`` returns its input, no second process; the physical limit), the same two again as
``plain_ref`` and ``plain_ref_large`` (the run's noise floor: their ratio to the plain models is
what one run can resolve on a shared machine), next to the same identity
callable bound with ``instance_kind="thread"``, ``"process"`` and ``"backend"`` (``id_<kind>``
for ``[1,16]`` float32, ``large_<kind>`` for uint8 of any length). Per round, each figure for every
model:

* sequential p50 over HTTP and over gRPC, ``[1,16]`` fp32, one client measuring every model in
  alternating blocks of 50 requests (``bench.load.latency_interleaved``);
* server CPU per sequential request: the CPU time of this process and of every process under it
  except the load generator (the server, its stubs, worker processes), read from
  ``/proc/<pid>/schedstat`` (nanoseconds) by the load generator before and after each block of
  200 sequential HTTP requests, the models alternating block by block
  (``bench.load.cpu_interleaved``), divided by the requests;
* throughput with 32 requests in flight from one raw gRPC asyncio client, the models alternating
  in windows of 0.5 s (after 0.2 s of the same load, not counted), six windows each
  (``bench.load.throughput_interleaved``);
* 1 MiB and 16 MiB identity over HTTP, MB/s at p50 of 200 and 40 requests each (a 1 MiB request
  takes about 2 ms here: with 20, as before, the noise reference moved by up to 12%), one request
  to each model in turn, in a new random order each pass
  (``bench.load.large_http_interleaved``).

Each figure is the median over the rounds (3 by default), rounds alternate the model order, and
every figure is also given as a ratio to the plain model's in the same run. The host's load average
is recorded before and after each round: the machine is shared, so compare ratios, not absolute
figures across runs.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from bench import report
from bench._common import ROOT, free_ports, load, load_plain_models
from bench.models import _PLAIN_IDENTITY, _config, identity, write_plain_models
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

KINDS = ("thread", "process", "backend")
# ``plain_ref``/``plain_ref_large`` are the plain models again under other names, measured like
# the others: their ratio to the plain model is what this run can resolve (two identical models
# differed by up to 15% in one run on the 2-core VM), printed next to every kind's ratio.
SMALL = ["plain_dynamic", "plain_ref", *(f"id_{kind}" for kind in KINDS)]
LARGE = ["plain_dynamic_large", "plain_ref_large", *(f"large_{kind}" for kind in KINDS)]
SIZES = {"1MiB": 1 << 20, "16MiB": 16 << 20}
LARGE_COUNTS = {"1MiB": 200, "16MiB": 40}  # per model and round (--quick: 5)
# Lower is better for these figures; higher for the others (throughputs).
LOWER_IS_BETTER = ("http_p50_ms", "grpc_p50_ms", "cpu_us_per_request")
# The targets (issue 30) for instance_kind="backend" and for thread instances: ratio to plain.
TARGETS = {
    "backend": {
        "http_p50_ms": 1.05,
        "grpc_p50_ms": 1.05,
        "cpu_us_per_request": 1.1,
        "grpc32_req_s": 1.0,
        "http_1MiB_mb_s": 0.95,
        "http_16MiB_mb_s": 0.95,
    },
    "thread": {"http_p50_ms": 1.2, "grpc_p50_ms": 1.2, "cpu_us_per_request": 1.5},
}


def write_plain_dynamic(repository: pathlib.Path) -> None:
    """The plain identity models of this benchmark: ``plain_dynamic``, ``plain_dynamic_large`` and their twins.

    Both have the dynamic batcher that every model of the kinds has (pytriton's default config).
    ``bench.models``' ``plain_identity`` and ``plain_large`` have none, which measures the batcher
    rather than the kinds: with 32 requests in flight, and at 1 MiB, where its extra thread
    hand-off per request cost a plain model 0-7% in a scratch run (bench/history.md).
    ``plain_ref`` and ``plain_ref_large`` are the same two again: the run's noise floor.
    """
    batcher = "dynamic_batching { }\n"
    models = {
        "plain_dynamic": _config("plain_dynamic", "16", "TYPE_FP32", 32, batcher),
        "plain_ref": _config("plain_ref", "16", "TYPE_FP32", 32, batcher),
        "plain_dynamic_large": _config("plain_dynamic_large", "-1", "TYPE_UINT8", 1, batcher),
        "plain_ref_large": _config("plain_ref_large", "-1", "TYPE_UINT8", 1, batcher),
    }
    for name, config in models.items():
        model_dir = repository / name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "1" / "model.py").write_text(_PLAIN_IDENTITY)
        (model_dir / "config.pbtxt").write_text(config)


def bind_models(
    triton: Any, small: Tuple[str, Any] = ("id_", identity), large: Tuple[str, Any] = ("large_", identity)
) -> None:
    """A callable under every kind, small (``[16]`` float32, max batch 32) and large (uint8 of any
    length, max batch 1), named prefix + kind; by default the identity (``id_<kind>``, ``large_<kind>``)."""
    for kind in KINDS:
        triton.bind(
            f"{small[0]}{kind}",
            small[1],
            [Tensor(name="INPUT", shape=(16,), dtype=np.float32)],
            [Tensor(name="OUTPUT", shape=(16,), dtype=np.float32)],
            config=ModelConfig(max_batch_size=32),
            instance_kind=kind,
        )
        triton.bind(
            f"{large[0]}{kind}",
            large[1],
            [Tensor(name="INPUT", shape=(-1,), dtype=np.uint8)],
            [Tensor(name="OUTPUT", shape=(-1,), dtype=np.uint8)],
            config=ModelConfig(max_batch_size=1),
            instance_kind=kind,
        )


def _descendants(root: int) -> List[int]:
    """Pids of every live process under ``root`` (``root`` included), from /proc."""
    parents: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return found


def _server_side_pids() -> List[int]:
    """This process and everything under it except load generators (``bench.load``)."""
    pids = []
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"bench.load" in cmdline.read():
                    continue
        except OSError:
            continue
        pids.append(pid)
    return pids


def _round(ports: Dict[str, int], quick: bool, reverse: bool) -> Dict[str, Dict[str, float]]:
    small = SMALL[::-1] if reverse else SMALL
    large = LARGE[::-1] if reverse else LARGE
    count = 300 if quick else 2000
    figures: Dict[str, Dict[str, float]] = {model: {} for model in SMALL}
    for protocol in ("http", "grpc"):
        measured = load(
            {"scenario": "latency_interleaved", "protocol": protocol, "port": ports[protocol], "models": small,
             "count": count, "warmup": 100, "max_s": 200.0},
            timeout_s=300.0,
        )  # fmt: skip
        for model in small:
            figures[model][f"{protocol}_p50_ms"] = measured[model]["p50_ms"]
    measured = load(
        {"scenario": "cpu_interleaved", "protocol": "http", "port": ports["http"], "models": small,
         "pids": _server_side_pids(), "count": count, "block": 200, "warmup": 50, "max_s": 200.0},
        timeout_s=300.0,
    )  # fmt: skip
    for model in small:
        figures[model]["cpu_us_per_request"] = measured[model]["cpu_us_per_request"]
    measured = load(
        {"scenario": "throughput_interleaved", "port": ports["grpc"], "models": small, "concurrency": 32,
         "windows": 2 if quick else 6, "window_s": 0.5, "settle_s": 0.2},
        timeout_s=300.0,
    )  # fmt: skip
    for model in small:
        figures[model]["grpc32_req_s"] = measured[model]["requests_per_s"]
    for size_name, size in SIZES.items():
        measured = load(
            {"scenario": "large_http_interleaved", "port": ports["http"], "models": large, "bytes": size,
             "count": 5 if quick else LARGE_COUNTS[size_name], "max_s": 120.0},
            timeout_s=300.0,
        )  # fmt: skip
        for model in large:
            figures[SMALL[LARGE.index(model)]][f"http_{size_name}_mb_s"] = measured[model]["mb_per_s"]
    return figures


def summarize(rounds: List[Dict[str, Dict[str, float]]]) -> Dict[str, Any]:
    """Medians over the rounds, ratios to the plain model, and the targets each kind meets."""
    medians: Dict[str, Dict[str, float]] = {}
    for model in SMALL:
        medians[model] = {figure: statistics.median(r[model][figure] for r in rounds) for figure in rounds[0][model]}
    plain = medians["plain_dynamic"]
    ratios = {
        model: {figure: value / plain[figure] if plain[figure] else float("nan") for figure, value in figures.items()}
        for model, figures in medians.items()
    }
    checks = []
    for kind, targets in TARGETS.items():
        for figure, bound in targets.items():
            ratio = ratios[f"id_{kind}"][figure]
            met = ratio <= bound if figure in LOWER_IS_BETTER else ratio >= bound
            relation = "<=" if figure in LOWER_IS_BETTER else ">="
            checks.append({"kind": kind, "figure": figure, "ratio": ratio, "target": f"{relation} {bound}", "met": met})
    return {"medians": medians, "ratios": ratios, "targets": checks}


def table(results: Dict[str, Any]) -> str:
    """Markdown: absolute medians, ratios to the plain model, and the targets."""
    figures = list(results["summary"]["medians"]["plain_dynamic"])
    lines = [
        f"Host: {results['host']['cpus']} CPUs, load average before/after each round "
        + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in results["host"]["load_average"])
        + f"; {results['rounds']} rounds, median.",
        "",
        "| model | " + " | ".join(figures) + " |",
        "| --- | " + " | ".join("---:" for _ in figures) + " |",
    ]
    for model, values in results["summary"]["medians"].items():
        lines.append(f"| {model} | " + " | ".join(f"{values[f]:.3f}" for f in figures) + " |")
    lines += ["", "Ratio to the plain backend model (same run):", ""]
    lines += ["| model | " + " | ".join(figures) + " |", "| --- | " + " | ".join("---:" for _ in figures) + " |"]
    for model, values in results["summary"]["ratios"].items():
        lines.append(f"| {model} | " + " | ".join(f"{values[f]:.2f}x" for f in figures) + " |")
    reference = results["summary"]["ratios"].get("plain_ref")
    if reference is not None:
        lines += [
            "",
            "`plain_ref` is the plain model again under another name: its distance from 1.00x is the noise of",
            "this run (" + ", ".join(f"{f} {reference[f]:.2f}x" for f in figures) + ").",
        ]
    lines += ["", "| kind | figure | ratio | target | met |", "| --- | --- | ---: | --- | --- |"]
    for check in results["summary"]["targets"]:
        lines.append(
            f"| {check['kind']} | {check['figure']} | {check['ratio']:.2f}x | {check['target']} | "
            f"{'yes' if check['met'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def run(rounds: int, quick: bool) -> Dict[str, Any]:
    """Serve the plain models and every kind, measure ``rounds`` rounds; returns the results."""
    http_port, grpc_port, metrics_port = free_ports(3)
    ports = {"http": http_port, "grpc": grpc_port}
    measured: List[Dict[str, Dict[str, float]]] = []
    load_average = []
    with tempfile.TemporaryDirectory(prefix="pytriton-bench-kinds-") as directory:
        repository = pathlib.Path(directory)
        write_plain_models(repository)
        write_plain_dynamic(repository)
        config = TritonConfig(
            http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, model_repository=repository
        )
        with Triton(config=config) as triton:
            bind_models(triton)
            started = time.monotonic()
            triton.run()
            load_plain_models(http_port, [*SMALL[:2], *LARGE[:2]], triton.get_access_token())
            print(f"serving after {time.monotonic() - started:.1f} s", flush=True)
            for number in range(rounds):
                before = os.getloadavg()[0]
                measured.append(_round(ports, quick, reverse=bool(number % 2)))
                load_average.append((before, os.getloadavg()[0]))
                print(f"round {number + 1}/{rounds} done (load average {load_average[-1][1]:.2f})", flush=True)
    return {
        "command": "python -m bench.kinds" + (" --quick" if quick else "") + f" --rounds {rounds}",
        "rounds": rounds,
        "host": {"cpus": os.cpu_count(), "load_average": load_average},
        "per_round": measured,
        "summary": summarize(measured),
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kinds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer requests per figure (a smoke run)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    results = run(max(1, args.rounds), args.quick)
    report.write(args.out, "kinds", results, table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
