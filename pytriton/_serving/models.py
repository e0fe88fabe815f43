"""The bound models of one ``Triton``: kept by (name, version), their versions' shared files, and their checks.

``Triton`` (pytriton/triton.py) keeps one :class:`BoundModels` and changes it under its own lock; the
supervisor and the backends read it through :class:`RegistryView` (the ``Registry`` of :mod:`.backend`). The checks a
model passes before it is served (:meth:`BoundModels.admit`, :func:`check_stub_support`) and the error of
a load whose connection broke (:func:`load_interrupted`) are here too.

Owns no resource: each ``BoundModel`` owns its workers and files (proxy/_binding.py), and ``Triton``
decides when they start and stop. Unit tests: tests/unit/test_serving_models.py, tests/unit/test_self_healing.py
(bind validation); with a server: tests/e2e/test_versions.py.
"""

from __future__ import annotations

import pathlib
import threading
import time
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from pytriton._serving.backend import State
from pytriton._serving.supervisor import wait_detached
from pytriton._serving.trace_settings import ModelTraceSettings
from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonModelAlreadyBoundError,
    PyTritonModelConfigError,
    PyTritonValidationError,
)
from pytriton.proxy._binding import BoundModel
from pytriton.proxy._context import TritonContext, attach_context
from pytriton.proxy.stubside import _stub_bytes
from pytriton.server.process import TritonServerProcess


class BoundModels(Dict[Tuple[str, int], BoundModel]):
    """The bound models by ``(name, version)``, in binding order; the versions of one name share its config."""

    def versions(self, model_name: str) -> List[BoundModel]:
        """The bound versions of ``model_name``, lowest first."""
        return sorted((m for (name, _), m in self.items() if name == model_name), key=lambda m: m.version)

    def names(self) -> List[str]:
        """Each bound model name once, in binding order."""
        return list(dict.fromkeys(name for name, _ in self))

    def admit(self, model: BoundModel) -> List[BoundModel]:
        """Add ``model``; returns the versions of its name that were bound before it (its siblings).

        A new version takes its siblings' generation (they share one name in the server). Raises
        ``PyTritonModelAlreadyBoundError`` for a bound (name, version) and ``PyTritonValidationError``
        for a version whose inputs, outputs, config or instances differ from its siblings'.
        """
        key = (model.name, model.version)
        if key in self:
            raise PyTritonModelAlreadyBoundError(
                f"Model {model.name!r} version {model.version} is already bound; "
                "bind another model_version to serve several versions of one name."
            )
        siblings = self.versions(model.name)
        if siblings:
            problem = model.incompatibility(siblings[0])
            if problem:
                raise PyTritonValidationError(
                    f"Model {model.name!r} version {model.version} differs from version {siblings[0].version}, "
                    f"which is already bound: {problem}. Triton keeps one configuration per model name, so "
                    "every version must declare the same inputs, outputs, ModelConfig and number of instances."
                )
            model.generation = siblings[0].generation
        self[key] = model
        return siblings

    def write_name(self, repository: pathlib.Path, model_name: str) -> None:
        """Write the repository files of every bound version of ``model_name`` (one shared config.pbtxt)."""
        versions = self.versions(model_name)
        numbers = [model.version for model in versions]
        for model in versions:
            model.write_repository(repository, numbers)

    def split_start(self, loads_at_startup: bool) -> Tuple[List[str], List[str]]:
        """The names the server loads at its start (``--load-model``), and those loaded once it is up.

        Models with a warmup are loaded through the repository API once the server is up: when a warmup
        fails at start-up, Triton 2.51 sometimes crashes on its way out (SIGSEGV) instead of printing the
        warmup's error; the load API reports it. A server that loads nothing at its start gets every one later.
        """
        names = self.names()
        later = [name for name in names if not loads_at_startup or any(has_warmup(v) for v in self.versions(name))]
        return [name for name in names if name not in later], later


class Owner(Protocol):
    """What :class:`RegistryView` reads of its ``Triton`` (pytriton/triton.py), each time it is asked."""

    _lock: threading.RLock
    _state: State
    _models: BoundModels
    _repository: Optional[pathlib.Path]
    _startup_models: List[str]
    _traces: ModelTraceSettings
    _wakeup: threading.Event

    def _versions(self, model_name: str) -> List[BoundModel]: ...

    def _model_names(self) -> List[str]: ...

    def _write_name(self, model_name: str) -> None: ...

    def _request_load(self, model_name: str) -> None: ...


