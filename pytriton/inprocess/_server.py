"""``Server``, ``Options`` and ``Model``: an in-process Triton on the bundled server library.

Lifetime: ``Server.start()`` creates the ``TRITONSERVER_Server`` (``ServerNew``); ``stop()`` stops and
deletes it (``ServerStop`` then ``ServerDelete``, each once, the delete only after Triton's model
deleters exited: _teardown.py) and is harmless when repeated. The
Python backend starts its model stubs as child processes; they inherit this process's environment,
so ``start()`` puts the stub's ``python3`` first on ``PATH`` and this interpreter's ``libpython``
first on ``LD_LIBRARY_PATH`` (in ``os.environ``) while a server runs, and restores both when the
last server stops. Each server gets its own shared-memory prefix for the Python backend, so its
regions can be told apart and none is left after ``stop()``.

Unit test: tests/unit/test_inprocess.py (options, a server before start); started servers:
tests/e2e/test_inprocess_server.py.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import functools
import itertools
import json
import logging
import os
import pathlib
import threading
import time
from typing import (
    Any,
    Callable,
    ContextManager,
    Dict,
    FrozenSet,
    Iterator,
    List,
    Mapping,
    Optional,
    Set,
    Tuple,
    TypeVar,
    Union,
    cast,
)

from pytriton._platform import hardening, launch
from pytriton.inprocess import _lib, _pool, _request, _settle, _stopped_stubs, _teardown
from pytriton.inprocess._enums import (
    MetricFormat,
    ModelBatchFlag,
    ModelIndexFlag,
    ModelTxnPropertyFlag,
    ParameterType,
)
from pytriton.inprocess._errorlog import ErrorLog
from pytriton.inprocess._errors import (
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
)
from pytriton.inprocess._options import Options
from pytriton.inprocess._scratch import BACKEND_SCRATCH
from pytriton.proxy.stubside import _segments
from pytriton.server._shm_guard import ShmGuard

_DEFAULT_READY_TIMEOUT_S = 300.0
_LOAD_AFTER_UNLOAD_WAIT_S = 120.0  # how long load() waits for an unload of the same model to finish
_TEARDOWN_WAIT_S = 10.0  # how long stop() waits for Triton's model deleters before ServerDelete
_SETTLE_WAIT_S = 10.0  # how long a load waits for the threads it started to be idle (_settle.py)
_UNDELETED: List[int] = []  # stopped servers left undeleted because models were still being destroyed


def _unloaded(states: List[str]) -> bool:
    """Every version of the model is destroyed (or never loaded): Triton's state after its model deleter ran."""
    return all(state in ("", "UNAVAILABLE") for state in states)


# Started servers are referenced here until stopped (explicitly or at exit): a server is never
# stopped by garbage collection, which could happen on one of Triton's own callback threads.
_LIVE: Set[Server] = set()
_LIVE_LOCK = threading.Lock()
LOGGER = logging.getLogger(__name__)
_SERVER_IDS = itertools.count(1)


