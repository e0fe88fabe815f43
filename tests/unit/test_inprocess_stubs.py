"""pytriton/inprocess/_stubs.py against a fake ``/proc``: which stubs belong to a server and a model."""

from __future__ import annotations

import pathlib
import shutil
import threading
import time

from pytriton.inprocess import _stubs

PARENT = 4242
STUB = "/opt/backends/python/triton_python_backend_stub"


def _stat(pid: int, parent: int = PARENT, state: str = "S", started: int = 500) -> str:
    # The command name in parentheses may hold spaces and ")": the fields are read after the last one.
    # After it: state, ppid, then 17 fields up to the start time (field 22 of proc(5)).
    return f"{pid} (triton_python) x) {state} {parent} " + "0 " * 17 + f"{started} 1000 12\n"


def _process(proc: pathlib.Path, pid: int, argv, parent: int = PARENT, state: str = "S", started: int = 500) -> None:
    entry = proc / str(pid)
    entry.mkdir()
    (entry / "stat").write_text(_stat(pid, parent, state, started))
    (entry / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")


def _stub_argv(model_file: str, region: str, instance: str):
    return [
        STUB,
        model_file,
        region,
        "1048576",
        "1048576",
        str(PARENT),
        "/opt/backends/python",
        "336",
        instance,
        "DEFAULT",
        "",
    ]


def test_only_live_stubs_of_this_parent_and_prefix_are_listed(tmp_path):
    _process(tmp_path, 10, _stub_argv("/repo/identity/1/model.py", "pfx-1-a", "identity_0_0"))
    _process(tmp_path, 11, _stub_argv("/repo/identity/1/model.py", "other-1-b", "identity_0_0"))  # another server
    _process(tmp_path, 12, _stub_argv("/repo/identity/1/model.py", "pfx-1-c", "identity_0_1"), parent=1)
    _process(tmp_path, 13, _stub_argv("/repo/identity/1/model.py", "pfx-1-d", "identity_0_2"), state="Z")
    _process(tmp_path, 14, ["/usr/bin/python3", "/repo/identity/1/model.py", "pfx-1-e", "", "", "", "", "", "x"])
    _process(tmp_path, 15, [STUB, "short"])
    (tmp_path / "self").mkdir()
    (tmp_path / "16").mkdir()  # ended between the listing and the read: no files
    found = _stubs.stubs("pfx-", parent=PARENT, proc=str(tmp_path))
    assert found == [_stubs.Stub(10, "/repo/identity/1/model.py", "pfx-1-a", "identity_0_0", 500)]


def test_a_stub_serves_the_model_of_its_directory_or_its_instance_name():
    by_dir = _stubs.Stub(1, "/repo/identity/1/model.py", "r", "custom_group_0", 1)
    assert by_dir.serves("identity") and not by_dir.serves("custom_group")
    renamed = _stubs.Stub(2, "/extra/faulty/1/model.py", "r", "renamed_0_0", 1)  # a repository name mapping
    assert renamed.serves("renamed") and renamed.serves("faulty")
    assert not renamed.serves("renamed_0") and not renamed.serves("rename")
    similar = _stubs.Stub(3, "/repo/a_b/1/model.py", "r", "a_b_0_0", 1)
    assert similar.serves("a_b") and not similar.serves("a")


def test_waiting_ends_when_the_old_stubs_exit_and_a_reused_pid_is_another_process(tmp_path):
    """An exiting stub counts as alive until it is a zombie, even once its cmdline reads empty."""
    old = _stubs.Stub(20, "/repo/identity/1/model.py", "pfx-1-old", "identity_0_0", 500)
    reused = _stubs.Stub(21, "/repo/identity/1/model.py", "pfx-1-old", "identity_0_0", 500)
    _process(tmp_path, 20, _stub_argv(old.model_file, old.region, old.instance))
    _process(tmp_path, 21, _stub_argv(old.model_file, old.region, old.instance), started=900)  # pid reused
    (tmp_path / "20" / "cmdline").write_bytes(b"")  # exiting: memory released
    assert old.alive(str(tmp_path)) and not reused.alive(str(tmp_path))

    def become_a_zombie():
        time.sleep(0.1)
        (tmp_path / "20" / "stat").write_text(_stat(20, state="Z"))

    thread = threading.Thread(target=become_a_zombie)
    thread.start()
    try:
        alive = _stubs.wait_until_exited([old, reused], time.monotonic() + 30, 0.01, proc=str(tmp_path))
    finally:
        thread.join()
    assert alive == [] and not old.alive(str(tmp_path))
    shutil.rmtree(tmp_path / "20")
    assert not old.alive(str(tmp_path))  # reaped: gone


def test_waiting_is_bounded_and_names_what_is_still_alive(tmp_path):
    old = _stubs.Stub(30, "/repo/identity/1/model.py", "pfx-1-x", "identity_0_0", 500)
    _process(tmp_path, 30, _stub_argv(old.model_file, old.region, old.instance))
    started = time.monotonic()
    alive = _stubs.wait_until_exited([old], started + 0.2, 0.01, proc=str(tmp_path))
    assert alive == [old] and time.monotonic() - started < 10
    assert _stubs.wait_until_exited([], started, proc=str(tmp_path)) == []
