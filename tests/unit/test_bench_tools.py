"""The benchmark's helpers: trace splitting, the host-state line, interleaving, the instance scenarios' summary (no server)."""

from __future__ import annotations

import time

from bench import report, trace_request

# A hand-written tracefs excerpt for one pytriton request: client (pid 100) -> Triton (pid 200)
# -> stub (pid 300) -> worker (pid 400) -> stub -> Triton -> client. Times in seconds.
_TRACE = """\
          python-100   [001] ...1. 10.000000: tracing_mark_write: REQ_START 0
          python-100   [001] d..2. 10.000050: sched_switch: prev_comm=python prev_pid=100 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
    tritonserver-200   [000] d..2. 10.000110: sched_waking: comm=triton_python_b pid=300 prio=120 target_cpu=000
 triton_python_b-300   [000] d..2. 10.000150: sched_waking: comm=kworker/0:1 pid=9 prio=120 target_cpu=000
 triton_python_b-300   [000] d..3. 10.000170: sched_waking: comm=python pid=400 prio=120 target_cpu=001
          python-400   [001] d..2. 10.000240: sched_switch: prev_comm=python prev_pid=400 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
 triton_python_b-300   [000] d..2. 10.000280: sched_waking: comm=tritonserver pid=201 prio=120 target_cpu=001
    tritonserver-200   [000] d.s5. 10.000340: sched_waking: comm=python pid=100 prio=120 target_cpu=001
          python-100   [001] ...1. 10.000420: tracing_mark_write: REQ_END 0
"""


def test_a_traced_request_is_split_into_its_segments() -> None:
    (request,) = trace_request.requests(_TRACE)
    got = {name.strip(): round(value) for name, value in trace_request.segments(request).items()}
    assert got == {
        "total": 420,
        "client send": 50,
        "Triton in": 60,
        "stub, all": 170,
        "stub before the hand-off": 60,  # the kernel thread woken first is not taken for the worker
        "worker in the user's process": 70,
        "stub after the reply": 40,
        "Triton out": 60,
        "client receive": 80,
    }


def test_a_plain_model_has_no_worker_segment() -> None:
    lines = [line for line in _TRACE.splitlines() if "pid=400" not in line and "prev_pid=400" not in line]
    (request,) = trace_request.requests("\n".join(lines))
    names = {name.strip() for name in trace_request.segments(request)}
    assert "stub, all" in names
    assert "worker in the user's process" not in names


def test_the_report_states_the_host_conditions() -> None:
    lines = report._host_lines(
        {
            "before": {"wake_rtt_us": 50.5, "same_cpu_rtt_us": 12.0},
            "after": {"wake_rtt_us": 80.0, "same_cpu_rtt_us": 20.0},
            "steal_percent": 9.5,
        }
    )
    assert "50.5 / 12.0 us before" in lines[0]
    assert "80.0 / 20.0 us after" in lines[0]
    assert "9.5%" in lines[0]
    assert report._host_lines(None) == []


def test_sequential_latency_alternates_blocks_between_models(monkeypatch) -> None:
    from bench import load

    order: list = []
    monkeypatch.setattr(load, "_sequential_call", lambda protocol, port, model: lambda: order.append(model))
    result = load.latency_interleaved(
        {"protocol": "http", "port": 1, "models": ["a", "b"], "warmup": 3, "block": 5, "count": 12}
    )
    measured = order[6:]  # after 3 warm-up calls per model
    blocks = [measured[i : i + 5] for i in range(0, len(measured), 5)]
    assert [block[0] for block in blocks] == ["a", "b", "b", "a", "a", "b"]
    assert all(len(set(block)) == 1 for block in blocks)
    assert result["a"]["count"] == result["b"]["count"] == 15


