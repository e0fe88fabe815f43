"""pytriton/inprocess/_stopped_stubs.py on a fake ``/proc``, and its place in ``stop()`` and ``unload()`` (fake library).

Before Triton finalizes a model instance (an unload, ``ServerStop``), this server's stopped stubs are
killed outside the Python backend's locks: Triton would kill them wherever they are, which aborts
the process when one holds the allocator's mutex (tests/e2e/test_inprocess_stop.py shows it live).
Only this server's stopped stubs are touched: running ones, traced ones, other servers' and other
processes' are left alone.
"""

from __future__ import annotations

import logging
import os
import pathlib
from typing import List, Tuple

import pytest

import pytriton.inprocess as tritonserver
from pytriton._platform import proc
from pytriton.inprocess import _lib, _server, _stopped_stubs, _teardown
from tests.unit.test_inprocess import FakeCDLL


@pytest.fixture(autouse=True)
def _x86_64_futex(monkeypatch):
    monkeypatch.setattr(proc, "FUTEX", 202)  # the fake syscall lines use x86_64's number, on any machine


STUB = "/opt/backends/python/triton_python_backend_stub"
PREFIX = "pytriton-inproc-7-1-"


def _process(root: pathlib.Path, pid: int, ppid: int, state: str, argv: List[str]) -> None:
    directory = root / str(pid)
    directory.mkdir(parents=True)
    rest = " ".join(["0"] * 25)
    (directory / "stat").write_text(f"{pid} (triton_python_b) {state} {ppid} {pid} {rest}\n")
    (directory / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in argv) + b"\0")


def _stub(repository: str, model: str, region: str = PREFIX + "1234-uuid") -> List[str]:
    return [STUB, f"{repository}/{model}/1/model.py", region, "1048576", "1048576", "7"]


def _tree(tmp_path: pathlib.Path, parent: int) -> Tuple[pathlib.Path, str]:
    root, repository = tmp_path / "proc", str(tmp_path / "repo")
    _process(root, 101, parent, "T", _stub(repository, "identity"))  # ours, stopped: selected
    _process(root, 102, parent, "S", _stub(repository, "identity"))  # ours, running
    _process(root, 103, parent, "t", _stub(repository, "identity"))  # held by a debugger
    _process(root, 104, parent, "T", _stub(repository, "add_sub"))  # ours, stopped, another model
    _process(root, 105, parent, "T", _stub(str(tmp_path / "other"), "identity"))  # another repository
    _process(root, 106, parent, "T", _stub(repository, "identity", "pytriton-inproc-8-1-uuid"))  # another prefix
    _process(root, 107, parent + 1, "T", _stub(repository, "identity"))  # another process's
    _process(root, 108, parent, "T", ["/usr/bin/python3", f"{repository}/identity/1/model.py", PREFIX + "x"])
    _process(root, 109, parent, "Z", [])  # a zombie stub: nothing to kill
    return root, repository


def _pids(found: List[Tuple[int, str]]) -> List[int]:
    return [pid for pid, _ in found]


def test_only_this_servers_stopped_stubs_are_selected(tmp_path):
    root, repository = _tree(tmp_path, parent=7)
    assert _stopped_stubs.stopped_stubs(7, PREFIX, [repository], str(root)) == [
        (101, PREFIX + "1234-uuid"),
        (104, PREFIX + "1234-uuid"),
    ]
    assert _pids(_stopped_stubs.stopped_stubs(7, PREFIX, [f"{repository}/identity"], str(root))) == [101]
    assert _pids(_stopped_stubs.stopped_stubs(7, PREFIX, [repository + "/"], str(root))) == [101, 104]
    assert _stopped_stubs.stopped_stubs(7, PREFIX, [f"{repository}/ident"], str(root)) == []  # not a prefix of names
    assert _stopped_stubs.stopped_stubs(7, PREFIX, [], str(root)) == []
    assert _stopped_stubs.stopped_stubs(7, PREFIX, [repository], str(tmp_path / "missing")) == []


def _own_threads(root: pathlib.Path, region: str, *syscalls: str) -> None:
    """This process in the fake tree: the region mapped at 0x1000-0x3000, one thread per ``syscalls`` line."""
    own = root / "self"
    (own / "task").mkdir(parents=True)
    (own / "maps").write_text(
        "00400000-00500000 r-xp 00000000 08:01 1 /usr/bin/python3\n"
        f"00001000-00003000 rw-s 00000000 00:1b 5 /dev/shm/{region}\n"
        "00007000-00008000 rw-p 00000000 00:00 0 \n"
    )
    for tid, line in enumerate(syscalls, start=1):
        (own / "task" / str(tid)).mkdir()
        (own / "task" / str(tid) / "syscall").write_text(line + "\n")


