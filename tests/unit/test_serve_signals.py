"""``Triton.serve()``'s SIGINT/SIGTERM handlers are in place before ``run()`` (issue 42, item 11).

The server answers ready inside ``run()``; a process started with SIGINT ignored (``nohup``, a
non-interactive shell's ``cmd &``) once missed a SIGINT sent right after that, because ``serve()``
installed its handlers only after ``run()`` returned. ``run()`` is replaced by a fake here; the real
server is tests/e2e/test_supervisor.py's.
"""

from __future__ import annotations

import os
import re
import signal
import threading

import pytest

from pytriton._serving.signals import StopSignals
from pytriton.triton import Triton


@pytest.fixture
def triton(monkeypatch):
    instance = Triton()
    stops = []
    monkeypatch.setattr(instance, "stop", lambda: stops.append(True) or True)
    instance.stops = stops
    try:
        yield instance
    finally:
        Triton.stop(instance)  # the real one: removes the workspace


@pytest.fixture
def sigint_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_handlers_are_installed_before_run(triton, monkeypatch):
    seen = {}

    def fake_run():
        seen["sigint"] = signal.getsignal(signal.SIGINT)
        seen["sigterm"] = signal.getsignal(signal.SIGTERM)
        triton._wakeup.set()  # then serve() stops at once

    monkeypatch.setattr(triton, "run", fake_run)
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    triton.serve(monitoring_period_s=0.05)
    assert seen["sigint"] not in (signal.default_int_handler, signal.SIG_IGN, signal.SIG_DFL)
    assert seen["sigterm"] is seen["sigint"]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # restored
    assert triton.stops == [True]


def test_a_sigint_during_run_with_sigint_ignored_stops_serve_right_after_the_start(triton, monkeypatch, sigint_ignored):
    fallback = threading.Timer(20.0, lambda: (lost.append(True), triton._wakeup.set()))
    lost = []

    def fake_run():
        os.kill(os.getpid(), signal.SIGINT)  # right after the server answered ready, before run() returned
        fallback.start()  # bounds the test should the signal be lost (it was, before)

    monkeypatch.setattr(triton, "run", fake_run)
    try:
        triton.serve(monitoring_period_s=60.0)
    finally:
        fallback.cancel()
    assert lost == [], "the SIGINT sent during run() was lost"
    assert triton.stops == [True]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_ctrl_c_during_the_start_still_aborts_it_at_once(triton, monkeypatch):
    # Python's own handler, as in a program started from a terminal: pytest itself may have inherited
    # SIGINT ignored (a background job of a shell without job control does).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    reached = []

    def fake_run():
        os.kill(os.getpid(), signal.SIGINT)
        reached.append("after the signal")  # never: the handler raised KeyboardInterrupt in run()

    monkeypatch.setattr(triton, "run", fake_run)
    try:
        with pytest.raises(KeyboardInterrupt):
            triton.serve(monitoring_period_s=60.0)
        assert reached == [] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_stop_line_goes_through_the_programs_logging_when_it_configured_some(triton, monkeypatch, caplog):
    # Where logging is not configured the line goes to stderr (tests/e2e/test_lifecycle.py); a program
    # that configured logging gets it there instead, not nowhere.
    monkeypatch.setattr(triton, "run", lambda: triton._wakeup.set())
    with caplog.at_level("INFO", logger="pytriton.triton"):
        triton.serve(monitoring_period_s=0.05)
    assert any(re.fullmatch(r"Triton stopped in [0-9.]+ s", r.getMessage()) for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]


# The handlers themselves (pytriton/_serving/signals.py, issue 43 item 5), without a Triton.
def test_sigterm_wakes_serve_and_restore_puts_the_previous_handlers_back():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    wakeup = threading.Event()
    signals = StopSignals(wakeup)
    try:
        signals.starting = False
        os.kill(os.getpid(), signal.SIGTERM)
        assert wakeup.wait(5.0)
    finally:
        signals.restore()
        signals.restore()  # idempotent
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_ctrl_c_during_the_start_aborts_it_where_pythons_handler_was_in_place():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    wakeup = threading.Event()
    try:
        signals = StopSignals(wakeup)
        try:
            with pytest.raises(KeyboardInterrupt):
                signals._on_signal(signal.SIGINT, None)  # what the handler does when SIGINT arrives
            signals.starting = False  # run() returned: a Ctrl-C now only wakes serve()
            signals._on_signal(signal.SIGINT, None)
            assert wakeup.is_set()
        finally:
            signals.restore()
    finally:
        signal.signal(signal.SIGINT, previous)


def test_off_the_main_thread_nothing_is_installed():
    before = signal.getsignal(signal.SIGTERM)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(StopSignals(threading.Event())._previous))
    thread.start()
    thread.join(5.0)
    assert seen == [{}] and signal.getsignal(signal.SIGTERM) == before