def test_large_requests_go_to_each_model_in_turn(monkeypatch) -> None:
    from bench import load

    order: list = []

    class FakeHttp:
        def __init__(self, port, model, array, datatype):
            assert (port, datatype, array.nbytes) == (1, "UINT8", 4096)
            self.model = model

        def call(self):
            order.append(self.model)

    monkeypatch.setattr(load, "LeanHttp", FakeHttp)
    spec = {"port": 1, "models": ["a", "b", "c", "d"], "bytes": 4096, "count": 40}
    result = load.large_http_interleaved(spec)
    measured = order[8:]  # after 2 warm-up calls each
    passes = [measured[i : i + 4] for i in range(0, len(measured), 4)]
    assert len(passes) == 40 and all(sorted(one) == ["a", "b", "c", "d"] for one in passes)  # each model once a pass
    assert all(first != second for first, second in zip(measured, measured[1:])), "a model was asked twice in a row"
    assert len({tuple(one) for one in passes}) > 4, "the order does not change between passes"
    assert {one[0] for one in passes} == set("abcd")  # every model takes the first place, among others
    for model in "abcd":
        assert result[model]["count"] == 40 and result[model]["mb_per_s"] > 0
    order.clear()
    load.large_http_interleaved(spec)
    assert order[8:] == measured, "the order is not the same from one run to the next (seeded)"


def test_throughput_alternates_windows_between_models_and_never_overlaps_them(monkeypatch) -> None:
    import asyncio

    import tritonclient.grpc.aio as grpc_aio

    from bench import load

    calls: list = []  # (model, started, ended) of every request
    in_flight = {"now": 0, "most": 0, "models": set()}

    class FakeClient:
        def __init__(self, url):
            assert url == "127.0.0.1:7"
            self.closed = False

        async def infer(self, model, inputs):
            in_flight["models"].add(model)
            assert in_flight["models"] == {model}, "a window began before the previous model's requests ended"
            in_flight["now"] += 1
            in_flight["most"] = max(in_flight["most"], in_flight["now"])
            started = time.monotonic()
            await asyncio.sleep(0.002 if model == "a" else 0.01)  # b serves a fifth as many requests
            in_flight["now"] -= 1
            if not in_flight["now"]:
                in_flight["models"].clear()
            calls.append((model, started, time.monotonic()))

        async def close(self):
            self.closed = True

    monkeypatch.setattr(grpc_aio, "InferenceServerClient", FakeClient)
    result = load.throughput_interleaved(
        {"port": 7, "models": ["a", "b"], "concurrency": 4, "windows": 3, "window_s": 0.1, "settle_s": 0.02}
    )
    runs = [calls[0][0]]
    for model, _, _ in calls[1:]:
        if model != runs[-1]:
            runs.append(model)
    assert runs == ["a", "b", "a", "b"]  # a b | b a | a b: the order reverses every pass, adjacent runs merge
    assert in_flight["most"] == 4
    assert len(result["a"]["windows"]) == len(result["b"]["windows"]) == 3
    # 4 in flight for 0.1 s: at most about 200 (a) and 40 (b) requests per window
    assert all(0 < rate <= 4 / 0.002 * 1.05 for rate in result["a"]["windows"])
    assert all(0 < rate <= 4 / 0.01 * 1.05 for rate in result["b"]["windows"])
    assert result["a"]["requests_per_s"] > result["b"]["requests_per_s"]


def test_cpu_per_request_charges_each_block_to_its_model_in_alternating_order(monkeypatch) -> None:
    from bench import load

    order: list = []
    clock = {"ns": 0}
    cost_ns = {"a": 1000, "b": 3000}  # what one request to each model costs the server

    def call_of(protocol, port, model):
        def call():
            order.append(model)
            clock["ns"] += cost_ns[model]

        return call

    class FakeClock:
        def __init__(self, pids):
            assert pids == [11, 12]

        def read(self):
            return clock["ns"]

    monkeypatch.setattr(load, "_sequential_call", call_of)
    monkeypatch.setattr(load, "_CpuClock", FakeClock)
    result = load.cpu_interleaved(
        {"port": 1, "models": ["a", "b"], "pids": ["11", "12"], "warmup": 2, "block": 4, "count": 8}
    )
    blocks = [order[4:][i : i + 4] for i in range(0, len(order) - 4, 4)]
    assert [block[0] for block in blocks] == ["a", "b", "b", "a"] and all(len(set(b)) == 1 for b in blocks)
    assert result == {"a": {"cpu_us_per_request": 1.0, "count": 8}, "b": {"cpu_us_per_request": 3.0, "count": 8}}


