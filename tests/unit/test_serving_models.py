"""The bound models of a ``Triton`` (pytriton/_serving/models.py) with fake models: no server, no workers."""

from __future__ import annotations

import pathlib
import threading
from types import SimpleNamespace
from typing import Any, List

import pytest

from pytriton._serving.backend import State
from pytriton._serving.models import BoundModels, RegistryView, retire
from pytriton.exceptions import PyTritonModelAlreadyBoundError, PyTritonValidationError


def _model(name: str, version: int, warmup: bool = False, differs: str = "") -> SimpleNamespace:
    return SimpleNamespace(
        name=name,
        version=version,
        generation=0,
        config=SimpleNamespace(model_warmup=[{"name": "w"}] if warmup else []),
        direct_warmup=None,
        incompatibility=lambda other: differs,
        busy=False,
        connected=False,
        stopped=False,
        removed=[],
    )


def test_versions_come_lowest_first_and_names_in_binding_order():
    models = BoundModels()
    for model in (_model("b", 2), _model("a", 1), _model("b", 1)):
        models.admit(model)  # type: ignore[arg-type]
    assert [m.version for m in models.versions("b")] == [1, 2]
    assert models.names() == ["b", "a"]


def test_admit_refuses_a_bound_version_and_one_that_differs_and_shares_the_generation():
    models = BoundModels()
    first = _model("m", 1)
    first.generation = 3
    assert models.admit(first) == []  # type: ignore[arg-type]
    with pytest.raises(PyTritonModelAlreadyBoundError, match="version 1 is already bound"):
        models.admit(_model("m", 1))  # type: ignore[arg-type]
    with pytest.raises(PyTritonValidationError, match="differs from version 1, which is already bound: inputs"):
        models.admit(_model("m", 2, differs="inputs"))  # type: ignore[arg-type]
    second = _model("m", 2)
    assert models.admit(second) == [first] and second.generation == 3  # type: ignore[arg-type]


def test_models_with_a_warmup_load_after_the_start_and_a_server_that_loads_nothing_gets_all_later():
    models = BoundModels()
    for model in (_model("plain", 1), _model("warm", 1, warmup=True)):
        models.admit(model)  # type: ignore[arg-type]
    assert models.split_start(loads_at_startup=True) == (["plain"], ["warm"])
    assert models.split_start(loads_at_startup=False) == ([], ["plain", "warm"])


def test_retire_stops_the_workers_and_removes_the_files_the_name_no_longer_needs(tmp_path: pathlib.Path):
    events: List[Any] = []
    removed = [_model("m", 2)]
    removed[0].stop_workers = lambda: events.append("stop")
    removed[0].remove_version_files = lambda repository: events.append(("version files", repository))
    removed[0].remove_files = lambda repository: events.append(("name files", repository))
    retire(removed, True, tmp_path, deadline=0.0, running=True)  # type: ignore[arg-type]
    assert events == ["stop", ("version files", tmp_path)]  # another version remains: the name's files stay
    events.clear()
    retire(removed, False, tmp_path, deadline=0.0, running=False)  # type: ignore[arg-type]
    assert events == ["stop", ("version files", tmp_path), ("name files", tmp_path)]


def test_the_registry_view_reads_the_triton_state_on_every_call(tmp_path: pathlib.Path):
    owner = SimpleNamespace(
        _lock=threading.RLock(),
        _state=State.CREATED,
        _models=BoundModels(),
        _repository=None,
        _startup_models=[],
        _traces=SimpleNamespace(apply=lambda names: loaded.append(("traces", list(names)))),
        _wakeup=threading.Event(),
        _request_load=lambda name: loaded.append(name),
    )
    owner._versions, owner._model_names = owner._models.versions, owner._models.names
    loaded: List[Any] = []
    view = RegistryView(owner)  # type: ignore[arg-type]
    assert not view.running() and view.repository() is None
    owner._state, owner._repository, owner._startup_models = State.RUNNING, tmp_path, ["m"]
    owner._models.admit(_model("m", 1))
    assert view.running() and view.repository() == tmp_path and view.startup_models() == ["m"]
    assert view.model_names() == ["m"] and [m.version for m in view.versions("m")] == [1]
    view.request_load("m")
    view.apply_trace_settings(["m"])
    view.wake()
    assert loaded == ["m", ("traces", ["m"])] and owner._wakeup.is_set() and view.lock is owner._lock
