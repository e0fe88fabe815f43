"""The unresponsive-model watch (pytriton/_unresponsive.py) with fake instances, a fake clock and a fake Triton."""

from __future__ import annotations

import enum
import queue
from typing import Any, Dict, List, Tuple

import pytest

from pytriton import _unresponsive
from pytriton._unresponsive import HungCalls, UnresponsiveWatch
from pytriton.exceptions import PyTritonValidationError


def test_every_instance_must_be_stuck_in_one_call_for_the_limit():
    calls = HungCalls(limit_s=2.0)
    assert calls.update("m", [(True, 5.0), (True, 7.0)], now=10.0) is None
    assert calls.update("m", [(True, 5.0), (True, 7.0)], now=11.9) is None
    assert calls.update("m", [(True, 5.0), (True, 7.0)], now=12.0) == pytest.approx(2.0)
    assert calls.update("m", [(True, 5.0), (False, 7.0)], now=13.0) is None  # one instance is free


def test_calls_that_end_between_polls_do_not_add_up():
    calls = HungCalls(limit_s=2.0)
    calls.update("m", [(True, 5.0)], now=10.0)
    # busy again at the next poll, but its last call ended meanwhile (last end 11.0): a new call
    assert calls.update("m", [(True, 11.0)], now=12.5) is None
    assert calls.update("m", [(True, 11.0)], now=14.4) is None
    assert calls.update("m", [(True, 11.0)], now=14.5) == pytest.approx(2.0)


def test_a_model_without_instances_or_idle_is_never_stuck():
    calls = HungCalls(limit_s=0.5)
    assert calls.update("m", [], now=10.0) is None
    assert calls.update("m", [(False, 0.0)], now=10.0) is None
    assert calls.update("m", [(False, 0.0)], now=20.0) is None


def test_the_watch_reports_unresponsive_once_then_responsive_when_the_call_returns():
    states: Dict[str, List[Tuple[bool, float]]] = {"m": [(True, 1.0)], "busy": [(True, 1.0), (False, 3.0)]}
    events: List[Tuple[str, Any]] = []
    watch = UnresponsiveWatch(lambda: dict(states), events.append, limit_s=1.0)
    watch.check(10.0)
    watch.check(11.0)
    assert events == [("unresponsive", ("m", 1.0))] and watch.unloaded == {"m"}
    watch.check(30.0)  # still in the same call: reported once
    assert len(events) == 1
    states["m"] = [(True, 31.0)]  # the call returned and a queued request began: it answered
    watch.check(31.5)
    assert events[-1] == ("responsive", "m") and not watch.unloaded
    watch.check(31.6)
    assert len(events) == 2  # the new call starts its own clock


def test_a_model_unbound_while_unloaded_is_forgotten_silently():
    states: Dict[str, List[Tuple[bool, float]]] = {"m": [(True, 1.0)]}
    events: List[Tuple[str, Any]] = []
    watch = UnresponsiveWatch(lambda: dict(states), events.append, limit_s=1.0)
    watch.check(0.0)
    watch.check(2.0)
    del states["m"]
    watch.check(3.0)
    assert [kind for kind, _ in events] == ["unresponsive"] and not watch.unloaded


def test_the_thread_ends_when_the_instance_stops_running():
    running = [True]
    posted: queue.SimpleQueue = queue.SimpleQueue()
    watch = UnresponsiveWatch(
        lambda: {"m": [(True, 0.0)]}, posted.put, limit_s=0.05, poll_s=0.01, running=lambda: running[0]
    )
    watch.start()
    assert posted.get(timeout=5)[0] == "unresponsive"
    running[0] = False
    thread = watch._thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()
    watch.stop()
    UnresponsiveWatch(lambda: {}, posted.put, limit_s=0).start()  # 0: off, no thread


@pytest.mark.parametrize("raw", ["-1", "soon", "inf", "nan"])
def test_a_bad_limit_is_refused_with_the_variable_named(raw):
    with pytest.raises(PyTritonValidationError, match="PYTRITON_UNRESPONSIVE_AFTER_S"):
        _unresponsive.limit_from_env({_unresponsive.ENV: raw})


def test_limits_from_the_environment():
    assert _unresponsive.limit_from_env({}) == _unresponsive.UNRESPONSIVE_AFTER_S
    assert _unresponsive.limit_from_env({_unresponsive.ENV: "0"}) == 0.0
    assert _unresponsive.limit_from_env({_unresponsive.ENV: " 2.5 "}) == 2.5


class _State(enum.Enum):
    RUNNING = "running"


class _Model:
    def __init__(self, timeout=None):
        self.execution_timeout_s = timeout
        self.busy = False
        self.generation = 3

    def instance_states(self):
        return [(True, 1.0)]


class _FakeTriton:
    def __init__(self):
        self.calls: List[Tuple[str, str]] = []
        self._restarting = False
        self._state = _State.RUNNING
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self.models = {"m": [_Model()], "bounded": [_Model(timeout=5.0)]}

    def _versions(self, name):
        return self.models.get(name, [])

    def _model_names(self):
        return list(self.models)

    def _repository_request(self, action, name):
        self.calls.append((action, name))

    def _load_next_generation(self, name):
        self.calls.append(("next-generation", name))
        return None

    def _server_serving(self):
        return True


def test_the_supervisor_unloads_then_loads_a_new_generation(caplog, monkeypatch):
    triton = _FakeTriton()
    monkeypatch.setenv(_unresponsive.ENV, "0")  # no thread: the models() view is checked directly
    watch = _unresponsive.watch_for(triton)
    assert set(watch._models()) == {"m"}  # a model with an execution timeout is never watched
    _unresponsive.handle(triton, "unresponsive", ("m", 61.0))
    _unresponsive.handle(triton, "responsive", "m")
    assert triton.calls == [("unload", "m"), ("next-generation", "m")]
    assert any("no execution timeout" in record.getMessage() for record in caplog.records)
    triton._restarting = True
    _unresponsive.handle(triton, "unresponsive", ("m", 61.0))  # a restart reloads everything anyway
    _unresponsive.handle(triton, "unresponsive", ("gone", 61.0))
    assert len(triton.calls) == 2


def test_a_bad_limit_in_the_environment_is_logged_and_the_default_applies(caplog, monkeypatch):
    monkeypatch.setenv(_unresponsive.ENV, "soon")
    triton = _FakeTriton()
    watch = _unresponsive.watch_for(triton)
    watch.stop()  # ends the thread before its first poll
    assert watch.calls.limit_s == _unresponsive.UNRESPONSIVE_AFTER_S
    assert any(_unresponsive.ENV in record.getMessage() for record in caplog.records if record.levelname == "ERROR")