class _StubEnvironment:
    """Reference-counted changes to ``os.environ`` that the backend stubs need (see module doc)."""

    _lock = threading.Lock()
    _users = 0
    _saved: Dict[str, Optional[str]] = {}
    # The Python backend is initialised once while any server lives, with the first server's
    # options: later servers' stubs use that server's shared-memory prefix.
    backend_prefix: Optional[str] = None
    _guard: Optional[ShmGuard] = None

    @classmethod
    def acquire(cls, shm_prefix: str) -> str:
        """Prepare the environment; return the shared-memory prefix the Python backend will use."""
        from pytriton.server.distribution import find_server, shared_libpython_dir, stub_environment

        with cls._lock:
            if cls._users == 0:
                from pytriton.exceptions import PyTritonError

                try:
                    stub_bin = stub_environment().bin_dir
                    dirs = [shared_libpython_dir(), *find_server().library_dirs]
                except PyTritonError as exc:  # no stub environment, static libpython, no install
                    raise UnavailableError(str(exc)) from exc
                cls.backend_prefix = shm_prefix
                # The regions are created 0644 inside this process (docs/security.md): narrow them on sight,
                # unless PYTRITON_HARDENING=off (strict: a guard that cannot start fails the start).
                protections = hardening.Protections(hardening.resolve())
                if protections.enabled:
                    guard = ShmGuard(shm_prefix)
                    if not guard.start():
                        protections.refused(hardening.SHM_GUARD, "inotify is unavailable here")
                    cls._guard = guard
                cls._saved = {name: os.environ.get(name) for name in ("PATH", "LD_LIBRARY_PATH")}
                os.environ["PATH"] = os.pathsep.join([str(stub_bin), os.environ.get("PATH", "")])
                existing = os.environ.get("LD_LIBRARY_PATH")
                os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
                    [str(d) for d in dirs] + ([existing] if existing else [])
                )
            cls._users += 1
            return cls.backend_prefix or shm_prefix

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls._users = max(cls._users - 1, 0)
            if cls._users == 0:
                if cls.backend_prefix:
                    _remove_orphan_regions(cls.backend_prefix)
                BACKEND_SCRATCH.remove()  # left only by a backend that could not finalize (_scratch.py)
                cls.backend_prefix = None
                if cls._guard is not None:
                    cls._guard.stop()
                    cls._guard = None
                for name, value in cls._saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
                cls._saved = {}


def _remove_orphan_regions(prefix: str) -> None:
    """Unlink the Python backend's ``/dev/shm`` regions named ``prefix*`` once no server is left.

    A stub normally removes its region when its model unloads; one that died (or whose model could
    not unload within the exit timeout) leaves it behind. The prefix is unique to this process.
    """
    shm = pathlib.Path("/dev/shm")
    if not prefix or not shm.is_dir():
        return
    for entry in shm.glob(f"{prefix}*"):
        try:
            entry.unlink()
        except OSError:
            LOGGER.warning("could not remove the shared-memory region %s", entry)


def _message_json(lib: _lib.Library, message: int) -> object:
    """Parse and delete a ``TRITONSERVER_Message``."""
    try:
        base = ctypes.c_char_p()
        size = ctypes.c_size_t()
        lib.check(lib.TRITONSERVER_MessageSerializeToJson(message, ctypes.byref(base), ctypes.byref(size)))
        return json.loads(ctypes.string_at(base, size.value).decode())
    finally:
        lib.check(lib.TRITONSERVER_MessageDelete(message))


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _changes_models(method: _Method) -> _Method:
    """Model-control methods: the released requests kept for reuse are dropped before and after.

    A kept request holds the model object it was created for (see pytriton/inprocess/_pool.py).
    """

    @functools.wraps(method)
    def wrapper(self: Server, *args: object, **kwargs: object) -> Any:
        self._requests.invalidate(self._lib)
        try:
            return method(self, *args, **kwargs)
        finally:
            self._requests.invalidate(self._lib)

    return cast(_Method, wrapper)