def test_the_cpu_clock_counts_every_thread_and_keeps_the_time_of_threads_that_ended() -> None:
    import os
    import pathlib
    import threading

    from bench import load

    def main_thread_ns():
        return int(pathlib.Path(f"/proc/{os.getpid()}/schedstat").read_text().split()[0])

    clock = load._CpuClock([os.getpid(), 2**22 + 12345])  # the second: no such process, ignored
    start, main_start = clock.read(), main_thread_ns()
    release = threading.Event()
    worker = threading.Thread(target=lambda: (sum(range(3_000_000)), release.wait(10)))
    worker.start()
    try:
        time.sleep(0.3)  # the worker has done its sum and waits
        during = clock.read()
        assert during - start > main_thread_ns() - main_start  # the worker's time is in it
    finally:
        release.set()
        worker.join(10)
    assert clock.read() >= during  # the worker ended: its time stays counted


def test_memory_probe_reads_rss_and_sees_a_shared_segment() -> None:
    import mmap
    import os

    from bench import memory

    assert memory._status_kib(os.getpid(), "VmRSS")["VmRSS"] > 0
    path = f"/dev/shm/pytriton-{os.getpid()}-benchtest"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 4 << 20)
        first, second = mmap.mmap(fd, 4 << 20), mmap.mmap(fd, 4 << 20)
        first[:] = b"\x01" * (4 << 20)  # 4 MiB resident, seen through two mappings
        second[0]
        seen: dict = {}
        memory._shared_by_inode(os.getpid(), seen)
        assert seen[os.fstat(fd).st_ino] >= 4 * 1024  # KiB, at least once
        first.close()
        second.close()
    finally:
        os.close(fd)
        os.unlink(path)


def _round(scale: float) -> dict:
    return {
        "plain_http": {"p50_ms": 1.0 * scale, "p99_ms": 2.0 * scale, "requests_per_s": 1000.0 / scale},
        "bound_embedded": {"p50_ms": 0.5 * scale, "p99_ms": 1.0 * scale, "requests_per_s": 1500.0 / scale},
    }


def test_inprocess_figures_are_medians_over_rounds_with_ratios_to_the_plain_http_baseline() -> None:
    from bench import inprocess

    rounds = [_round(1.0), _round(3.0), _round(2.0)]
    rounds[1]["plain_grpc"] = {"p50_ms": 4.0}  # measured in one round only, without throughput
    summary = inprocess.summarize(rounds)
    assert summary["plain_http"] == {
        "p50_ms": 2.0,
        "p99_ms": 4.0,
        "requests_per_s": 500.0,
        "p50_ratio": 1.0,
        "throughput_share": 1.0,
    }
    assert summary["bound_embedded"]["p50_ms"] == 1.0 and summary["bound_embedded"]["p50_ratio"] == 0.5
    assert summary["bound_embedded"]["throughput_share"] == 1.5
    assert summary["plain_grpc"] == {"p50_ms": 4.0, "p50_ratio": 2.0}
    # Without a baseline there is nothing to divide by.
    assert "p50_ratio" not in inprocess.summarize([{"bound_embedded": {"p50_ms": 1.0}}])["bound_embedded"]


