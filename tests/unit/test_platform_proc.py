"""The one /proc reader (pytriton/_platform/proc.py) on a fake tree, and once on the real one."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading
import time

from pytriton._platform import proc


def _process(root: pathlib.Path, pid: int, comm: str, state: str, ppid: int, pgid: int, argv: list) -> None:
    entry = root / str(pid)
    entry.mkdir()
    # fields 3.. : state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
    # priority nice num_threads itrealvalue starttime (22) ...
    rest = [state, str(ppid), str(pgid)] + ["0"] * 16 + [str(1000 + pid)] + ["0"] * 30
    (entry / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
    (entry / "cmdline").write_bytes(b"\0".join(word.encode() for word in argv) + (b"\0" if argv else b""))
    (entry / "status").write_text(f"Name:\t{comm}\nVmData:\t    2048 kB\nSeccomp:\t2\n")


def _tree(tmp_path: pathlib.Path) -> str:
    _process(tmp_path, 10, "tritonserver", "S", 1, 10, ["/opt/tritonserver", "--model-repository=/r"])
    _process(tmp_path, 11, "odd) name (x", "S", 10, 10, ["/b/triton_python_backend_stub", "/r/m/1/model.py", "pfx-m_0"])
    _process(tmp_path, 12, "triton_python_b", "Z", 10, 10, [])  # a zombie: empty command line
    _process(tmp_path, 13, "other", "T", 2, 13, ["sleep", "60"])
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "task").mkdir()
    for task in (10, 14):
        (tmp_path / "self" / "task" / str(task)).mkdir()
    (tmp_path / "sys" / "kernel" / "yama").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "yama" / "ptrace_scope").write_text("1\n")
    (tmp_path / "not-a-pid").mkdir()
    return str(tmp_path)


def test_stat_splits_after_the_last_parenthesis(tmp_path):
    root = _tree(tmp_path)
    info = proc.stat(11, root)
    assert info == proc.Stat("S", 10, 10, 1011) and info.running
    assert proc.stat_fields(11, root)[: proc.PGID + 1] == ["S", "10", "10"]
    assert proc.stat(12, root).running is False  # zombie
    assert proc.stat(99, root) is None and proc.stat_fields(99, root) == []  # gone


def test_status_cmdline_and_kernel_settings(tmp_path):
    root = _tree(tmp_path)
    assert proc.status_int(10, "VmData", root) == 2048 and proc.status_int(10, "Seccomp", root) == 2
    assert proc.status_field(10, "Missing", root) is None and proc.status_int(99, "VmData", root) is None
    assert proc.cmdline(11, root) == ["/b/triton_python_backend_stub", "/r/m/1/model.py", "pfx-m_0"]
    assert proc.cmdline(12, root) == [] and proc.cmdline(99, root) is None
    assert proc.program_is(11, "triton_python_backend_stub", root)
    assert not proc.program_is(12, "triton_python_backend_stub", root)  # empty argv
    assert proc.kernel_int("kernel/yama/ptrace_scope", root) == 1
    assert proc.kernel_int("kernel/missing", root) is None


def test_scans_children_groups_and_tasks(tmp_path):
    root = _tree(tmp_path)
    assert sorted(proc.pids(root)) == [10, 11, 12, 13]
    assert sorted(proc.children(10, root)) == [11, 12]
    assert proc.children(10, root, running_only=True) == [11]
    assert sorted(proc.group_members(10, root)) == [10, 11]  # the zombie does not count
    assert proc.tasks(str(tmp_path / "self" / "task")) == {10, 14}
    assert proc.tasks(str(tmp_path / "missing")) is None
    assert proc.pids(str(tmp_path / "missing")) == []


def test_the_real_proc_agrees_with_os():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # Between fork and exec the child's cmdline is not yet its own: wait (bounded) for the exec.
        deadline = time.monotonic() + 10.0
        while not proc.cmdline(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        info = proc.stat(child.pid)
        assert info is not None and info.ppid == os.getpid()
        assert child.pid in proc.children(os.getpid())
        assert proc.cmdline(child.pid)[0] == sys.executable
        assert proc.owner(child.pid) == os.geteuid()
        assert proc.stat("self").pgid == os.getpgrp()
    finally:
        child.kill()
        child.wait()


def test_meminfo_in_bytes(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nHugePages_Total:       0\nSwapTotal:  1000 kB\n")
    assert proc.meminfo(str(path)) == {
        "MemTotal": 24_000_000 * 1024,
        "MemFree": 100 * 1024,
        "HugePages_Total": 0,
        "SwapTotal": 1000 * 1024,
    }
    assert proc.meminfo(str(tmp_path / "missing")) == {}
    assert proc.meminfo()["MemTotal"] > 0  # the real one


def test_syscall_words_of_a_thread_and_none_once_gone(tmp_path):
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "syscall").write_text("202 0x7f00 0x189 0x0 0x0 0x0 0xffffffff 0x7ffd 0x7f01\n")
    assert proc.syscall(7, str(tmp_path)) == [
        "202",
        "0x7f00",
        "0x189",
        "0x0",
        "0x0",
        "0x0",
        "0xffffffff",
        "0x7ffd",
        "0x7f01",
    ]
    assert proc.syscall(8, str(tmp_path)) is None
    # A thread of this process reads its own threads': this one is in the read() of that very file.
    words = proc.syscall(threading.get_native_id(), proc.TASK_DIR)
    assert words and words[0].lstrip("-").isdigit()


def test_futex_wait_names_the_address_and_the_operation_without_its_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(proc, "FUTEX", 202)  # x86_64's number, as in the lines below
    for tid, line in {
        1: "202 0x7f00 0x189 0x0 0x0 0x0 0xffffffff 0x7ffd 0x7f01",  # FUTEX_WAIT_BITSET|PRIVATE|CLOCK_REALTIME
        2: "202 0x10b8 0x80 0x2 0x0 0x0 0x0 0x7ffd 0x7f01",  # FUTEX_WAIT|PRIVATE: a contended mutex
        3: "230 0x0 0x0 0x7f00 0x7f00 0x0 0x0 0x7ffd 0x7f01",  # clock_nanosleep
        4: "running",
    }.items():
        (tmp_path / str(tid)).mkdir()
        (tmp_path / str(tid) / "syscall").write_text(line + "\n")
    assert proc.futex_wait(1, str(tmp_path)) == proc.FutexWait(0x7F00, 9)
    assert proc.futex_wait(2, str(tmp_path)) == proc.FutexWait(0x10B8, 0)
    assert proc.futex_wait(2, str(tmp_path)).operation in proc.FUTEX_LOCK_WAITS
    assert proc.futex_wait(1, str(tmp_path)).operation not in proc.FUTEX_LOCK_WAITS
    assert [proc.futex_wait(tid, str(tmp_path)) for tid in (3, 4, 5)] == [None, None, None]
    monkeypatch.setattr(proc, "FUTEX", None)  # a machine whose number is not known: nothing is a futex wait
    assert proc.futex_wait(2, str(tmp_path)) is None
