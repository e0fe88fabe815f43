"""The unresponsive-model watch (pytriton/_serving/unresponsive.py) with fake instances, a fake clock and a fake Triton."""

from __future__ import annotations

import enum
import queue
import types
from typing import Any, Dict, List, Tuple

import pytest

from pytriton._serving import unresponsive as _unresponsive
from pytriton._serving.unresponsive import HungCalls, UnresponsiveWatch
from pytriton.exceptions import PyTritonValidationError

IN_ONE_CALL = "in one call of the callable"
STOPPED = "its stub is stopped"


def _stuck(seconds, why, busy):
    return _unresponsive.Stuck(pytest.approx(seconds), why, busy)


def test_every_instance_must_be_stuck_in_one_call_for_the_limit():
    calls = HungCalls(limit_s=2.0)
    assert calls.update("m", [(True, 5.0, False), (True, 7.0, False)], now=10.0) is None
    assert calls.update("m", [(True, 5.0, False), (True, 7.0, False)], now=11.9) is None
    assert calls.update("m", [(True, 5.0, False), (True, 7.0, False)], now=12.0) == _stuck(2.0, IN_ONE_CALL, [0, 1])
    assert calls.update("n", [(True, 5.0, False), (False, 7.0, False)], now=10.0) is None
    assert calls.update("n", [(True, 5.0, False), (False, 7.0, False)], now=100.0) is None  # one instance is free


def test_a_reported_call_is_not_reported_again_and_its_instance_counts_as_free():
    """Issue 42: its call is being failed, so the instance serves again; only a new call starts a new clock."""
    calls = HungCalls(limit_s=2.0)
    calls.update("m", [(True, 5.0, False), (True, 7.0, False)], now=10.0)
    assert calls.update("m", [(True, 5.0, False), (True, 7.0, False)], now=12.0) is not None
    assert calls.update("m", [(True, 5.0, False), (True, 7.0, False)], now=30.0) is None  # same calls: once
    assert calls.update("m", [(True, 5.0, False), (True, 31.0, False)], now=31.5) is None  # one failed, one new
    assert calls.update("m", [(True, 32.0, False), (True, 31.0, False)], now=32.5) is None
    assert calls.update("m", [(True, 32.0, False), (True, 31.0, False)], now=34.5) == _stuck(2.0, IN_ONE_CALL, [0, 1])


def test_calls_that_end_between_polls_do_not_add_up():
    calls = HungCalls(limit_s=2.0)
    calls.update("m", [(True, 5.0, False)], now=10.0)
    # busy again at the next poll, but its last call ended meanwhile (last end 11.0): a new call
    assert calls.update("m", [(True, 11.0, False)], now=12.5) is None
    assert calls.update("m", [(True, 11.0, False)], now=14.4) is None
    assert calls.update("m", [(True, 11.0, False)], now=14.5) == _stuck(2.0, IN_ONE_CALL, [0])


def test_a_stopped_stub_counts_after_half_a_second_whatever_the_limit():
    calls = HungCalls(limit_s=60.0)
    assert calls.update("m", [(False, 5.0, True)], now=10.0) is None
    assert calls.update("m", [(False, 5.0, True)], now=10.4) is None
    assert calls.update("m", [(True, 5.0, True)], now=10.5) == _stuck(0.5, STOPPED, [])
    # one stopped, one in a call: both must be stuck, each by its own measure; the call is failed
    assert calls.update("n", [(False, 1.0, True), (True, 2.0, False)], now=0.0) is None
    assert calls.update("n", [(False, 1.0, True), (True, 2.0, False)], now=59.0) is None
    assert calls.update("n", [(False, 1.0, True), (True, 2.0, False)], now=60.0) == _stuck(60.0, IN_ONE_CALL, [1])


def test_a_model_without_instances_or_idle_is_never_stuck():
    calls = HungCalls(limit_s=0.5)
    assert calls.update("m", [], now=10.0) is None
    assert calls.update("m", [(False, 0.0, False)], now=10.0) is None
    assert calls.update("m", [(False, 0.0, False)], now=20.0) is None