class RegistryView:
    """What the supervisor and the backends see of a ``Triton``: the ``Registry`` protocol (:mod:`.backend`).

    A view: it holds nothing but its ``Triton`` and reads the ``Triton``'s state on every call, so what
    ``run()`` sets later (the repository, the start-up models, the state) is always current.
    """

    def __init__(self, owner: Owner) -> None:
        self._owner = owner

    @property
    def lock(self) -> threading.RLock:
        return self._owner._lock

    def running(self) -> bool:
        return self._owner._state is State.RUNNING

    def models(self) -> List[BoundModel]:
        return list(self._owner._models.values())

    def versions(self, model_name: str) -> List[BoundModel]:
        return self._owner._versions(model_name)

    def model_names(self) -> List[str]:
        return self._owner._model_names()

    def repository(self) -> Optional[pathlib.Path]:
        return self._owner._repository

    def startup_models(self) -> List[str]:
        return self._owner._startup_models

    def write_name(self, model_name: str) -> None:
        self._owner._write_name(model_name)

    def request_load(self, model_name: str) -> None:
        self._owner._request_load(model_name)

    def apply_trace_settings(self, model_names: Sequence[str]) -> None:
        self._owner._traces.apply(model_names)

    def wake(self) -> None:
        self._owner._wakeup.set()


def retire(
    removed: Sequence[BoundModel],
    others_remain: bool,
    repository: Optional[pathlib.Path],
    deadline: float,
    running: bool,
) -> None:
    """``unbind``'s end: wait for ``removed``'s batches (until ``deadline``), stop their workers, remove their files.

    ``others_remain``: other versions of the name stay bound (its shared files stay); ``running``: the
    server had the name loaded, so an unloaded name's stubs are waited for first (``wait_detached``).
    """
    if running and not others_remain:
        wait_detached(removed, deadline)
    while any(model.busy for model in removed) and time.monotonic() < deadline:
        time.sleep(0.01)
    for model in removed:
        model.stop_workers()
        if repository is not None:
            model.remove_version_files(repository)
    if not others_remain and repository is not None:
        removed[0].remove_files(repository)


def has_warmup(model: BoundModel) -> bool:
    """True if ``model`` is warmed up when it loads (Triton's ``model_warmup`` or pytriton's own)."""
    return bool(model.config.model_warmup or model.direct_warmup)


def attach_thread_context(model: BoundModel, context: TritonContext) -> None:
    """Let decorators find the model config: ``__triton_context__`` on each callable (or its instance).

    Thread instances only: a process or backend instance's callable runs elsewhere and gets its
    context there (``_process_child``, ``_backend_kind``). The context is keyed by the callable,
    so recording those here too let binding one callable on another kind change the config its
    thread-instance model's decorators read.
    """
    if model.instance_kind != "thread":
        return
    for func in model.infer_funcs:
        attach_context(func, context, model.config)


def check_stub_support(model: BoundModel, stub_numpy2: bool) -> None:
    """Refuse a model with BYTES tensors where the stub runs numpy 2 and cannot handle them here."""
    if stub_numpy2 and model.has_bytes_tensors:
        problem = _stub_bytes.numpy2_problem()  # the stub runs with this process's numpy
        if problem:
            raise PyTritonBadParameterError(
                f"Model {model.name!r} declares BYTES (string) tensors, which Triton's Python backend stub "
                f"cannot handle here: {problem}"
            )


def load_interrupted(
    model_name: str,
    exc: BaseException,
    server: Optional[TritonServerProcess],
    versions: Sequence[BoundModel],
    restarted: bool,
) -> PyTritonModelConfigError:
    """The error for a load whose connection broke: usually the server died while loading the model.

    ``server``: the local server, if there is one (a remote one's death cannot be seen here);
    ``restarted``: the supervisor restarts a server that dies now.
    """
    deadline = time.monotonic() + 2.0
    while server is not None and server.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)  # a crashing server takes a moment to be reaped
    died = server is not None and not server.is_alive()
    message = f"Triton could not load model {model_name!r}: " + (
        "tritonserver died while loading it" if died else f"the connection broke ({type(exc).__name__}: {exc})"
    )
    if died and versions and versions[0].config.model_warmup:
        message += (
            ". Triton 2.51 sometimes crashes when a model's warmup fails; the callable's error, if it "
            "raised one, is logged by 'pytriton.proxy'"
        )
    if died and restarted:
        message += "; pytriton restarts the server with the other models"
    return PyTritonModelConfigError(message + ".")
