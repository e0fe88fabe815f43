"""Turn bench results into a Markdown table and a PNG chart."""

from __future__ import annotations

import json
import pathlib
from typing import Any, Dict, List, Optional, Tuple

from bench.models import BUSY_US

# (scenario, metric, label, unit, higher_is_better)
ROWS: List[Tuple[str, str, str, str, bool]] = [
    ("startup", "ready_s", "start-up: process start to model ready", "s", False),
    ("startup", "stop_s", "stop (SIGINT / stop())", "s", False),
    ("latency_http", "p50_ms", "sequential [1,16] fp32, HTTP p50", "ms", False),
    ("latency_http", "p99_ms", "sequential [1,16] fp32, HTTP p99", "ms", False),
    ("latency_grpc", "p50_ms", "sequential [1,16] fp32, gRPC p50", "ms", False),
    ("latency_grpc", "p99_ms", "sequential [1,16] fp32, gRPC p99", "ms", False),
    (
        "latency_http_busy_reference",
        "p50_ms",
        f"reference: plain model busy {BUSY_US} us per batch, HTTP p50",
        "ms",
        False,
    ),
    ("latency_server_side", "queue_us", "sequential: Triton queue time per request (mean)", "us", False),
    ("latency_server_side", "compute_infer_us", "sequential: Triton compute_infer per request (mean)", "us", False),
    ("throughput_http_c8", "requests_per_s", "throughput, HTTP, 8 in flight", "req/s", True),
    ("throughput_http_c32", "requests_per_s", "throughput, HTTP, 32 in flight", "req/s", True),
    ("throughput_grpc_c8", "requests_per_s", "throughput, gRPC, 8 in flight", "req/s", True),
    ("throughput_grpc_c32", "requests_per_s", "throughput, gRPC, 32 in flight", "req/s", True),
    ("large_1mib_http", "mb_per_s", "1 MiB identity, HTTP", "MB/s", True),
    ("large_16mib_http", "mb_per_s", "16 MiB identity, HTTP", "MB/s", True),
    ("large_64mib_http", "mb_per_s", "64 MiB identity, HTTP", "MB/s", True),
    ("dynamic_batching_grpc_c32", "requests_per_s", "dynamic batching, gRPC, 32 in flight", "req/s", True),
    ("dynamic_batching_grpc_c32", "avg_batch_size", "dynamic batching: average batch size", "", True),
    ("streaming_grpc", "responses_per_s", "streaming: responses per second", "resp/s", True),
    ("streaming_grpc", "time_to_first_ms", "streaming: time to first response", "ms", False),
    ("perf_analyzer_http_c1", "p50_ms", "perf_analyzer HTTP, 1 in flight, p50", "ms", False),
    ("perf_analyzer_http_c1", "requests_per_s", "perf_analyzer HTTP, 1 in flight", "req/s", True),
    ("perf_analyzer_grpc_c32", "requests_per_s", "perf_analyzer gRPC, 32 in flight", "req/s", True),
    ("perf_analyzer_grpc_c32", "p50_ms", "perf_analyzer gRPC, 32 in flight, p50", "ms", False),
]


# The data-path targets (issue: bind + proxy), each checked with every tool that measures it.
# (label, limit, kind, [(scenario, metric, tool)]) with kind "ratio" (project/baseline at most
# ``limit``) or "share" (project/baseline at least ``limit``).
TARGETS: List[Tuple[str, float, str, List[Tuple[str, str, str]]]] = [
    ("sequential HTTP p50, [1,16] fp32", 1.5, "ratio", [
        ("perf_analyzer_http_c1", "p50_ms", "perf_analyzer"),
        ("latency_http", "p50_ms", "lean Python HTTP client")]),
    ("gRPC throughput, 32 in flight", 0.70, "share", [
        ("perf_analyzer_grpc_c32", "requests_per_s", "perf_analyzer"),
        ("throughput_grpc_c32", "requests_per_s", "2 Python asyncio client processes")]),
    ("16 MiB identity throughput, HTTP", 0.85, "share", [
        ("large_16mib_http", "mb_per_s", "lean Python HTTP client")]),
]  # fmt: skip