def test_still_stuck_follows_the_recorded_stop_only():
    calls = HungCalls(limit_s=1.0)
    calls.update("m", [(True, 5.0, False), (False, 1.0, True)], now=0.0)
    assert not calls.still_stuck("m", [(True, 5.0, False), (False, 1.0, False)])  # a call alone never keeps it down
    assert calls.still_stuck("m", [(False, 6.0, False), (False, 1.0, True)])  # the stub is still stopped
    assert not calls.still_stuck("m", [])  # instances gone


def test_the_watch_fails_stuck_calls_once_and_never_unloads_for_them():
    states: Dict[str, List[Tuple[bool, float, bool]]] = {
        "m": [(True, 1.0, False)],
        "busy": [(True, 1.0, False), (False, 3.0, False)],
    }
    events: List[Tuple[str, Any]] = []
    watch = UnresponsiveWatch(lambda: dict(states), events.append, limit_s=1.0)
    watch.check(10.0)
    watch.check(11.0)
    assert events == [("stuck", ("m", _stuck(1.0, IN_ONE_CALL, [0])))] and not watch.unloaded
    watch.check(30.0)  # still in the same call: reported once
    assert len(events) == 1
    states["m"] = [(True, 31.0, False)]  # a queued request began: a new call, its own clock
    watch.check(31.5)
    assert len(events) == 1
    watch.check(32.5)
    assert events[-1] == ("stuck", ("m", _stuck(1.0, IN_ONE_CALL, [0])))


def test_the_watch_reports_a_model_whose_every_stub_is_stopped_once_until_one_resumes():
    states: Dict[str, List[Tuple[bool, float, bool]]] = {"m": [(False, 1.0, True)]}
    events: List[Tuple[str, Any]] = []
    watch = UnresponsiveWatch(lambda: dict(states), events.append, limit_s=1.0)
    watch.check(10.0)
    watch.check(10.5)
    assert events == [("unresponsive", ("m", (pytest.approx(0.5), STOPPED)))] and watch.unloaded == {"m"}
    watch.check(20.0)
    assert len(events) == 1
    states["m"] = [(False, 1.0, False)]
    watch.check(20.5)
    assert events[-1] == ("responsive", "m") and not watch.unloaded


def test_a_model_unbound_while_unloaded_is_forgotten_silently():
    states: Dict[str, List[Tuple[bool, float, bool]]] = {"m": [(False, 1.0, True)]}
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
        lambda: {"m": [(True, 0.0, False)]}, posted.put, limit_s=0.05, poll_s=0.01, running=lambda: running[0]
    )
    watch.start()
    assert posted.get(timeout=5)[0] == "stuck"
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
    def __init__(self, timeout=None, stopped=False, decoupled=False):
        self.execution_timeout_s = timeout
        self.config = types.SimpleNamespace(decoupled=decoupled)
        self.busy = False
        self.generation = 3
        self.stopped = stopped
        self.failed: List[Tuple[List[int], str]] = []

    def instance_states(self):
        return [(True, 1.0, self.stopped)]

    def fail_stuck_calls(self, instances, text, older_than_s):
        self.failed.append((list(instances), text, older_than_s))

    def retire_generation(self):
        return [4200 + self.generation]  # the pid of its (stopped) stub of the older generation


class _FakeTriton:
    """Registry, server and supervisor at once: what ``_unresponsive`` sees of each, recording the actions."""

    def __init__(self):
        self.calls: List[Tuple[str, str]] = []
        self.restarting = False
        self.state = _State.RUNNING
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.unloaded: dict = {}
        self.models = {
            "m": [_Model()],
            "bounded": [_Model(timeout=5.0)],
            "paused": [_Model(timeout=5.0, stopped=True)],
            "streaming": [_Model(decoupled=True)],
        }

    # registry
    def running(self):
        return self.state is _State.RUNNING

    def versions(self, name):
        return self.models.get(name, [])

    def model_names(self):
        return list(self.models)

    # server
    def repository_request(self, action, name):
        self.calls.append((action, name))

    def is_serving(self):
        return True

    # supervisor
    def load_next_generation(self, name):
        self.calls.append(("next-generation", name))
        for model in self.models[name]:
            model.generation += 1
        return None


