"""The benchmark's helpers: trace splitting, the host-state line, the cold-path probe, interleaving (no server)."""

from __future__ import annotations

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


def test_the_cold_path_probe_times_every_step_of_a_real_exchange() -> None:
    from bench import cold_path

    results = cold_path.measure(rounds=5, gap_us=50)
    assert set(results) == {
        "request over the socket (send + receive)",
        "decode into Request objects",
        "the callable (identity)",
        "check + encode the outputs",
        "reply over the socket (send + receive)",
        "whole exchange",
    }
    for figures in results.values():
        assert figures["hot"] > 0 and figures["after_idle"] > 0


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
