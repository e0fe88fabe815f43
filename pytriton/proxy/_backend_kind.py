"""Backend instances: each instance's callable runs inside its Python-backend stub process.

``Triton.bind(..., instance_kind="backend")`` runs the callable where a plain Python-backend model
runs its ``execute``: in the ``triton_python_backend_stub`` process Triton starts for the instance.
A batch then never leaves the stub: no socket message, no shared-memory arena, no second process
to wake (docs/architecture.md, "Instances: threads or processes").

This module has two sides:

- in the user's process, :func:`check_backend_binding` refuses what cannot work and :func:`pack`
  pickles every instance's callable at ``bind()`` (with :func:`pytriton.proxy._process.dump_callable`,
  so the same callables travel, with the same clear errors), the model's configuration, the output
  strictness and what the stub needs to import the callable's modules as this process does
  (:func:`pytriton.proxy._process.preparation_data`). ``BoundModel.write_repository`` writes the
  result as :data:`PAYLOAD_FILE` (mode 0600) into the model version's directory;
- inside the stub, ``proxy/stubside/_inline.py`` puts the user's ``sys.path`` behind the stub's own,
  imports this module and builds an :class:`InlineRunner` for its instance slot. The runner unpickles
  the callable, attaches a ``TritonContext`` (so the decorators find the model configuration), turns
  plain arrays into :class:`~pytriton.proxy.types.Request` objects, calls the callable (plain,
  ``async``, generators) and checks the outputs with the same ``OutputChecker`` as the other kinds.
  Nothing here touches ``triton_python_backend_utils``: the stub side owns that (unit-testable with
  plain arrays).

The user's process still runs one ``InstanceWorker`` per slot, with :func:`not_here` as its
callable: the stub connects and says hello as for the other kinds and then sends no batch. That
idle connection is how a stub that dies is noticed and replaced (self-healing), and how ``stop()``
sees the instance attached.

Unit tests: tests/unit/test_backend_kind.py; with a server: tests/e2e/test_backend_instances.py.
"""

from __future__ import annotations

import inspect
import io
import logging
import os
import pickle
import site
import sys
import threading
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncGenerator,
    Callable,
    Dict,
    Generator,
    List,
    NoReturn,
    Optional,
    Sequence,
    Tuple,
)

import numpy as np
import numpy.typing as npt

from pytriton._platform import native
from pytriton.exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonUnrecoverableError
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy import _process, _tracing
from pytriton.proxy._admission import Admission
from pytriton.proxy._context import TritonContext, attach_context
from pytriton.proxy._outputs import OutputChecker
from pytriton.proxy._worker import InstanceWorker, error_text
from pytriton.proxy.stubside import _portable_pickle
from pytriton.proxy.stubside._backend_page import Page
from pytriton.proxy.stubside._messages import STUCK_SIGNAL
from pytriton.proxy.types import Request, _wire_request

if TYPE_CHECKING:
    import asyncio
    import socket

    from pytriton.proxy.stubside._messages import SequenceFields
    from pytriton.proxy.stubside._pb_types import PbRequest

LOGGER = logging.getLogger(__name__)

# Written next to pytriton_private.json in each model version directory (mode 0600); its presence
# makes the stub's model.py load the inline model (proxy/_stub_model.py).
PAYLOAD_FILE = "pytriton_backend.pkl"
# How often the user's process reads a backend model's page for a PyTritonUnrecoverableError (BackendInstance).
UNRECOVERABLE_POLL_S = 0.1
# How long a stuck call may take to end after its stub got the watch's signal before the stub is killed.
STUCK_GRACE_S = 2.0
_FORMAT = 1  # the payload layout; a stub refuses one it does not know


