"""The report of a slow ``initialize`` (``pytriton/proxy/stubside/_stub_slow.py``), with its real timer thread.

``sys.stderr`` (the server's log, in a stub) is replaced by a recorder that wakes the test when a
line arrives. Every wait is bounded.
"""

from __future__ import annotations

import io
import sys
import threading
import time

from pytriton.proxy.stubside import _stub_slow

LIMIT_S = 10.0


class Recorder(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.lines = 0
        self.arrived = threading.Event()

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        written = super().write(text)
        self.arrived.set()
        return written


def _waiting_for_the_worker(recorder: Recorder, reports: int) -> None:
    """Stands for a stub blocked in initialize (e.g. on the worker's answer to its hello)."""
    deadline = time.monotonic() + LIMIT_S
    while recorder.lines < reports and time.monotonic() < deadline:
        recorder.arrived.wait(0.1)
        recorder.arrived.clear()


def test_a_slow_initialize_says_where_it_is_on_one_line_each_time(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(sys, "stderr", recorder)
    with _stub_slow.reporting("model 'M', instance 'M_0_0'", after_s=0.02):
        _waiting_for_the_worker(recorder, reports=2)
    lines = recorder.getvalue().splitlines()
    assert len(lines) >= 2, lines
    for line in lines:
        assert line.startswith("pytriton: model 'M', instance 'M_0_0': initialize has run for ")
        assert "still running; now at: " in line and " <- _waiting_for_the_worker (" in line, line
        assert f"{__file__}:" in line


def test_an_initialize_that_returns_in_time_reports_nothing_and_leaves_no_thread(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(sys, "stderr", recorder)
    with _stub_slow.reporting("model 'M', instance 'M_0_0'", after_s=5.0):
        pass
    assert recorder.getvalue() == ""
    assert not [thread for thread in threading.enumerate() if thread.name == "pytriton-slow-initialize"]


def test_the_report_ends_with_the_block_even_when_it_raises(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(sys, "stderr", recorder)
    try:
        with _stub_slow.reporting("model 'M', instance 'M_0_0'", after_s=5.0):
            raise RuntimeError("the load failed")
    except RuntimeError:
        pass
    assert not [thread for thread in threading.enumerate() if thread.name == "pytriton-slow-initialize"]


def test_where_names_the_innermost_frames_first():
    text = _stub_slow.where(threading.get_ident(), frames=2)
    assert text.startswith("where (")
    assert "test_where_names_the_innermost_frames_first (" in text.split(" <- ")[1]
    assert _stub_slow.where(-1) == "(the thread is gone)"