def write(out: pathlib.Path, name: str, results: Dict[str, Any], text: str) -> None:
    """Write ``out/<name>.json`` (``results``) and ``out/<name>.md`` (``text``, the table), and print ``text``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=2))
    (out / f"{name}.md").write_text(text if text.endswith("\n") else text + "\n")
    print(text)


def check_targets(results: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each target with each tool's measured ratio and whether it is met (missing figures are listed as such)."""
    checks: List[Dict[str, Any]] = []
    for label, limit, kind, sources in TARGETS:
        for scenario, metric, tool in sources:
            entry = results["scenarios"].get(scenario, {})
            if "project" not in entry or not entry["baseline"].get(metric):
                checks.append({"target": label, "tool": tool, "ratio": None, "met": None})
                continue
            ratio = entry["project"][metric] / entry["baseline"][metric]
            met = ratio <= limit if kind == "ratio" else ratio >= limit
            checks.append({"target": label, "tool": tool, "ratio": ratio, "limit": limit, "kind": kind, "met": met})
    return checks


def targets_table(checks: List[Dict[str, Any]]) -> str:
    """Markdown table of :func:`check_targets`."""
    lines = ["| target | measured with | pytriton / baseline | limit | met |", "| --- | --- | ---: | ---: | --- |"]
    for check in checks:
        if check["ratio"] is None:
            lines.append(f"| {check['target']} | {check['tool']} | not measured | | |")
            continue
        if check["kind"] == "ratio":
            value, limit = f"{check['ratio']:.2f}x", f"at most {check['limit']}x"
        else:
            value, limit = f"{check['ratio'] * 100:.0f}%", f"at least {check['limit'] * 100:.0f}%"
        lines.append(f"| {check['target']} | {check['tool']} | {value} | {limit} | {'yes' if check['met'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}"


def _host_lines(probe: Optional[Dict[str, Any]]) -> List[str]:
    """One line on the host's state, which moves every sequential-latency ratio (bench/host.py)."""
    if not probe:
        return []
    before, after = probe.get("before", {}), probe.get("after", {})
    return [
        "Host state: round trip between two processes after 500 us idle, on two CPUs / one CPU: "
        f"{before.get('wake_rtt_us')} / {before.get('same_cpu_rtt_us')} us before the runs, "
        f"{after.get('wake_rtt_us')} / {after.get('same_cpu_rtt_us')} us after; "
        f"CPU time stolen by the hypervisor: {probe.get('steal_percent')}%.",
        "",
    ]


def table(results: Dict[str, Any]) -> str:
    """Markdown table: each project figure next to the baseline's, with the ratio."""
    env = results["environment"]
    lines = [
        f"Command: `{results['command']}`; {env['time']}; pytriton {env['pytriton']}, tritonserver {env['tritonserver']}, "
        f"Python {env['python']}, numpy {env['numpy']}, {env['cpu_count']} CPUs ({env['machine']}).",
        "",
        "Baseline: a plain Python-backend model doing the same work inside Triton's stub (no second process), "
        "served by the same tritonserver in the same run.",
        "",
        *_host_lines(results.get("host")),
        "| scenario | pytriton | plain Python backend | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    scenarios = results["scenarios"]
    for scenario, metric, label, unit, higher_is_better in ROWS:
        entry = scenarios.get(scenario)
        if not entry or "error" in entry or metric not in entry.get("project", {}):
            continue
        project, baseline = entry["project"][metric], entry["baseline"][metric]
        if higher_is_better:
            ratio = f"{project / baseline * 100:.0f}% of baseline" if baseline else "n/a"
        else:
            ratio = f"{project / baseline:.3g}x baseline" if baseline else "n/a"
        lines.append(f"| {label} | {_fmt(project)} {unit} | {_fmt(baseline)} {unit} | {ratio} |")
    for protocol in ("http", "grpc"):
        entry = scenarios.get(f"client_overhead_{protocol}")
        if entry:
            lines.append(
                f"| ModelClient.infer_sample vs raw tritonclient, {protocol.upper()} p50 | "
                f"{_fmt(entry['model_client_p50_ms'])} ms | {_fmt(entry['raw_p50_ms'])} ms (raw client) | "
                f"{entry['overhead_us']:+.0f} us per call |"
            )
    for name, entry in scenarios.items():
        if isinstance(entry, dict) and "error" in entry:
            lines.append(f"| {name} | not measured: {entry['error'][:200]} | | |")
    return "\n".join(lines) + "\n"


# The in-process scenarios (bench/inprocess.py): (path, model, called through).
_PLAIN = "plain Python-backend identity"
_BOUND = "`@batch` identity bound with `Triton.bind`"
INPROCESS_ROWS: List[Tuple[str, str, str]] = [
    ("plain_http", _PLAIN, "HTTP to `tritonserver` (**baseline**)"),
    ("plain_grpc", _PLAIN, "gRPC to `tritonserver`"),
    ("plain_inprocess", _PLAIN, "in-process: `pytriton.inprocess.Server`, `Model.infer`"),
    ("bound_http", _BOUND, "HTTP to `tritonserver`"),
    ("bound_grpc", _BOUND, "gRPC to `tritonserver`"),
    ("bound_embedded", _BOUND, "in-process: `Triton(embedded=True)`, `Model.infer`"),
    ("bound_embedded_client", _BOUND, "in-process: `Triton(embedded=True)`, `InProcessModelClient.infer_batch`"),
]


def inprocess_table(results: Dict[str, Any]) -> str:
    """Markdown table of the in-process scenarios: each path's figures and its ratios to the baseline.

    ``results`` holds ``environment``, ``command`` and ``inprocess`` (what
    ``bench.inprocess.run_scenarios`` returns); a path that was not measured is left out.
    """
    env, section = results["environment"], results["inprocess"]
    summary = section["summary"]
    concurrency = section.get("concurrency", 32)
    lines = [
        f"Command: `{results['command']}`; {env['time']}; pytriton {env['pytriton']}, tritonserver "
        f"{env['tritonserver']}, Python {env['python']}, numpy {env['numpy']}, {env['cpu_count']} CPUs "
        f"({env['machine']}); median of {len(section.get('rounds', []))} round(s).",
        "",
        *_host_lines(results.get("host")),
        f"| model | called through | sequential p50 | sequential p99 | p50 / baseline | {concurrency} in flight "
        "| throughput / baseline |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for path, model, through in INPROCESS_ROWS:
        figures = summary.get(path)
        if not figures or "p50_ms" not in figures:
            continue
        ratio = f"{figures['p50_ratio']:.2f}x" if "p50_ratio" in figures else "n/a"
        rate = f"{_fmt(figures['requests_per_s'])} req/s" if "requests_per_s" in figures else "n/a"
        share = f"{figures['throughput_share'] * 100:.0f}%" if "throughput_share" in figures else "n/a"
        lines.append(
            f"| {model} | {through} | {_fmt(figures['p50_ms'])} ms | {_fmt(figures['p99_ms'])} ms | {ratio} "
            f"| {rate} | {share} |"
        )
    return "\n".join(lines) + "\n"


def chart(results: Dict[str, Any], path: pathlib.Path) -> None:
    """Bar charts of latency and throughput, project vs baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = results["scenarios"]
    panels = [
        ("Sequential latency p50 (ms, lower is better)", [
            ("HTTP", "latency_http", "p50_ms"), ("gRPC", "latency_grpc", "p50_ms")]),
        ("Throughput (req/s, higher is better)", [
            ("HTTP c8", "throughput_http_c8", "requests_per_s"), ("HTTP c32", "throughput_http_c32", "requests_per_s"),
            ("gRPC c8", "throughput_grpc_c8", "requests_per_s"), ("gRPC c32", "throughput_grpc_c32", "requests_per_s")]),
        ("Large tensors, HTTP (MB/s, higher is better)", [
            ("1 MiB", "large_1mib_http", "mb_per_s"), ("16 MiB", "large_16mib_http", "mb_per_s"),
            ("64 MiB", "large_64mib_http", "mb_per_s")]),
    ]  # fmt: skip
    figure, axes = plt.subplots(1, len(panels), figsize=(15, 4.5))
    for axis, (title, items) in zip(axes, panels):
        present = [(label, scenarios[s]) for label, s, _ in items if s in scenarios and "project" in scenarios[s]]
        metrics = [metric for _, s, metric in items if s in scenarios and "project" in scenarios[s]]
        positions = range(len(present))
        axis.bar(
            [p - 0.2 for p in positions],
            [e["project"][m] for (_, e), m in zip(present, metrics)],
            0.4,
            label="pytriton",
        )
        axis.bar(
            [p + 0.2 for p in positions],
            [e["baseline"][m] for (_, e), m in zip(present, metrics)],
            0.4,
            label="plain Python backend",
        )
        axis.set_xticks(list(positions))
        axis.set_xticklabels([label for label, _ in present])
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=8)
    env = results["environment"]
    figure.suptitle(
        f"pytriton vs plain Python backend, same tritonserver {env['tritonserver']}, "
        f"{env['cpu_count']} CPUs, {env['time']}",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