class Server:
    """An in-process Triton server. Create it with options, then ``start()``; ``stop()`` when done."""

    def __init__(self, options: Optional[Options] = None, **kwargs: Any) -> None:
        if options is None:
            options = Options(**kwargs)
        elif kwargs:
            options = dataclasses.replace(options, **kwargs)
        self.options = options
        self._handle: Optional[int] = None
        self._lock = threading.RLock()
        self._lib: Optional[_lib.Library] = None
        self._env_held = False
        self._own_shm_prefix = f"pytriton-inproc-{os.getpid()}-{next(_SERVER_IDS)}-"
        self._error_log: Optional[ErrorLog] = None  # Triton's error lines when no log is configured
        self._shm_prefix = self._own_shm_prefix
        # Released plain requests for reuse (pytriton/inprocess/_pool.py); a new pool per start().
        self._requests = _pool.RequestPool()
        # Whether this server finds the Python backend's /tmp directory itself (_scratch.py); False
        # when its owner does (Triton(embedded=True)), as two windows in one process would wait on each other.
        self._tracks_scratch = True
        # Repositories added by register_model_repository (absolute path -> {model name: subdirectory}):
        # with the options' ones, where this server's stubs find their model files (_stopped_stubs.py).
        self._registered: Dict[str, Dict[str, str]] = {}

    # -- internals used by Model and the iterators --------------------------------------------------
    def _library(self) -> _lib.Library:
        if self._lib is None:
            self._lib = _lib.library()
        return self._lib

    def _running(self) -> bool:
        return self._handle is not None

    def _scratch_window(self) -> ContextManager[None]:
        """Around a call that may load the first Python model of this process (see _scratch.py)."""
        return BACKEND_SCRATCH.window(self._shm_prefix) if self._tracks_scratch else contextlib.nullcontext()

    @contextlib.contextmanager
    def _settling(self, what: str) -> Iterator[None]:
        """Around a call that creates model instances: on success, wait until the threads it started are idle.

        Unloading a model whose backend thread is still finishing the load's last payload crashes the
        server library (gate ``unload-right-after-load``, _settle.py); so a load returns only after
        that thread is back in its wait.
        """
        before = _settle.tasks()
        yield
        left = _settle.wait_until_idle(before, time.monotonic() + _SETTLE_WAIT_S)
        if left:
            LOGGER.debug("%s: %d new Triton threads not seen idle within %.0f s", what, len(left), _SETTLE_WAIT_S)

    def _model_directories(self, model_name: Optional[str] = None) -> List[str]:
        """This server's repositories, or with ``model_name`` that model's directory in each of them."""
        repositories = self.options.model_repository
        paths = [repositories] if isinstance(repositories, str) else repositories
        found: Dict[str, Dict[str, str]] = {os.path.abspath(path): {} for path in paths}
        found.update(self._registered)
        if model_name is None:
            return list(found)
        return [os.path.join(path, names.get(model_name, model_name)) for path, names in found.items()]

    def _end_stopped_stubs(self, why: str, model_name: Optional[str] = None) -> None:
        """Before Triton finalizes instances: kill this server's stopped stubs outside the backend's locks.

        Triton would SIGKILL them wherever they are, which aborts the process if one holds a lock of
        the backend's shared memory (_stopped_stubs.py; gate ``stub-killed-in-lock``).
        """
        try:
            _stopped_stubs.end_stopped_stubs(self._shm_prefix, self._model_directories(model_name), why)
        except Exception:  # noqa: BLE001 - never keeps the stop or unload from happening
            LOGGER.exception("%s: could not look for stopped stubs", why)

    def _handle_or_raise(self) -> int:
        handle = self._handle
        if handle is None:
            raise InvalidArgumentError("The in-process server is not started (call start(), or it was stopped)")
        return handle

    @property
    def shm_region_prefix(self) -> str:
        """Name prefix of the Python backend's shared-memory regions of this server's stubs.

        While another in-process server is alive the backend keeps that server's prefix.
        """
        return self._shm_prefix

    # -- lifecycle --------------------------------------------------------------------------------
    def start(
        self, wait_until_ready: bool = False, polling_interval: float = 0.1, timeout: Optional[float] = None
    ) -> Server:
        """Create the server and load models as the control mode says; optionally wait for ready.

        Raises :class:`InvalidArgumentError` if already started or the options are invalid, the
        mapped Triton error if a model fails to load (with ``exit_on_error``), and
        :class:`UnavailableError` if not ready within ``timeout`` (None: 300 s). Like :meth:`load`,
        it returns once the threads Triton started are idle (_settle.py).
        """
        with self._lock:
            if self._handle is not None:
                raise InvalidArgumentError("The in-process server is already started")
            lib = self._library()
            # Regions of in-process servers (and Triton user processes) that died without cleaning up.
            _segments.sweep_dead_owners()
            if lib.path is not None:
                _lib.preload_backends(pathlib.Path(self.options.backend_directory), lib.path.parent)
            protections = hardening.Protections(hardening.resolve())
            options_handle = ctypes.c_void_p()
            lib.check(lib.TRITONSERVER_ServerOptionsNew(ctypes.byref(options_handle)))
            try:
                # The prefix the options ask for, if any (Triton(embedded=True) passes its own), so that
                # shm_region_prefix and the clean-up at the last stop name the regions really created.
                python_backend = self.options.backend_configuration.get("python", {})
                requested = str(python_backend.get("shm-region-prefix-name", self._own_shm_prefix))
                self._shm_prefix = _StubEnvironment.acquire(requested)
                self._env_held = True
                try:
                    self.options._apply(lib, int(options_handle.value or 0), self._own_shm_prefix)
                    if not (self.options.log_error or self.options.log_file):  # keep the errors (_errorlog)
                        self._error_log = ErrorLog()
                        lib.check(
                            lib.TRITONSERVER_ServerOptionsSetLogFile(options_handle, self._error_log.path.encode())
                        )
                        lib.check(lib.TRITONSERVER_ServerOptionsSetLogError(options_handle, True))
                except BaseException:
                    self._release_env()
                    raise
                server = ctypes.c_void_p()

                def create() -> None:
                    lib.check(lib.TRITONSERVER_ServerNew(ctypes.byref(server), options_handle))

                try:
                    with self._scratch_window(), self._settling("start"):
                        if protections.enabled:
                            # Created from a confined thread: the threads Triton starts from it (where the
                            # backend creates its regions and forks its stubs) have umask 077 and the chmod
                            # filter, so every region is 0600 from its first byte (docs/security.md); under
                            # strict a thread that cannot be confined fails the start before the server exists.
                            launch.call_confined(create, protections)
                        else:
                            protections.skipped(hardening.INPROCESS_MODES)
                            create()
                    LOGGER.debug("In-process server started: %s", protections.summary())
                except TritonError as exc:
                    failures = self._error_log.load_failures() if self._error_log is not None else []
                    self._release_env()
                    if "failed to load" in str(exc) and failures:
                        raise type(exc)(f"{exc}: " + "; ".join(failures)) from None
                    raise
                except BaseException:
                    if server.value:  # interrupted while the server was being created: it exists, unwanted
                        lib.TRITONSERVER_ServerDelete(server)
                    self._release_env()
                    raise
                self._requests = _pool.RequestPool()
                self._handle = server.value
                with _LIVE_LOCK:
                    _LIVE.add(self)
            finally:
                lib.check(lib.TRITONSERVER_ServerOptionsDelete(options_handle))

        if wait_until_ready:
            deadline = time.monotonic() + (timeout if timeout is not None else _DEFAULT_READY_TIMEOUT_S)
            while not self.ready():
                if time.monotonic() >= deadline:
                    raise UnavailableError(f"The in-process server was not ready within {timeout} s")
                time.sleep(polling_interval)
        return self

    def _release_env(self) -> None:
        if self._error_log is not None:
            self._error_log.remove()
            self._error_log = None
        if self._env_held:
            self._env_held = False
            _StubEnvironment.release()

    def stop(self) -> Server:
        """Stop the server, unload its models (their stubs exit) and free it. Repeating it is harmless.

        Returns as soon as the models are unloaded (about 2 s for Python-backend models here); only a
        model that cannot unload (for example one whose stub died) makes it wait ``exit_timeout``.
        The server is freed only once Triton's threads that destroy the models have exited (see
        _teardown.py); if one still runs 10 s later, the server is left in memory, with a WARNING,
        rather than freed under it (which could abort the process). A stub of this server that is
        stopped (SIGSTOP) is killed first, outside the backend's locks, with a WARNING: Triton would
        kill it wherever it is (_stopped_stubs.py).
        """
        with self._lock:
            handle, self._handle = self._handle, None
            if handle is None:
                return self
            with _LIVE_LOCK:
                _LIVE.discard(self)
            lib = self._library()
            self._requests.close(lib)  # idle requests hold their models: deleted before the stop
            before = _teardown.tasks()
            self._end_stopped_stubs("stop()")
            try:
                lib.check(lib.TRITONSERVER_ServerStop(handle))
            except InternalError as exc:  # e.g. "Exit timeout expired"
                LOGGER.warning("Triton stopped with an error: %s", exc)
            finally:
                try:
                    self._delete(lib, handle, before)
                finally:
                    self._release_env()
        return self

    def _delete(self, lib: _lib.Library, handle: int, before: Optional[FrozenSet[int]]) -> None:
        """``ServerDelete``, once the model deleters that the stop started have exited (see _teardown.py).

        One still running after ``_TEARDOWN_WAIT_S`` means a model is still being destroyed: the
        server is then left undeleted (its memory is kept until the process exits), never freed
        under that thread, which could abort the process.
        """
        left = _teardown.wait_for_new_tasks(before, time.monotonic() + _TEARDOWN_WAIT_S)
        if left:
            _UNDELETED.append(handle)
            LOGGER.warning(
                "Triton is still destroying models of the stopped in-process server after %.0f s (%d threads); "
                "the server is not deleted, so that they never use freed memory: its memory is kept until the "
                "process exits",
                _TEARDOWN_WAIT_S,
                len(left),
            )
            return
        lib.check(lib.TRITONSERVER_ServerDelete(handle))

    def __enter__(self) -> Server:
        if self._handle is None:
            self.start(wait_until_ready=True)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- server queries ------------------------------------------------------------------------------
    def _flag(self, function_name: str, *args: object) -> bool:
        lib = self._library()
        value = ctypes.c_bool()
        lib.check(getattr(lib, function_name)(self._handle_or_raise(), *args, ctypes.byref(value)))
        return bool(value.value)

    def live(self) -> bool:
        """True if the server is live (False once stopped)."""
        return self._running() and self._flag("TRITONSERVER_ServerIsLive")

    def ready(self) -> bool:
        """True if the server is ready (False once stopped)."""
        return self._running() and self._flag("TRITONSERVER_ServerIsReady")

    def _message(self, function_name: str, *args: object) -> Any:
        lib = self._library()
        message = ctypes.c_void_p()
        lib.check(getattr(lib, function_name)(self._handle_or_raise(), *args, ctypes.byref(message)))
        return _message_json(lib, int(message.value or 0))

    def metadata(self) -> Dict[str, Any]:
        """Server name, version and extensions."""
        result: Dict[str, object] = self._message("TRITONSERVER_ServerMetadata")
        return result

    def metrics(self, metric_format: MetricFormat = MetricFormat.PROMETHEUS) -> str:
        """Server metrics as text in ``metric_format``."""
        lib = self._library()
        metrics = ctypes.c_void_p()
        lib.check(lib.TRITONSERVER_ServerMetrics(self._handle_or_raise(), ctypes.byref(metrics)))
        try:
            base = ctypes.c_char_p()
            size = ctypes.c_size_t()
            lib.check(
                lib.TRITONSERVER_MetricsFormatted(metrics, int(metric_format), ctypes.byref(base), ctypes.byref(size))
            )
            return ctypes.string_at(base, size.value).decode()
        finally:
            lib.check(lib.TRITONSERVER_MetricsDelete(metrics))

    def model(self, model_name: str, model_version: int = -1) -> Model:
        """A :class:`Model` handle (not validated until used)."""
        self._handle_or_raise()
        return Model(self, model_name, model_version)

    def models(self, exclude_not_ready: bool = False) -> ModelDictionary:
        """Models the repositories know, keyed by ``(name, version)``."""
        flags = int(ModelIndexFlag.READY) if exclude_not_ready else 0
        index = self._message("TRITONSERVER_ServerModelIndex", flags)
        result = ModelDictionary()
        for entry in index:
            version = int(entry["version"]) if entry.get("version") else -1
            model = Model(self, entry["name"], version, entry.get("state"), entry.get("reason"))
            result[(model.name, model.version)] = model
        return result

    # -- model control -------------------------------------------------------------------------------
    @_changes_models
    def load(self, model_name: str, parameters: Optional[Dict[str, Union[str, int, bool, bytes]]] = None) -> Model:
        """Load (or reload) a model and wait until it is loaded (EXPLICIT control mode).

        ``parameters``: ``"config"`` (a JSON string or a dict) overrides the model config; ``bytes``
        values are file contents (``"file:1/model.py"``). Raises the mapped Triton error on failure.

        A version of the model that is still unloading (an ``unload()`` that did not wait) is waited
        for first, up to 120 s (``UnavailableError`` after that): loading the same model while
        Triton destroys the old one could crash the process (docs/inprocess.md). It returns once the
        threads Triton started for the model are idle (at most 10 s more), so that an ``unload()``
        or ``stop()`` right after it is safe (_settle.py).
        """
        lib = self._library()
        handle = self._handle_or_raise()
        self._wait_while_unloading(model_name)
        if not parameters:
            with self._scratch_window(), self._settling(f"load {model_name!r}"):
                lib.check(lib.TRITONSERVER_ServerLoadModel(handle, model_name.encode()))
            return Model(self, model_name)
        created: List[int] = []
        keep: List[object] = []
        try:
            for key, value in parameters.items():
                name = str(key).encode()
                if isinstance(value, dict):
                    value = json.dumps(value)
                if isinstance(value, bytes):
                    buffer = ctypes.create_string_buffer(value, len(value))
                    keep.append(buffer)
                    parameter = lib.TRITONSERVER_ParameterBytesNew(
                        name, ctypes.cast(buffer, ctypes.c_void_p), len(value)
                    )
                elif isinstance(value, bool):
                    holder_b = ctypes.c_bool(value)
                    keep.append(holder_b)
                    parameter = lib.TRITONSERVER_ParameterNew(
                        name, int(ParameterType.BOOL), ctypes.cast(ctypes.byref(holder_b), ctypes.c_void_p)
                    )
                elif isinstance(value, int):
                    holder_i = ctypes.c_int64(value)
                    keep.append(holder_i)
                    parameter = lib.TRITONSERVER_ParameterNew(
                        name, int(ParameterType.INT), ctypes.cast(ctypes.byref(holder_i), ctypes.c_void_p)
                    )
                elif isinstance(value, str):
                    holder_s = ctypes.c_char_p(value.encode())
                    keep.append(holder_s)
                    parameter = lib.TRITONSERVER_ParameterNew(name, int(ParameterType.STRING), holder_s)
                else:
                    raise InvalidArgumentError(f"Load parameter {key!r} must be str, int, bool, bytes or dict")
                if not parameter:
                    raise InvalidArgumentError(f"Triton refused load parameter {key!r}")
                created.append(parameter)
            array = (ctypes.c_void_p * len(created))(*created)
            with self._scratch_window(), self._settling(f"load {model_name!r}"):
                lib.check(
                    lib.TRITONSERVER_ServerLoadModelWithParameters(handle, model_name.encode(), array, len(created))
                )
        finally:
            for parameter in created:
                lib.TRITONSERVER_ParameterDelete(parameter)
        return Model(self, model_name)

    @_changes_models
    def unload(
        self,
        model: Union[str, Model],
        unload_dependents: bool = False,
        wait_until_unloaded: bool = False,
        polling_interval: float = 0.1,
        timeout: Optional[float] = None,
    ) -> None:
        """Unload a model (and its dependents); optionally wait (bounded by ``timeout``) until it is gone.

        With ``wait_until_unloaded``, returns once this server's model index reports every version of
        the model ``UNAVAILABLE``: Triton sets that state only after it destroyed the old model (its
        instances, their stubs, the backend's model state), so an immediate ``load()`` of the same
        model cannot race that destruction (docs/inprocess.md, "Known limitations of the server library"). Only this
        server's model is waited for, whatever other servers of the process serve. Raises
        ``UnavailableError`` when that takes longer than ``timeout`` (None: 300 s). A stopped stub of
        the model is killed first, outside the backend's locks, as in :meth:`stop`.
        """
        lib = self._library()
        handle = self._handle_or_raise()
        name = model.name if isinstance(model, Model) else model
        function = (
            lib.TRITONSERVER_ServerUnloadModelAndDependents if unload_dependents else lib.TRITONSERVER_ServerUnloadModel
        )
        self._end_stopped_stubs(f"unload({name!r})", name)
        lib.check(function(handle, name.encode()))
        if wait_until_unloaded:
            deadline = time.monotonic() + (timeout if timeout is not None else _DEFAULT_READY_TIMEOUT_S)
            states = self._wait_for_states(name, _unloaded, deadline, polling_interval)
            if states is not None:
                raise UnavailableError(
                    f"Model {name!r} was not unloaded within {timeout} s (its versions are {', '.join(states)}); "
                    "a load of it now could race Triton's destruction of the old model"
                )

    def _wait_while_unloading(self, name: str) -> None:
        """Before a load: wait until no version of ``name`` is UNLOADING in this server (see :meth:`load`)."""
        deadline = time.monotonic() + _LOAD_AFTER_UNLOAD_WAIT_S
        states = self._wait_for_states(name, lambda states: "UNLOADING" not in states, deadline, 0.05)
        if states is not None:
            raise UnavailableError(
                f"Model {name!r} is still unloading after {_LOAD_AFTER_UNLOAD_WAIT_S:.0f} s; loading it again while "
                "Triton destroys the old model could crash the process: try again once it is unloaded"
            )

    def _states(self, name: str) -> Optional[List[str]]:
        """The states of ``name``'s versions in this server's model index ("" for a version without one).

        None when the index does not list the model (its repository is no longer registered).
        """
        entries = [entry for entry in self._message("TRITONSERVER_ServerModelIndex", 0) if entry.get("name") == name]
        return [str(entry.get("state") or "") for entry in entries] if entries else None

    def _wait_for_states(
        self, name: str, done: Callable[[List[str]], bool], deadline: float, interval_s: float
    ) -> Optional[List[str]]:
        """Poll the model index until ``done(states)``; None then, else the states seen at ``deadline``.

        A model the index does not list is done once it is not ready (the only sign left of it).
        """
        while True:
            states = self._states(name)
            if states is None:
                states = ["READY"] if Model(self, name).ready() else []
            if done(states):
                return None
            if time.monotonic() >= deadline:
                return states
            time.sleep(interval_s)

    @_changes_models
    def poll_model_repository(self) -> Server:
        """Apply repository changes (POLL control mode)."""
        lib = self._library()
        handle = self._handle_or_raise()
        with self._scratch_window(), self._settling("repository poll"):
            lib.check(lib.TRITONSERVER_ServerPollModelRepository(handle))
        return self

    @_changes_models
    def register_model_repository(self, repository_path: str, name_mapping: Optional[Dict[str, str]] = None) -> None:
        """Add a repository (EXPLICIT mode); ``name_mapping`` maps subdirectory names to model names."""
        lib = self._library()
        handle = self._handle_or_raise()
        names = {model_name: subdir for subdir, model_name in (name_mapping or {}).items()}
        self._registered[os.path.abspath(repository_path)] = names
        created: List[int] = []
        try:
            for subdir, model_name in (name_mapping or {}).items():
                value = ctypes.c_char_p(model_name.encode())
                created.append(lib.TRITONSERVER_ParameterNew(subdir.encode(), int(ParameterType.STRING), value))
            array = (ctypes.c_void_p * max(len(created), 1))(*created)
            lib.check(
                lib.TRITONSERVER_ServerRegisterModelRepository(
                    handle, os.path.abspath(repository_path).encode(), array, len(created)
                )
            )
        finally:
            for parameter in created:
                lib.TRITONSERVER_ParameterDelete(parameter)

    @_changes_models
    def unregister_model_repository(self, repository_path: str) -> Server:
        """Remove a repository added at start or with :meth:`register_model_repository`."""
        lib = self._library()
        lib.check(
            lib.TRITONSERVER_ServerUnregisterModelRepository(
                self._handle_or_raise(), os.path.abspath(repository_path).encode()
            )
        )
        return self