def test_a_thread_waiting_for_a_mutex_of_the_region_is_seen_and_idle_waits_are_not(tmp_path):
    region = PREFIX + "1234-uuid"
    idle = "202 0x1220 0x189 0x0 0x0 0x0 0x0 0x7ffd 0x7f00"  # a semaphore's FUTEX_WAIT_BITSET in the region
    elsewhere = "202 0x7000 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f00"  # a mutex outside the region
    _own_threads(tmp_path / "quiet", region, idle, elsewhere, "running", "7 0x1 0x2 0x3 0x4 0x5 0x6 0x7 0x8")
    assert not _stopped_stubs.lock_waited_for(region, str(tmp_path / "quiet"))
    _own_threads(tmp_path / "blocked", region, idle, "202 0x10b8 0x0 0x80000005 0x0 0x0 0x0 0x7ffd 0x7f00")
    assert _stopped_stubs.lock_waited_for(region, str(tmp_path / "blocked"))  # FUTEX_WAIT on the allocator's mutex
    assert not _stopped_stubs.lock_waited_for("pytriton-inproc-7-1-other", str(tmp_path / "blocked"))
    assert not _stopped_stubs.lock_waited_for(region, str(tmp_path / "missing"))


def test_each_selected_stub_is_killed_outside_the_locks_with_a_warning(tmp_path, caplog):
    root, repository = _tree(tmp_path, parent=os.getpid())
    _own_threads(root, PREFIX + "1234-uuid", "202 0x1220 0x189 0x0 0x0 0x0 0x0 0x7ffd 0x7f00")  # idle
    killed = []

    def kill(pid: int, limit_s: float) -> str:
        killed.append((pid, limit_s))
        return "free" if pid == 101 else "held"

    with caplog.at_level(logging.WARNING, logger="pytriton.inprocess._stopped_stubs"):
        ended = _stopped_stubs.end_stopped_stubs(PREFIX, [repository], "stop()", kill, str(root))
    assert ended == [(101, "free"), (104, "held")]
    assert killed == [(101, _stopped_stubs.KILL_LIMIT_S), (104, _stopped_stubs.KILL_LIMIT_S)]
    assert "stop(): the Python-backend stub 101 was stopped" in caplog.text and "holding none" in caplog.text
    assert "still holding one" in caplog.text


def test_a_stub_whose_lock_a_server_thread_waits_for_is_left_to_triton(tmp_path, caplog):
    """Stopped mid-request: letting it run would make it work on a request the backend gave up (an abort)."""
    root, repository = _tree(tmp_path, parent=os.getpid())
    _own_threads(root, PREFIX + "1234-uuid", "202 0x10b8 0x0 0x80000005 0x0 0x0 0x0 0x7ffd 0x7f00")
    killed: list = []
    with caplog.at_level(logging.WARNING, logger="pytriton.inprocess._stopped_stubs"):
        ended = _stopped_stubs.end_stopped_stubs(PREFIX, [repository], "stop()", lambda *a: killed.append(a), str(root))
    assert ended == [(101, "left"), (104, "left")] and killed == []
    assert "left to Triton" in caplog.text


def _server_on_fake(monkeypatch, tmp_path, events: list) -> tritonserver.Server:
    directory = tmp_path / "task"
    directory.mkdir()
    monkeypatch.setattr(_teardown, "TASK_DIR", str(directory))
    fake = FakeCDLL(
        TRITONSERVER_ServerStop=lambda handle: events.append("ServerStop"),
        TRITONSERVER_ServerUnloadModel=lambda handle, name: events.append(("ServerUnloadModel", name)),
    )
    server = tritonserver.Server(model_repository=str(tmp_path / "repo"))
    server._lib = _lib.Library(fake)
    server._handle = 1
    return server


def test_stop_and_unload_end_stopped_stubs_before_triton_finalizes(monkeypatch, tmp_path):
    events: list = []
    monkeypatch.setattr(
        _stopped_stubs,
        "end_stopped_stubs",
        lambda prefix, directories, why: events.append((why, prefix, sorted(directories))),
    )
    server = _server_on_fake(monkeypatch, tmp_path, events)
    repository = str(tmp_path / "repo")
    server._registered[str(tmp_path / "extra")] = {"renamed": "subdir"}
    server.unload("identity")
    server.unload("renamed")
    server.stop()
    prefix = server.shm_region_prefix
    assert events == [
        ("unload('identity')", prefix, sorted([f"{repository}/identity", str(tmp_path / "extra" / "identity")])),
        ("ServerUnloadModel", b"identity"),
        ("unload('renamed')", prefix, sorted([f"{repository}/renamed", str(tmp_path / "extra" / "subdir")])),
        ("ServerUnloadModel", b"renamed"),
        ("stop()", prefix, sorted([repository, str(tmp_path / "extra")])),
        "ServerStop",
    ]


def test_a_failure_to_look_for_stubs_never_keeps_the_stop_from_happening(monkeypatch, tmp_path, caplog):
    events: list = []

    def broken(*args: object) -> None:
        raise OSError("no /proc here")

    monkeypatch.setattr(_stopped_stubs, "end_stopped_stubs", broken)
    server = _server_on_fake(monkeypatch, tmp_path, events)
    with caplog.at_level(logging.ERROR, logger=_server.LOGGER.name):
        server.stop()
    assert events == ["ServerStop"] and "could not look for stopped stubs" in caplog.text


def test_register_model_repository_records_where_its_models_lie(monkeypatch, tmp_path):
    server = _server_on_fake(monkeypatch, tmp_path, [])
    server.register_model_repository(str(tmp_path / "more"), {"sub": "model"})
    assert server._model_directories("model")[-1] == str(tmp_path / "more" / "sub")
    assert server._model_directories() == [str(tmp_path / "repo"), str(tmp_path / "more")]