def check_backend_binding(model: str, *, tcp: bool, execution_timeout_s: Optional[float]) -> None:
    """Refuse, with what to do instead, a backend model that cannot work as configured."""
    if tcp:
        raise PyTritonBadParameterError(
            f"Model {model!r}: instance_kind='backend' runs the callable inside the server's stub, which must import "
            "your modules from this host; RemoteTriton(transport='tcp') serves a server that may run elsewhere. "
            "Use instance_kind='thread' or 'process' there."
        )
    if execution_timeout_s is not None:
        raise PyTritonBadParameterError(
            f"Model {model!r}: ModelConfig.execution_timeout_s cannot be enforced for instance_kind='backend': the "
            "callable runs on the stub's own thread, which nothing can interrupt. Remove the timeout, or bind with "
            "instance_kind='thread' or 'process'."
        )


def pack(callables: Sequence[bytes], config: TritonModelConfig, strict: bool) -> bytes:
    """The payload of :data:`PAYLOAD_FILE`: the callables pickled at ``bind()``
    (``_process.dump_callable(..., kind="backend")``, whose errors say what to fix), the model's
    final configuration (the output checks and the decorators read it), the import settings and
    where pytriton's spans are exported (``_tracing.configure_export``)."""
    payload = {
        "format": _FORMAT,
        "callables": list(callables),
        "config": config,
        "strict": strict,
        "preparation": _process.preparation_data(callables),
        # Where this process would export pytriton's spans (TritonConfig.trace_config, in OpenTelemetry
        # mode): the stub makes this instance's spans and exports them there too, unless the callable's
        # modules configured a tracer provider of their own.
        "trace_export": (_tracing.State.export_url, dict(_tracing.State.export_resource))
        if _tracing.State.export_url
        else None,
    }
    buffer = io.BytesIO()
    _PayloadPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(payload)
    return buffer.getvalue()


class _PayloadPickler(_portable_pickle.PortablePickler):
    """Numpy scalar types (the config's dtypes) by dtype code: the stub may run another numpy major version."""

    def base_override(self, obj: object) -> object:  # pickle's reduce value, or NotImplemented
        return _process.reduce_numpy_type(obj)


class CallablePickler(_portable_pickle.PortablePickler, _process._CallablePickler):
    """The pickler of a backend instance's callable (``_process.dump_callable(..., kind="backend")``).

    The callable pickler's rules (decorators, the context left out), and numpy objects in the form
    every numpy major reads: the stub may run numpy 1.x while this process runs numpy 2
    (``stubside/_portable_pickle.py``). A numpy object that has no such form is labelled with its
    attribute, so that a stub that cannot rebuild it says which one and what to do.
    """

    def base_override(self, obj: object) -> object:
        return _process._CallablePickler.reducer_override(self, obj)


