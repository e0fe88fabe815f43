"""pytriton/inprocess/_teardown.py on a fake ``/proc/self/task``, and ``Server.stop()`` on a fake library.

``stop()`` must not call ``ServerDelete`` while a thread that appeared during ``ServerStop`` (one of
Triton's model deleters) still runs: freeing the server under it could abort the process.
"""

from __future__ import annotations

import logging
import pathlib
import threading
import time
from types import SimpleNamespace
from typing import List

import pytriton.inprocess as tritonserver
from pytriton.inprocess import _lib, _server, _teardown
from tests.unit.test_inprocess import FakeCDLL


def _task_dir(tmp_path: pathlib.Path, *ids: int) -> pathlib.Path:
    directory = tmp_path / "task"
    directory.mkdir(exist_ok=True)
    for task in ids:
        (directory / str(task)).mkdir()
    return directory


def test_tasks_lists_the_thread_ids_and_none_without_proc(tmp_path):
    directory = _task_dir(tmp_path, 11, 12)
    assert _teardown.tasks(str(directory)) == {11, 12}
    assert _teardown.tasks(str(tmp_path / "missing")) is None
    assert threading.get_native_id() in (_teardown.tasks() or ())  # the real /proc/self/task


def test_new_threads_are_waited_for_until_they_exit(tmp_path, monkeypatch):
    directory = _task_dir(tmp_path, 1, 2)
    (directory / "3").mkdir()  # a deleter that appeared during the stop
    # The deleter exits at the function's second sleep (between its looks), not on a 0.3 s timer
    # whose margin over the elapsed time the test asserted a loaded host could eat.
    sleeps: List[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            (directory / "3").rmdir()

    monkeypatch.setattr(_teardown, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))  # this module's
    left = _teardown.wait_for_new_tasks(frozenset({1, 2}), time.monotonic() + 30, 0.01, str(directory))
    assert left == frozenset() and sleeps == [0.01, 0.01]  # looked three times: running, running, exited


def test_a_thread_still_running_at_the_deadline_is_returned(tmp_path):
    directory = _task_dir(tmp_path, 1, 5)
    assert _teardown.wait_for_new_tasks(frozenset({1}), time.monotonic() + 0.1, 0.01, str(directory)) == {5}
    assert _teardown.wait_for_new_tasks(None, time.monotonic() + 10, 0.01, str(directory)) == frozenset()


def test_python_threads_and_threads_that_ended_are_not_waited_for(tmp_path):
    python_thread = threading.get_native_id()
    directory = _task_dir(tmp_path, 1, python_thread)  # a Python thread started meanwhile; 2 has ended
    left = _teardown.wait_for_new_tasks(frozenset({1, 2}), time.monotonic() + 10, 0.01, str(directory))
    assert left == frozenset()


def _stoppable(monkeypatch, tmp_path, deleter_s: float) -> tuple:
    """A started server on a fake library whose ServerStop leaves a 'deleter' thread running ``deleter_s``."""
    directory = _task_dir(tmp_path, 1)
    monkeypatch.setattr(_teardown, "TASK_DIR", str(directory))
    events = []

    def stop(handle):
        events.append("stop")
        (directory / "77").mkdir()  # the model deleter ServerStop started
        if deleter_s >= 0:
            threading.Timer(deleter_s, lambda: (events.append("deleter done"), (directory / "77").rmdir())).start()

    fake = FakeCDLL(TRITONSERVER_ServerStop=stop, TRITONSERVER_ServerDelete=lambda handle: events.append("delete"))
    server = tritonserver.Server(model_repository="/nonexistent")
    server._lib = _lib.Library(fake)
    server._handle = 1
    return server, events


def test_stop_deletes_the_server_only_after_the_deleters_exited(monkeypatch, tmp_path):
    server, events = _stoppable(monkeypatch, tmp_path, deleter_s=0.3)
    server.stop()
    assert events == ["stop", "deleter done", "delete"]
    server.stop()  # harmless again
    assert events.count("delete") == 1


def test_stop_returns_at_once_when_no_deleter_runs(monkeypatch, tmp_path):
    """Healthy traffic: nothing to wait for, the server is deleted at once."""
    server, events = _stoppable(monkeypatch, tmp_path, deleter_s=0.0)
    server.stop()
    assert events[0] == "stop" and events[-1] == "delete"


def test_a_deleter_that_never_ends_leaves_the_server_undeleted_with_a_warning(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(_server, "_TEARDOWN_WAIT_S", 0.2)
    monkeypatch.setattr(_server, "_UNDELETED", [])
    server, events = _stoppable(monkeypatch, tmp_path, deleter_s=-1)
    with caplog.at_level(logging.WARNING, logger="pytriton.inprocess._server"):
        server.stop()
    assert events == ["stop"] and _server._UNDELETED == [1]
    assert "not deleted" in caplog.text and not server.live()
