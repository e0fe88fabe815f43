"""``Server.unload(wait_until_unloaded=True)`` and ``load()`` against a fake server library and a scripted model index.

Triton reports a model not ready as soon as its unload starts, but destroys it later on a thread
of its own (the model deleter), and only then sets the model's state to ``UNAVAILABLE``. A load
of the same model inside that window crashed Triton 2.51. These tests drive the server through
its library seam: the index answers UNLOADING for a while, readiness is already false and no stub
process is visible, as in that window.
"""

from __future__ import annotations

from typing import Dict, List

import pytest

import pytriton.inprocess as tritonserver
from pytriton.inprocess import _lib, _server
from tests.unit.test_inprocess import FakeCDLL


class Index:
    """The model index the fake server reports: ``name -> state``; changed by the test."""

    def __init__(self, **states: str) -> None:
        self.states: Dict[str, str] = dict(states)
        self.reads = 0
        self.after_read: Dict[int, Dict[str, str]] = {}  # read number -> states the index takes after it

    def entries(self) -> List[Dict[str, str]]:
        self.reads += 1
        entries = [{"name": name, "version": "1", "state": state} for name, state in self.states.items()]
        self.states.update(self.after_read.pop(self.reads, {}))
        return entries


def _started(index: Index) -> tuple:
    fake = FakeCDLL()  # every call succeeds; readiness stays False (the out-parameter is never set)
    server = tritonserver.Server(model_repository="/nonexistent")
    server._lib = _lib.Library(fake)
    server._handle = 1
    server._message = lambda function, *args: (  # type: ignore[method-assign]
        index.entries() if function == "TRITONSERVER_ServerModelIndex" else {}
    )
    return server, fake


def test_unload_returns_only_once_the_index_reports_the_model_destroyed():
    index = Index(identity="UNLOADING", other="READY")
    # The model is destroyed after the second read, not on a timer: a 0.3 s timer started before the
    # clock the test read could leave less than the 0.25 s it asserted when the host was loaded.
    index.after_read[2] = {"identity": "UNAVAILABLE"}
    server, fake = _started(index)
    server.unload("identity", wait_until_unloaded=True, polling_interval=0.01, timeout=30)
    assert fake.called("TRITONSERVER_ServerUnloadModel") == [(1, b"identity")]
    assert index.reads == 3 and index.states["identity"] == "UNAVAILABLE"  # returned at the first UNAVAILABLE


def test_another_servers_or_models_state_is_not_waited_for():
    """Only this server's index is read, and only the unloaded model's entries count."""
    index = Index(identity="UNAVAILABLE", other="UNLOADING")
    server, _ = _started(index)
    server.unload("identity", wait_until_unloaded=True, polling_interval=0.01, timeout=30)
    assert index.reads == 1


def test_unload_that_never_finishes_raises_after_the_timeout():
    server, _ = _started(Index(identity="UNLOADING"))
    with pytest.raises(tritonserver.UnavailableError, match="'identity' was not unloaded within 0.2 s.*UNLOADING"):
        server.unload("identity", wait_until_unloaded=True, polling_interval=0.01, timeout=0.2)


def test_a_model_the_index_no_longer_lists_is_done_once_not_ready():
    server, _ = _started(Index())
    server.unload("gone", wait_until_unloaded=True, polling_interval=0.01, timeout=5)


def test_load_waits_for_an_unload_that_did_not_wait():
    index = Index(identity="UNLOADING")
    index.after_read[2] = {"identity": "UNAVAILABLE"}  # destroyed after the second read (not on a timer)
    server, fake = _started(index)
    loads: List[int] = []
    fake.results["TRITONSERVER_ServerLoadModel"] = lambda *args: loads.append(index.reads)
    server.load("identity")
    assert loads == [3]  # called only once a read saw the old model destroyed


def test_load_without_an_unload_in_progress_reads_the_index_once():
    """Healthy traffic: a load of a model that is not unloading does not wait."""
    index = Index(identity="READY", other="UNLOADING")
    server, fake = _started(index)
    server.load("identity")
    server.load("new_model")
    assert index.reads == 2 and len(fake.called("TRITONSERVER_ServerLoadModel")) == 2


def test_load_behind_an_unload_that_never_finishes_is_refused(monkeypatch):
    monkeypatch.setattr(_server, "_LOAD_AFTER_UNLOAD_WAIT_S", 0.2)
    server, fake = _started(Index(identity="UNLOADING"))
    with pytest.raises(tritonserver.UnavailableError, match="'identity' is still unloading"):
        server.load("identity")
    assert fake.called("TRITONSERVER_ServerLoadModel") == []