def test_the_inprocess_table_lists_each_measured_path_with_its_ratios() -> None:
    from bench import inprocess

    results = {
        "environment": {"time": "T", "pytriton": "0", "tritonserver": "2.51.0", "python": "3.11", "numpy": "2",
                        "cpu_count": 2, "machine": "x86_64"},
        "command": "python -m bench.inprocess",
        "inprocess": {"rounds": [_round(1.0)], "summary": inprocess.summarize([_round(1.0)]), "concurrency": 32},
    }  # fmt: skip
    table = report.inprocess_table(results)
    rows = [line for line in table.splitlines() if line.startswith("| plain") or line.startswith("| `@batch`")]
    assert len(rows) == 2  # paths that were not measured are left out
    assert "HTTP to `tritonserver` (**baseline**) | 1.000 ms | 2.000 ms | 1.00x | 1,000 req/s | 100% |" in rows[0]
    assert "`Triton(embedded=True)`, `Model.infer` | 0.500 ms | 1.000 ms | 0.50x | 1,500 req/s | 150% |" in rows[1]
    assert "32 in flight" in table and "median of 1 round(s)" in table


def test_the_inprocess_load_loops_are_bounded_and_report_failures() -> None:
    import itertools

    import pytest

    from bench import inprocess_child

    calls = {"a": [], "b": []}
    counter = itertools.count()
    result = inprocess_child.sequential_interleaved(
        {name: (lambda sink=sink: sink.append(next(counter))) for name, sink in calls.items()},
        count=12, block=5, warmup=2,
    )  # fmt: skip
    assert result["a"]["count"] == result["b"]["count"] == 15  # whole blocks
    assert calls["a"][2:7] == list(range(4, 9))  # after both warm-ups, a's first block comes first
    measured = inprocess_child.in_flight(lambda: None, concurrency=4, duration_s=0.2, warmup_s=0.05)
    assert measured["requests_per_s"] > 0 and measured["count"] > 0

    def fails() -> None:
        raise ValueError("broken model")

    with pytest.raises(ValueError, match="broken model"):
        inprocess_child.in_flight(fails, concurrency=4, duration_s=0.2, warmup_s=0.0)


def test_instance_figures_are_medians_with_speedups_and_the_process_p50_ratio() -> None:
    import pytest

    from bench import instances

    def one(scale: float) -> dict:
        return {
            "cpu_t1": {"requests_per_s": 100.0 * scale},
            "cpu_t2": {"requests_per_s": 100.0 * scale},
            "cpu_p1": {"requests_per_s": 100.0 * scale},
            "cpu_p2": {"requests_per_s": 190.0 * scale},
            "id_thread": {"p50_ms": 1.0 * scale, "p99_ms": 2.0},
            "id_process": {"p50_ms": 0.9 * scale, "p99_ms": 2.0},
        }

    summary = instances.summarize([one(1.0), one(3.0), one(2.0)])
    assert summary["cpu_t2"] == {"requests_per_s": 200.0, "speedup": 1.0}
    assert summary["cpu_p2"]["speedup"] == pytest.approx(1.9) and summary["cpu_p1"]["vs_thread"] == 1.0
    assert summary["id_process"]["p50_ratio"] == pytest.approx(0.9)
    results = {
        "environment": {"time": "T", "pytriton": "0", "tritonserver": "2.51.0", "python": "3.11", "numpy": "2",
                        "cpu_count": 2, "machine": "x86_64"},
        "command": "python -m bench --only instances",
        "instances": {"rounds": [one(1.0)], "summary": instances.summarize([one(1.0)]), "concurrency": 8,
                      "loop_ms": 2.0},
    }  # fmt: skip
    table = instances.table(results)
    assert "| CPU-bound ~2 ms, 2 process instances | 190 req/s | 1.90x |" in table
    assert "| identity [1,16] fp32, 1 process instance |  |  | 0.900 ms | 2.000 ms | 0.90x |" in table
    assert "8 in flight" in table and "took 2.00 ms" in table


def test_the_cpu_bound_instance_model_answers_with_its_input() -> None:
    import numpy as np

    from bench import instances

    array = np.arange(32, dtype=np.float32).reshape(2, 16)
    assert instances.cpu_work([{"INPUT": array}])[0]["OUTPUT"] is array
    assert instances.loop_ms(repeats=1) > 0