class BackendInstance(InstanceWorker):
    """The user-process side of one backend instance slot.

    An ``InstanceWorker`` whose callable is :func:`not_here`: its stub connects and says hello, so
    a stub's death is noticed (self-healing), and sends no batch. ``busy`` and ``last_active`` come
    from the model's status page, which the stub writes at each batch (``stubside/_backend_page.py``);
    a stub that died mid-batch leaves its flag set, so ``busy`` also needs a stub attached. Setting
    ``admission`` (the drain) starts the page's refusal with the admission's budget.
    """

    def __init__(self, *, page: Page, slot: int, **kwargs: Any):
        self._page = page
        self._slot = slot
        self._own_last_active = 0.0
        self._admission: Optional[Admission] = None
        self._watch_stop = threading.Event()
        self._watcher: Optional[threading.Thread] = None
        super().__init__(infer_func=not_here, **kwargs)

    def start(self, listener: Optional[socket.socket] = None) -> None:
        """Serve the stub's connection, and (slot 0 only: the page is the model's) watch for an unrecoverable error."""
        super().start(listener)
        if self._slot == 0 and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name=f"pytriton-{self._name}-page", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        """Poll the page (every ``UNRECOVERABLE_POLL_S``) until a stub reports PyTritonUnrecoverableError or stop()."""
        while not self._watch_stop.wait(UNRECOVERABLE_POLL_S):
            text = self._page.unrecoverable()
            if text is not None:
                self._on_unrecoverable(PyTritonUnrecoverableError(text))
                return

    def stop(self, timeout_s: float = 2.0) -> None:
        self._watch_stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout_s)
        super().stop(timeout_s)

    @property
    def busy(self) -> bool:
        return self._page.busy(self._slot) and self.connected

    def fail_stuck_call(self, text: str, older_than_s: float = 0.0) -> bool:
        """The call runs in the stub itself: signal the stub, whose handler fails the call; kill it if that fails.

        For pytriton/_serving/unresponsive.py. The stub's handler (``stubside/_inline.py``, ``_messages.STUCK_SIGNAL``)
        raises in the call, whose batch is then answered ``STUCK_TEXT`` with Triton's UNAVAILABLE code
        (HTTP 503, gRPC UNAVAILABLE) as for the other kinds, and the instance serves on. A call that does
        not end so within :data:`STUCK_GRACE_S` (blocked in native code, or a callable that swallows
        ``BaseException``) ends with the stub: it is killed, Triton fails the batch with its own error about
        the stub (HTTP 500), and the supervisor loads a new generation as for any dead stub, without unloading
        the model. False if no stub of this slot is attached and busy. ``text`` and ``older_than_s`` are
        the stub's own (a call younger than ``_messages.STUCK_MIN_AGE_S`` is left alone there).
        """
        if not self.busy:
            return False
        pids = self._stub_pids()
        before = self._page.last_active(self._slot)
        for pid in pids:  # a live connection: the pid is that stub's (or its zombie's), never reused meanwhile
            try:
                os.kill(pid, STUCK_SIGNAL)
            except ProcessLookupError:
                continue
        if pids:
            timer = threading.Timer(STUCK_GRACE_S, self._kill_if_still_stuck, args=(pids, before))
            timer.daemon = True
            timer.name = f"pytriton-{self._name}-stuck"
            timer.start()
        return bool(pids)

    def _stub_pids(self) -> List[int]:
        return [s.stub_pid for s in list(self._sessions) if s.connected and s.stub_pid and not s.retired]

    def _kill_if_still_stuck(self, pids: List[int], before: float) -> None:
        """Kill the stubs of ``pids`` still attached if the call the signal was to fail is still running."""
        if not self.busy or self._page.last_active(self._slot) != before:
            return  # the call ended (failed by the signal, or finished)
        for pid in set(pids) & set(self._stub_pids()):
            # Outside the backend's shared-memory locks: a stub killed holding one aborts tritonserver.
            if native.kill_outside_robust_locks(pid) == "gone":
                continue
            LOGGER.warning(
                "Model %s: instance %s: its call was failed as stuck (PYTRITON_UNRESPONSIVE_AFTER_S) but did not "
                "end within %.0f s (blocked in native code?); a backend instance's call runs in its stub, so the stub "
                "(pid %d) was killed and is replaced.",
                self._config.model_name,
                self._name,
                STUCK_GRACE_S,
                pid,
            )

    @property  # type: ignore[override]
    def last_active(self) -> float:
        return max(self._own_last_active, self._page.last_active(self._slot))

    @last_active.setter
    def last_active(self, value: float) -> None:
        self._own_last_active = value

    @property  # type: ignore[override]
    def admission(self) -> Optional[Admission]:
        return self._admission

    @admission.setter
    def admission(self, value: Optional[Admission]) -> None:
        self._admission = value
        if value is not None:
            self._page.refuse(value.remaining())


def not_here(requests: List[Request]) -> List[Dict[str, npt.NDArray[np.generic]]]:
    """The user-process worker's callable of a backend instance: batches run in the stub, never here."""
    raise PyTritonRuntimeError("pytriton: this model's instances run in the server's stub (instance_kind='backend')")