def _handle(triton, kind, payload):
    _unresponsive.handle(kind, payload, registry=triton, server=triton, supervisor=triton, unloaded=triton.unloaded)


def test_the_view_hides_calls_bounded_by_a_timeout_or_streaming_but_not_stopped_stubs(monkeypatch):
    monkeypatch.setenv(_unresponsive.ENV, "0")  # no thread: the models() view is checked directly
    triton = _FakeTriton()
    view = _unresponsive.watch_for(triton, triton.events.put)._models()
    assert view == {
        "m": [(True, 1.0, False)],
        "bounded": [(False, 1.0, False)],
        "paused": [(False, 1.0, True)],
        "streaming": [(False, 1.0, False)],
    }


def test_every_stub_stopped_loads_new_stubs_and_ends_the_stopped_ones_without_an_unload(caplog, monkeypatch):
    # Before (issue 42 item 4): the model was unloaded, and every request got a 404 until it was loaded again.
    killed = []
    monkeypatch.setattr(_unresponsive, "kill_stub", lambda pid: killed.append(pid) or True)
    triton = _FakeTriton()
    _handle(triton, "responsive", "m")  # never stopped: nothing to load
    _handle(triton, "unresponsive", ("m", (0.5, STOPPED)))
    assert triton.calls == [("next-generation", "m")]  # no unload
    assert killed == [4204]  # the stopped stub of the old generation, once the new one serves
    assert any(STOPPED in record.getMessage() for record in caplog.records)
    _handle(triton, "responsive", "m")  # the stopped stub is gone: replaced already, nothing more to load
    assert triton.calls == [("next-generation", "m")]
    triton.restarting = True
    _handle(triton, "unresponsive", ("m", (0.5, STOPPED)))  # a restart reloads everything anyway
    _handle(triton, "unresponsive", ("gone", (0.5, STOPPED)))
    assert len(triton.calls) == 1 and killed == [4204]


def test_the_supervisor_fails_stuck_calls_of_each_version_without_unloading(caplog):
    """Issue 42 item 4: the instances are numbered across versions as the watch lists them."""
    triton = _FakeTriton()
    triton.models["two"] = [_Model(), _Model()]  # two versions of one instance each
    _handle(triton, "stuck", ("two", _unresponsive.Stuck(61.0, IN_ONE_CALL, [1])))
    assert triton.models["two"][0].failed == []
    assert triton.models["two"][1].failed == [([0], _unresponsive.STUCK_TEXT, 30.5)]
    assert triton.calls == []  # nothing unloaded, nothing loaded
    assert any("503" in record.getMessage() for record in caplog.records if record.levelname == "WARNING")
    triton.restarting = True
    _handle(triton, "stuck", ("m", _unresponsive.Stuck(61.0, IN_ONE_CALL, [0])))  # a restart ends every call
    _handle(triton, "stuck", ("gone", _unresponsive.Stuck(61.0, IN_ONE_CALL, [0])))
    assert triton.models["m"][0].failed == []


def test_a_failed_load_of_new_stubs_is_logged_and_nothing_is_killed(caplog, monkeypatch):
    killed = []
    monkeypatch.setattr(_unresponsive, "kill_stub", lambda pid: killed.append(pid) or True)
    triton = _FakeTriton()
    monkeypatch.setattr(triton, "load_next_generation", lambda name: RuntimeError("no room"))
    _handle(triton, "unresponsive", ("paused", (0.5, STOPPED)))
    assert killed == [] and triton.calls == []
    assert any("no room" in record.getMessage() for record in caplog.records if record.levelname == "ERROR")


def test_a_bad_limit_in_the_environment_is_logged_and_the_default_applies(caplog, monkeypatch):
    monkeypatch.setenv(_unresponsive.ENV, "soon")
    triton = _FakeTriton()
    watch = _unresponsive.watch_for(triton, triton.events.put)
    watch.stop()  # ends the thread before its first poll
    assert watch.calls.limit_s == _unresponsive.UNRESPONSIVE_AFTER_S
    assert any(_unresponsive.ENV in record.getMessage() for record in caplog.records if record.levelname == "ERROR")