@atexit.register
def _stop_all() -> None:
    """At interpreter exit, stop the servers the program left running (their stubs exit with them)."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        try:
            server.stop()
        except Exception:  # noqa: BLE001
            LOGGER.exception("stopping an in-process server at exit failed")


class ModelDictionary(Dict[Tuple[str, int], "Model"]):
    """``models()`` result: ``(name, version) -> Model``."""


class Model:
    """A model of a running server, by name and version (-1: the server's choice)."""

    def __init__(
        self, server: Server, name: str, version: int = -1, state: Optional[str] = None, reason: Optional[str] = None
    ):
        self._server = server
        self.name = name
        self.version = version
        self.state = state
        self.reason = reason

    def __repr__(self) -> str:
        return repr({"name": self.name, "version": self.version, "state": self.state})

    def _key(self) -> Tuple[int, bytes, int]:
        return self._server._handle_or_raise(), self.name.encode(), int(self.version)

    def create_request(self, **kwargs: Any) -> _request.InferenceRequest:
        """A new :class:`InferenceRequest` for this model."""
        return _request.InferenceRequest(model=self, **kwargs)

    def _make_request(
        self, inference_request: Optional[_request.InferenceRequest], kwargs: Mapping[str, object]
    ) -> _request.InferenceRequest:
        if inference_request is None:
            return self.create_request(**kwargs)
        if kwargs:
            raise InvalidArgumentError("Pass either an InferenceRequest or keyword arguments, not both")
        return inference_request

    def infer(
        self,
        inference_request: Optional[_request.InferenceRequest] = None,
        raise_on_error: bool = True,
        **kwargs: object,
    ) -> _request.ResponseIterator:
        """Send a request; iterate the result for its responses (one, or several for decoupled models)."""
        request = self._make_request(inference_request, kwargs)
        return _request.ResponseIterator(self, request, request.response_queue, raise_on_error)

    def async_infer(
        self,
        inference_request: Optional[_request.InferenceRequest] = None,
        raise_on_error: bool = True,
        **kwargs: object,
    ) -> _request.AsyncResponseIterator:
        """Like :meth:`infer`, from a coroutine: responses arrive in the running event loop."""
        request = self._make_request(inference_request, kwargs)
        return _request.AsyncResponseIterator(self, request, request.response_queue, raise_on_error)

    def ready(self) -> bool:
        """True if this model (version) is loaded and ready; False if unknown."""
        lib = self._server._library()
        value = ctypes.c_bool()
        try:
            lib.check(lib.TRITONSERVER_ServerModelIsReady(*self._key(), ctypes.byref(value)))
        except (NotFoundError, UnavailableError):
            return False
        return bool(value.value)

    def metadata(self) -> Dict[str, Any]:
        """Name, versions, platform, inputs and outputs."""
        result: Dict[str, object] = self._server._message("TRITONSERVER_ServerModelMetadata", *self._key()[1:])
        return result

    def config(self, config_version: int = 1) -> Dict[str, Any]:
        """The model configuration as a dictionary."""
        result: Dict[str, object] = self._server._message(
            "TRITONSERVER_ServerModelConfig", *self._key()[1:], config_version
        )
        return result

    def statistics(self) -> Dict[str, Any]:
        """Inference and batch statistics."""
        result: Dict[str, object] = self._server._message("TRITONSERVER_ServerModelStatistics", *self._key()[1:])
        return result

    def _properties(self, function_name: str) -> int:
        lib = self._server._library()
        flags = ctypes.c_uint32()
        voidp = ctypes.c_void_p()
        lib.check(getattr(lib, function_name)(*self._key(), ctypes.byref(flags), ctypes.byref(voidp)))
        return flags.value

    def batch_properties(self) -> ModelBatchFlag:
        """``FIRST_DIM`` if the model batches along the first dimension, else ``UNKNOWN``."""
        return ModelBatchFlag(self._properties("TRITONSERVER_ServerModelBatchProperties"))

    def transaction_properties(self) -> ModelTxnPropertyFlag:
        """``DECOUPLED`` for decoupled (streaming) models, else ``ONE_TO_ONE``."""
        flags = self._properties("TRITONSERVER_ServerModelTransactionProperties")
        return (
            ModelTxnPropertyFlag.DECOUPLED
            if flags & ModelTxnPropertyFlag.DECOUPLED
            else ModelTxnPropertyFlag.ONE_TO_ONE
        )