def test_openai_bench_summary_takes_medians_and_compares_to_direct_grpc() -> None:
    from bench import openai as openai_bench

    def round_(direct: float, frontend: float, ttft_direct: float, ttft: float) -> dict:
        paths = {"grpc_direct": direct, "grpc_direct_stream": ttft_direct}
        for name in ("openai_grpc", "openai_inprocess"):
            paths[name], paths[f"{name}_stream"] = frontend, ttft
        return {name: {"p50_ms": value, "p99_ms": 2 * value} for name, value in paths.items()}

    rounds = [round_(1.0, 1.2, 2.0, 2.5), round_(1.0, 1.6, 2.0, 4.0), round_(2.0, 1.3, 2.0, 2.8)]
    summary = openai_bench.summarize(rounds)
    assert summary["paths"]["openai_grpc"]["p50_ms"] == 1.3 and summary["paths"]["grpc_direct"]["p50_ms"] == 1.0
    comparison = summary["comparisons"]["openai_grpc"]
    assert abs(comparison["p50_ratio"] - 1.3) < 1e-9 and comparison["p50_goal_met"]
    assert abs(comparison["p50_ratio_per_round"] - 1.2) < 1e-9  # of 1.2, 1.6 and 0.65
    assert abs(comparison["ttft_extra_ms"] - 0.8) < 1e-9 and comparison["ttft_goal_met"]
    text = openai_bench.table({"summary": summary, "count_per_round": 10, "quick": False})
    assert "| openai_grpc | 1.30x met | 1.20x | 0.300 ms | +0.800 ms met |" in text
    assert "against_openai_grpc" not in summary["comparisons"]


def test_openai_bench_against_another_checkout_compares_it_to_its_own_direct_grpc() -> None:
    from bench import openai as openai_bench

    def round_(direct: float, other_direct: float, other: float) -> dict:
        paths = {"grpc_direct": direct, "grpc_direct_stream": 2.0}
        for name in ("openai_grpc", "openai_inprocess"):
            paths[name], paths[f"{name}_stream"] = 1.1, 2.1
        paths.update({"against_grpc_direct": other_direct, "against_grpc_direct_stream": 3.0})
        paths.update({"against_openai_grpc": other, "against_openai_grpc_stream": 3.5})
        return {name: {"p50_ms": value, "p99_ms": value} for name, value in paths.items()}

    summary = openai_bench.summarize([round_(1.0, 2.0, 3.0), round_(1.0, 2.0, 2.8), round_(1.0, 2.0, 3.2)])
    against = summary["comparisons"]["against_openai_grpc"]
    assert abs(against["p50_ratio"] - 1.5) < 1e-9 and not against["p50_goal_met"]
    assert abs(against["ttft_extra_ms"] - 0.5) < 1e-9
    assert abs(summary["comparisons"]["openai_grpc"]["p50_ratio"] - 1.1) < 1e-9
    text = openai_bench.table({"summary": summary, "count_per_round": 10, "quick": False})
    assert "| against_openai_grpc | 1.50x NOT met | 1.50x | 1.000 ms | +0.500 ms met |" in text


def test_kinds_summary_takes_medians_ratios_to_plain_and_checks_the_targets():
    from bench import kinds

    def round_(scale):
        figures = {"http_p50_ms": 1.0, "grpc_p50_ms": 1.0, "cpu_us_per_request": 100.0, "grpc32_req_s": 1000.0,
                   "http_1MiB_mb_s": 100.0, "http_16MiB_mb_s": 100.0}  # fmt: skip
        result = {model: dict(figures) for model in kinds.SMALL}
        result["id_backend"] = {name: value * scale for name, value in figures.items()}
        result["id_thread"] = {name: value * 2 for name, value in figures.items()}
        return result

    summary = kinds.summarize([round_(1.0), round_(1.04), round_(3.0)])  # median 1.04: the outlier is ignored
    assert abs(summary["ratios"]["id_backend"]["http_p50_ms"] - 1.04) < 1e-9
    met = {(c["kind"], c["figure"]): c["met"] for c in summary["targets"]}
    assert met[("backend", "http_p50_ms")]  # <= 1.05
    assert met[("backend", "cpu_us_per_request")] and not met[("thread", "http_p50_ms")]  # 2.0 > 1.2
    assert met[("backend", "grpc32_req_s")] and met[("backend", "http_16MiB_mb_s")]  # higher is better
    text = kinds.table({"summary": summary, "rounds": 3, "host": {"cpus": 2, "load_average": [(1.0, 2.0)] * 3}})
    assert "| id_backend |" in text and "1.04x" in text and "1.00/2.00" in text
    assert "noise of\nthis run (http_p50_ms 1.00x" in text  # plain_ref: the same model again