# -- inside the stub ----------------------------------------------------------------------------
def prepare_imports(preparation: Dict[str, Any]) -> None:
    """Make the user's modules importable in this stub as in the process that bound the model.

    The stub's own ``sys.path`` (its environment, whose numpy and ``triton_python_backend_utils``
    are already imported) stays first; the user's entries follow, site directories through
    ``site.addsitedir`` so that their ``.pth`` files (editable installs) apply. The working
    directory and the main module are those of the user's process, as for a worker process
    (``multiprocessing``'s spawn rules: the main module runs as ``__mp_main__``, here only when the
    callable refers to it, ``_process.preparation_data``).
    """
    for entry in preparation.get("sys_path", []):
        if not entry or entry in sys.path:
            continue
        if os.path.basename(entry.rstrip(os.sep)) in ("site-packages", "dist-packages"):
            site.addsitedir(entry)
        else:
            sys.path.append(entry)
    directory = preparation.get("dir")
    if directory:
        try:
            os.chdir(directory)
        except OSError:
            LOGGER.warning("pytriton: cannot enter the working directory %s in the stub", directory)
    main = {key: value for key, value in preparation.items() if key.startswith("init_main_from_")}
    if main:
        import multiprocessing.spawn

        _process.IN_WORKER_PROCESS = True  # a main module that starts Triton again gets a clear error
        multiprocessing.spawn.prepare(main)


class _CancelProbe(list):  # type: ignore[type-arg]  # of Triton's requests (PbRequest), or True
    """``Request.is_cancelled`` for a batch in the stub: asks Triton's request object (``is_cancelled()``) directly.

    The batch's Triton requests, in order; an item becomes ``True`` once that request is known to
    be cancelled. A list, so that making one per batch runs no Python code (most callables never
    ask; the stub's request path is short, see ``stubside/_inline.py``).
    """

    __slots__ = ()

    def __call__(self, index: int) -> bool:
        request = self[index]
        if request is True:
            return True
        try:
            cancelled = bool(request.is_cancelled())
        except Exception:  # noqa: BLE001 - a request Triton already released: nobody waits for it
            cancelled = True
        if cancelled:
            self[index] = True
        return cancelled

    def known(self, index: int) -> bool:
        return self[index] is True


class InlineRunner:
    """One instance's callable inside the stub: builds requests, calls, checks outputs.

    Lifetime: created once per stub by :meth:`load`; :meth:`close` closes the event loop an
    ``async`` callable used. Single-threaded: the stub calls ``execute`` on one thread.
    """

    def __init__(self, func: Callable[[List[Request]], object], config: TritonModelConfig, strict: bool):
        self.func = func
        # The stub's short path builds requests and their cancellation probe with these directly (_inline.py).
        self.new_request = _wire_request  # the short path's Request builder (stubside/_inline.py)
        self.probe_type = _CancelProbe
        self.config = config
        self.decoupled = bool(config.decoupled)
        self.checker = OutputChecker(config, strict)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        # The text of a PyTritonUnrecoverableError the callable raised, until the stub reports it.
        self.unrecoverable: Optional[str] = None

    @classmethod
    def load(cls, data: bytes, slot: int) -> InlineRunner:
        """The runner of instance ``slot`` from a :func:`pack` payload (imports the user's modules)."""
        payload = pickle.loads(data)
        if payload.get("format") != _FORMAT:
            raise RuntimeError("pytriton: the model's payload was written by another pytriton version; bind it again")
        prepare_imports(payload["preparation"])
        export = payload.get("trace_export")
        if export is not None:
            _tracing.State.export_url, _tracing.State.export_resource = export[0], dict(export[1])
        callables = payload["callables"]
        context = TritonContext()
        func = _process.load_callable(callables[slot % len(callables)], context)
        attach_context(func, context, payload["config"])
        return cls(func, payload["config"], bool(payload["strict"]))

    @staticmethod
    def request(
        data: Dict[str, npt.NDArray[np.generic]],
        parameters: Optional[Dict[str, object]],
        requested: Optional[List[str]],
        sequence: Optional[SequenceFields] = None,
        timeout_s: float = 0.0,
    ) -> Request:
        """One ``Request`` as the callable of any kind sees it."""
        return _wire_request(data, parameters, requested, timeout_s or None, None, 0, sequence)

    @staticmethod
    def attach_cancellation(requests: List[Request], triton_requests: Sequence[PbRequest]) -> None:
        """Make ``Request.is_cancelled()`` of ``requests[i]`` ask Triton's ``triton_requests[i]``."""
        probe = _CancelProbe(triton_requests)
        for index, request in enumerate(requests):
            request._probe = probe
            request._index = index

    def call(self, requests: List[Request]) -> object:
        """The callable's result: a list, or for a decoupled model possibly a (sync) iterator of results.

        A coroutine is run to its end on this runner's event loop; an async generator is turned
        into a plain iterator over it. Raises what the callable raises, and ``PyTritonRuntimeError``
        for a generator from a model that is not decoupled.
        """
        result = self.func(requests)
        return result if type(result) is list else self.resolve(result)

    def resolve(self, result: object) -> object:
        """What :meth:`call` returns for a callable's ``result`` that is not a list (a coroutine, a generator, ...)."""
        if inspect.iscoroutine(result):
            result = self._event_loop().run_until_complete(result)
        if inspect.isasyncgen(result):
            result = self._sync_stream(result)
        elif not inspect.isgenerator(result):
            return result
        if not self.decoupled:
            self.close_stream(result)
            raise PyTritonRuntimeError(
                f"Model {self.config.model_name!r} returned a generator but is not decoupled; "
                "bind it with ModelConfig(decoupled=True) to stream responses."
            )
        return result

    def _sync_stream(self, stream: AsyncGenerator[object, NoReturn]) -> Generator[object, None, None]:
        loop = self._event_loop()
        try:
            while True:
                try:
                    yield loop.run_until_complete(stream.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            loop.run_until_complete(stream.aclose())

    @staticmethod
    def is_stream(result: object) -> bool:
        return inspect.isgenerator(result)

    def close_stream(self, stream: Generator[object, NoReturn, object]) -> None:
        """Close a generator now, so its ``finally`` blocks run; errors are logged.

        A decoupled callable that returned one plain result is streamed as ``iter([result])``: a list
        iterator has nothing to close, so only generators are closed.
        """
        if not inspect.isgenerator(stream):
            return
        try:
            stream.close()
        except BaseException:  # noqa: BLE001
            LOGGER.exception("Model %s: closing the generator failed", self.config.model_name)

    def outputs(
        self, result: object, n_requests: int, requested: Optional[Sequence[Optional[List[str]]]] = None
    ) -> List[List[Tuple[str, npt.NDArray[np.generic]]]]:
        """Checked outputs per request (``OutputChecker``): ``[(name, array), ...]``."""
        return self.checker.check(result, n_requests, requested)

    def failure(self, exc: BaseException) -> str:
        """Log a failed batch with its traceback (to the server's log); the text clients get."""
        try:
            LOGGER.error("Model %s: inference callable failed", self.config.model_name, exc_info=exc)
        except Exception:  # noqa: BLE001 - e.g. a handler that cannot format the exception
            pass
        text = error_text(exc)
        if isinstance(exc, PyTritonUnrecoverableError):
            self.unrecoverable = text
        return text

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None or self._loop.is_closed():
            import asyncio  # only for async callables: the stub imports it when one runs, not before its first request

            self._loop = asyncio.new_event_loop()
        return self._loop

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()


def is_text(array: object) -> bool:
    """True for an output that Triton carries as BYTES (bytes, str or object arrays)."""
    return isinstance(array, np.ndarray) and array.dtype.kind in "OSU"