def test_gpu_kinds_summary_takes_medians_and_ratios_of_the_models_that_answered_right():
    from bench import gpu_kinds

    def round_(p50: float) -> dict:
        figures = {"http_p50_ms": 0.5, "http_1MiB_mb_s": 400.0, "http_16MiB_mb_s": 250.0}
        result = {model: dict(figures) for model in gpu_kinds.SMALL if model != "gpu_process"}
        result["gpu_backend"]["http_p50_ms"] = p50
        return result

    summary = gpu_kinds.summarize([round_(0.6), round_(0.55), round_(2.0)])  # median 0.6: the outlier is ignored
    assert "gpu_process" not in summary["medians"]  # it answered wrong, so it was never measured
    assert abs(summary["ratios"]["gpu_backend"]["http_p50_ms"] - 1.2) < 1e-9
    assert summary["ratios"]["gpu_thread"] == {"http_p50_ms": 1.0, "http_1MiB_mb_s": 1.0, "http_16MiB_mb_s": 1.0}
    results = {
        "environment": {"device": "cuda", "device_name": "GPU X", "torch": "2.0", "python": "3.12", "cpus": 16},
        "load_average": [(1.0, 2.0)],
        "rounds": 3,
        "command": "python -m bench.gpu_kinds",
        "answers": {"plain_gpu": None, "gpu_process": "wrong answer: array([0.])"},
        "summary": summary,
    }
    text = gpu_kinds.table(results)
    assert "GPU X (`--device cuda`)" in text and "| plain_gpu | right |" in text
    assert "| gpu_process | wrong answer: array([0.]) |" in text
    assert "| gpu_backend | 1.20x | 1.00x | 1.00x |" in text


def test_gpu_kinds_plain_model_does_the_work_of_the_bound_callables(tmp_path):
    from bench import gpu_kinds

    gpu_kinds.write_plain_models(tmp_path, "cuda:1")
    small = (tmp_path / "plain_gpu" / "1" / "model.py").read_text()
    large = (tmp_path / "plain_gpu_large" / "1" / "model.py").read_text()
    assert "torch.device('cuda:1')" in small and "y = x * 2" in small and "y = x + 1" in large
    compile(small, "model.py", "exec")  # the template renders to valid Python
    assert "dynamic_batching" in (tmp_path / "plain_gpu" / "config.pbtxt").read_text()
    assert "max_batch_size: 1" in (tmp_path / "plain_gpu_large" / "config.pbtxt").read_text()


def test_the_bench_modules_import_each_other_without_a_cycle_and_none_imports_the_entry_point() -> None:
    # bench/__main__.py is only the entry point (`python -m bench`); the scenarios share their helpers
    # through bench/_common.py. Read statically, so that no benchmark module needs to be importable here.
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "bench"
    names = {path.stem for path in root.glob("*.py")}
    graph = {}
    for path in root.glob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "bench":
                imported.update(alias.name for alias in node.names if alias.name in names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench."):
                imported.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                imported.update(a.name.split(".")[1] for a in node.names if a.name.startswith("bench."))
        graph[path.stem] = imported & names
    assert not [name for name, imported in graph.items() if "__main__" in imported], graph

    def cycle_from(start, node, seen):
        for nxt in graph[node]:
            if nxt == start:
                return True
            if nxt not in seen:
                seen.add(nxt)
                if cycle_from(start, nxt, seen):
                    return True
        return False

    assert [name for name in graph if cycle_from(name, name, set())] == []
