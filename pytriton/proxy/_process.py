"""Process instances: each instance's callable in a worker process of its own.

``Triton.bind(..., instance_kind="process")`` serves every instance of a model from a child process
instead of a thread of the user's process, so pure-Python work of several instances runs in parallel
(each process has its own GIL). See docs/architecture.md, "Instances: threads or processes".

What runs where (one :class:`ProcessInstance` per instance slot):

- the user's process creates the slot's listening Unix socket (the path the stub connects to) and
  keeps it for the life of the instance, so a stub connecting while its worker restarts waits in
  the socket's backlog instead of being refused;
- the worker process (``_process_child.py``) gets that listening socket, a control socket and a
  status page as inherited file descriptors, and runs the same :class:`~pytriton.proxy._worker.InstanceWorker`
  as thread instances on it: the stub talks to the worker process directly, with no hop through the
  user's process;
- a monitor thread in the user's process (``pytriton-<model>-<slot>-process``) reads the control
  socket (readiness, log records, lost stubs, unrecoverable errors, replies), notices the worker's
  death (the control socket closes), logs it and starts a new worker process;
- the status page (a ``memfd``, never visible in ``/dev/shm``) is written by the worker at each
  batch start and end and read by the user's process (``busy``, ``connected``, ``last_active``),
  so the stop, unbind and healing logic see process instances as they see threads, without a
  message per batch.

Start method: a fresh interpreter (``sys.executable -c ...``), i.e. *spawn*, never ``fork``: the
user's process runs threads (workers, the supervisor, the server's log readers) and forking it would
copy their locks in whatever state they are. *forkserver* would start processes from a server
process, which then is their parent, so ``PR_SET_PDEATHSIG`` would no longer tie them to the user's
process. The child prepares its main module as ``multiprocessing`` does for spawn (the callable's
module is imported, ``__main__`` is the user's script run as ``__mp_main__``), so the same rules
apply: the code that starts Triton must sit under ``if __name__ == "__main__":``. The script is run
there only when the callable refers to it (:func:`preparation_data`).

Lifetime: every worker process is started from one long-lived thread (:class:`_Spawner`) and sets
``PR_SET_PDEATHSIG`` (the kernel kills it when that thread, i.e. the user's process, dies) and
lives in its own session (a Ctrl-C in the terminal reaches only the user's process, which stops it
in order). :meth:`ProcessInstance.stop` asks the worker to stop, kills it if it does not, and closes
every descriptor; the socket directory and segments are removed by the owner (``BoundModel``).

Unit tests: tests/unit/test_process_instances.py; with a server: tests/e2e/test_process_instances.py.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import io
import itertools
import logging
import mmap
import os
import pickle
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
import types
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union, cast

import numpy as np

from pytriton._exit import describe_exit
from pytriton.exceptions import PyTritonBadParameterError, PyTritonUnrecoverableError
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy import _control, _stub_watch, _tracing
from pytriton.proxy._context import TritonContext
from pytriton.proxy._worker import _process_running
from pytriton.proxy.stubside import _arena

if TYPE_CHECKING:
    from pytriton.proxy._admission import Admission

LOGGER = logging.getLogger(__name__)

INSTANCE_KINDS = ("thread", "process", "backend")
READY_TIMEOUT_S = 120.0  # a worker process imports the user's modules (torch can take a while)
STOP_TIMEOUT_S = 2.0
MAX_START_FAILURES = 5  # consecutive worker processes that died before being ready: give up
# The exit code of a worker process that ended itself because a call ran past the execution timeout
# (_process_child._replace): it is replaced like any dead worker, and logged as such, not as a crash.
EXIT_REPLACED = 75
_RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 4.0)
# Set in a worker process while it imports the user's main module (see ProcessInstance.launch).
IN_WORKER_PROCESS = False


def refuse_in_worker() -> None:
    """Raise ``PyTritonBadParameterError`` when this process runs a callable for pytriton (a worker
    process, or a backend instance's stub) and the user's main module, imported there to find the
    callable, tries to start a server or a worker: without this it would start a second server from
    inside the first one's stub."""
    if IN_WORKER_PROCESS:
        raise PyTritonBadParameterError(
            "pytriton imported your main module to find the inference callable (in a worker process of "
            "instance_kind='process', or in the server's stub for instance_kind='backend'), and that module "
            'starts Triton again. Put the code that creates Triton and binds models under `if __name__ == "__main__":` '
            "(as with multiprocessing's spawn), or move the callable into a module of its own."
        )


def check_instance_kind(value: object, model: str) -> str:
    """``"thread"``, ``"process"`` or ``"backend"``; raises ``PyTritonBadParameterError`` for anything else."""
    if value not in INSTANCE_KINDS:
        raise PyTritonBadParameterError(
            f"Model {model!r}: instance_kind must be 'thread' (worker threads in this process, the default), "
            f"'backend' (inside the server's stub) or 'process' (a worker process per instance), got {value!r}."
        )
    return str(value)


# -- the callable's way to the worker process -------------------------------------------------
_CONTEXT_ID = "pytriton.TritonContext"


# wrapt's type stubs declare nothing for Python 3.9 (see pytriton/decorators.py), which CI type-checks
# too: the wrapper classes are used untyped.
def _wrapt() -> Any:
    """``wrapt``, imported when first needed: it imports asyncio and importlib.metadata (~35 ms here), which a
    stub or worker process loading an undecorated callable need not pay before its first request."""
    import wrapt

    return wrapt


def _is_wrapper(kind: type) -> bool:
    """True for wrapt's wrapper classes; no object can be one while wrapt was never imported."""
    wrapt = sys.modules.get("wrapt")
    return wrapt is not None and issubclass(kind, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper))


def _resolve(module: str, qualname: str, depth: int = 0) -> object:
    """The object named ``module.qualname``, then ``depth`` times its ``__wrapped__`` (used when unpickling)."""
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    for _ in range(depth):
        target = target.__wrapped__
    return target


def _numpy_type(code: str) -> type:
    """The numpy scalar type of dtype ``code`` (used when unpickling, see :func:`reduce_numpy_type`)."""
    return np.dtype(code).type


def reduce_numpy_type(obj: object) -> object:
    """A numpy scalar type (``np.float32``, ``np.bool``) by its dtype code, else ``NotImplemented``.

    By name it would not travel between numpy versions: numpy 2 calls ``np.bool_`` ``numpy.bool``,
    which numpy 1.x (the stub's environment, for backend instances) does not have.
    """
    if isinstance(obj, type) and issubclass(obj, np.generic):
        try:
            return _numpy_type, (np.dtype(obj).str,)
        except TypeError:  # an abstract type (np.floating): by name, as before
            return NotImplemented
    return NotImplemented


def _rewrap(wrapped: object, wrapper: object, enabled: object) -> object:
    """A ``wrapt.FunctionWrapper`` again (used when unpickling; the class itself is not importable by name)."""
    return _wrapt().FunctionWrapper(wrapped, wrapper, enabled)


def _named(obj: object) -> Optional[Tuple[str, str, int]]:
    """``(module, qualname, depth)`` if ``obj`` can be imported by name, itself or ``depth`` decorators below."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<locals>" in qualname:
        return None
    try:
        found = _resolve(module, qualname)
    except Exception:  # noqa: BLE001 - anything that does not resolve is simply not importable by name
        return None
    for depth in range(8):
        if found is obj:
            return module, qualname, depth
        found = getattr(found, "__wrapped__", None)
        if found is None:
            return None
    return None


class _CallablePickler(pickle.Pickler):
    """Pickles a callable for a worker process.

    Beyond plain pickle it handles the ``wrapt`` wrappers that ``pytriton.decorators`` produce
    (they refuse to pickle): a decorated function is pickled by name when it is importable
    (``@batch`` on a module-level function), a decorated method as ``getattr(object, name)``, and
    a decorator applied at bind time as the decorator's function around the pickled callable.
    The ``TritonContext`` that ``bind`` attaches is left out: the worker process attaches its own.
    """

    def persistent_id(self, obj: object) -> Optional[str]:
        return _CONTEXT_ID if type(obj) is TritonContext else None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type) and issubclass(obj, np.generic):
            return reduce_numpy_type(obj)
        kind = type(obj)  # not isinstance: a wrapt proxy reports the class of what it wraps
        wrapper = _is_wrapper(kind)
        if not (wrapper or issubclass(kind, (types.FunctionType, type))):
            return NotImplemented
        named = _named(obj)
        if named is not None and named[0] == "__main__" and not _main_importable():
            raise pickle.PicklingError(
                f"{named[1]} is defined in the __main__ module of an interactive session or 'python -c', "
                "which a worker process cannot import; move it to a module (a .py file)"
            )
        if named is not None and (wrapper or named[2] > 0):
            # A decorated function by name, or the function inside a decorator (its name holds the
            # decorator: @wrapt.decorator's own function, e.g. the one @batch wraps its target with).
            return _resolve, named
        if not wrapper:
            return NotImplemented  # plain pickle: a function or class by name (or its own error)
        if issubclass(kind, _wrapt().BoundFunctionWrapper):
            owner, name = obj._self_instance, getattr(obj, "__name__", None)
            if owner is not None and isinstance(name, str) and _same_method(getattr(owner, name, None), obj):
                return getattr, (owner, name)
        if kind is _wrapt().FunctionWrapper:  # a decorator applied at bind time: the same again, around the copy
            return _rewrap, (obj.__wrapped__, obj._self_wrapper, obj._self_enabled)
        raise pickle.PicklingError(f"cannot pickle the decorated callable {obj!r}")


def _same_method(found: Any, bound: Any) -> bool:
    return issubclass(type(found), _wrapt().BoundFunctionWrapper) and found.__wrapped__ == bound.__wrapped__


def _main_importable() -> bool:
    main = sys.modules.get("__main__")
    return getattr(main, "__file__", None) is not None or getattr(main, "__spec__", None) is not None


def dump_callable(
    func: object, model: str, slot: int, kind: str = "process", pickler: Optional[Type[pickle.Pickler]] = None
) -> bytes:
    """The pickled callable of one instance; raises ``PyTritonBadParameterError`` saying how to fix it.

    ``kind``: the instance kind it is pickled for (``"process"``, or ``"backend"``: the server's stub).
    ``pickler``: the pickler class (default: this module's); a backend instance's is
    ``_backend_kind.CallablePickler``, since the stub may run another numpy major version.
    """
    where = "its worker process" if kind == "process" else "the server's stub process"
    pickler_type: Type[pickle.Pickler] = _CallablePickler if pickler is None else pickler
    buffer = io.BytesIO()
    try:
        pickler_type(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(func)
    except Exception as exc:  # noqa: BLE001 - whatever pickle raises, the fix is the same
        raise PyTritonBadParameterError(
            f"Model {model!r}: instance_kind={kind!r} sends each instance's callable to {where} by "
            f"pickling it, and the callable of instance {slot} ({func!r}) cannot be pickled: "
            f"{type(exc).__name__}: {exc}. Define the function, or the class of the callable object, at module "
            "level (lambdas, nested functions and objects holding locks, sockets or open files cannot travel), "
            "or bind it with instance_kind='thread'."
        ) from None
    return buffer.getvalue()


def load_callable(data: bytes, context: TritonContext) -> Callable[..., object]:
    """Unpickle a callable from :func:`dump_callable`, with ``context`` in place of the parent's TritonContext."""

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: object) -> TritonContext:
            if pid != _CONTEXT_ID:
                raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
            return context

    func: Callable[..., object] = _Unpickler(io.BytesIO(data)).load()
    return func


def preparation_data(payloads: Sequence[bytes] = ()) -> Dict[str, Any]:
    """What a worker process (or a backend instance's stub) needs to import the callable's modules as this process does.

    The keys of ``multiprocessing.spawn.get_preparation_data`` that concern imports (the child
    applies them with ``multiprocessing.spawn.prepare``); that function itself is not called
    because it would fix this process's multiprocessing start method as a side effect.

    The main module (run there as ``__mp_main__``) is included only when one of the pickled
    callables (``payloads``, from :func:`dump_callable`) refers to it: a function, class or
    object of the main script. Unlike ``multiprocessing``'s spawn, a callable imported from a
    module does not make the worker run the main script again: that script may import or load
    much more than the callable needs (it is the worker's start-up time, and the stub's), and
    ``sys.path``, the working directory and the environment come from this process anyway.
    """
    sys_path = [os.getcwd() if entry == "" else entry for entry in sys.path]
    data: Dict[str, object] = {"sys_path": sys_path, "sys_argv": list(sys.argv), "dir": os.getcwd()}
    # Pickle names a module by its name (a GLOBAL, or the string before a STACK_GLOBAL): a payload
    # without these bytes refers to nothing in __main__. Any other occurrence only errs towards
    # running the main module.
    if not any(b"__main__" in payload for payload in payloads):
        return data
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        data["init_main_from_name"] = name
    else:
        path = getattr(main, "__file__", None)
        if isinstance(path, str):
            data["init_main_from_path"] = os.path.abspath(path)
    return data


# -- status page ----------------------------------------------------------------------------------
class Status:
    """The state a worker process publishes for the user's process: one shared page (``memfd``).

    Written by the worker (:meth:`write`, at each batch start and end and connection change), read
    by the user's process (:meth:`read`). Each field is an aligned 8-byte word, so a reader never
    sees half a field.
    """

    _FIELDS = struct.Struct("<qqqqd")  # busy, connected, retired_busy, stub_pid, last_active
    _LAST_ACTIVE = struct.Struct("<d")  # at offset 32
    SIZE = 4096

    def __init__(self, fd: int):
        self.fd = fd
        self._map: Optional[mmap.mmap] = mmap.mmap(fd, self.SIZE)

    @classmethod
    def create(cls) -> Status:
        fd = os.memfd_create("pytriton-instance-status", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, cls.SIZE)
            return cls(fd)
        except BaseException:
            os.close(fd)
            raise

    def write(self, busy: bool, connected: bool, retired_busy: bool, stub_pid: int, last_active: float) -> None:
        if self._map is not None:
            self._FIELDS.pack_into(self._map, 0, busy, connected, retired_busy, stub_pid, last_active)

    def write_last_active(self, value: float) -> None:
        if self._map is not None:
            self._LAST_ACTIVE.pack_into(self._map, 32, value)

    def read(self) -> Tuple[bool, bool, bool, int, float]:
        """``(busy, connected, retired_busy, stub_pid, last_active)``; all clear once closed (also by another thread)."""
        page = self._map
        try:
            busy, connected, retired_busy, stub_pid, last_active = self._FIELDS.unpack_from(page)  # type: ignore[arg-type]
        except (TypeError, ValueError):  # None, or closed under us
            return False, False, False, 0, 0.0
        return bool(busy), bool(connected), bool(retired_busy), stub_pid, last_active

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
            os.close(self.fd)


# -- starting processes -----------------------------------------------------------------------
class _Spawner:
    """Starts every worker process from one thread that lives as long as this process.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that started a process ends, not the process: a
    worker started from a passing thread (``bind`` on a request thread, a restart on a monitor
    thread) would be killed when that thread returns. A daemon thread, so it never delays exit.
    """

    _lock = threading.Lock()
    _queue: queue.SimpleQueue[Tuple[concurrent.futures.Future[subprocess.Popen[bytes]], List[str], Dict[str, Any]]]
    _thread: Optional[threading.Thread] = None

    @classmethod
    def popen(cls, argv: List[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """``subprocess.Popen(argv, **kwargs)``, run on the spawner thread."""
        with cls._lock:
            if cls._thread is None or not cls._thread.is_alive():
                cls._queue = queue.SimpleQueue()
                cls._thread = threading.Thread(target=cls._run, name="pytriton-process-spawner", daemon=True)
                cls._thread.start()
            future: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
            cls._queue.put((future, argv, kwargs))
        return future.result()

    @classmethod
    def _run(cls) -> None:
        requests = cls._queue
        while True:
            future, argv, kwargs = requests.get()
            try:
                future.set_result(subprocess.Popen(argv, **kwargs))  # noqa: S603 - our own interpreter
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)


_BOOTSTRAP = "import sys; from pytriton.proxy._process_child import main; main(sys.argv[1:])"


class WorkerStartError(PyTritonBadParameterError):
    """A worker process could not load its callable (the message says why and how to fix it)."""


class ProcessInstance:
    """Serves one instance slot of a bound model from a worker process; the user's side of it.

    Offers what ``BoundModel`` uses of :class:`~pytriton.proxy._worker.InstanceWorker`: ``start``,
    ``stop``, ``connected``, ``busy``, ``last_active``, ``retire`` and ``retired_busy``.

    Lifetime: :meth:`launch` creates the listening socket, the status page and the monitor thread,
    which starts the first worker process; :meth:`wait_ready` returns once it has loaded the
    callable (or raises :class:`WorkerStartError`), and :meth:`start_failure` tells the same without
    waiting (``Triton.run()`` starts the server meanwhile); :meth:`stop` ends the worker process and
    releases everything. A worker process that dies is logged and replaced (after a backoff when it
    died before being ready; after ``MAX_START_FAILURES`` such deaths in a row the instance gives up
    and closes its socket, so its stub's requests fail at once).
    """

    def __init__(
        self,
        *,
        payload: bytes,
        on_unrecoverable: Callable[[BaseException], None],
        on_stub_lost: Optional[Callable[[int, int], None]] = None,
        **worker_options: Any,
    ):
        """``payload``: the pickled callable (:func:`dump_callable`); ``worker_options``: the keyword
        arguments of :class:`~pytriton.proxy._worker.InstanceWorker` other than the callable and the
        two callbacks (``path``, ``config``, ``strict``, ``shm_prefix``, ``name``, ``poll_s``,
        ``metrics``), which the worker process passes on to its own ``InstanceWorker`` as they are.
        The callbacks run here, on messages from the worker process."""
        config: TritonModelConfig = worker_options["config"]
        self._path: str = worker_options["path"]
        self._name: str = worker_options["name"]
        self._shm_prefix: str = worker_options["shm_prefix"]
        self._on_unrecoverable = on_unrecoverable
        self._on_stub_lost = on_stub_lost
        # Everything the worker process needs besides the descriptors it inherits.
        self._payload = payload
        self._worker_options = cast(_control.WorkerOptions, dict(worker_options))
        self._model = config.model_name
        self._lock = threading.Lock()
        self._listener: Optional[socket.socket] = None
        self._status: Optional[Status] = None
        self._thread: Optional[threading.Thread] = None
        self._child: Optional[subprocess.Popen[bytes]] = None
        self._link: Optional[_control.ControlLink] = None  # to the current worker process
        self._stopping = False
        self._gave_up = False
        self._wake = threading.Event()
        self._ready = threading.Event()  # the first worker process loaded the callable (or failed to)
        self._launched_at = 0.0  # time.monotonic() at launch(): the first worker's READY_TIMEOUT_S counts from it
        self._start_error: Optional[str] = None
        self._orphan = 0  # pid of the stub a dead worker process served, until it connects again
        self._replies: Dict[int, concurrent.futures.Future[Optional[_control.ReplyValue]]] = {}
        self._ids = itertools.count(1)
        self.restarts = 0  # worker processes started after the first one
        self._admission: Optional[Admission] = None

    @property
    def admission(self) -> Optional[Admission]:
        """The drain's admission (``pytriton.proxy._admission.Admission``), once ``Triton.stop`` drains."""
        return self._admission

    @admission.setter
    def admission(self, admission: Admission) -> None:
        """Draining: the worker process admits at most the model's budget left now, then refuses.

        The budget cannot be shared with the other instances' processes, so each gets all of it:
        a few more queued requests may be served, none that Triton had queued is refused.
        """
        self._admission = admission
        if self._request(lambda number: _control.Drain(number, admission.remaining())) is None:
            LOGGER.warning("Model %s: instance %s did not confirm the drain.", self._model, self._name)

    # -- what BoundModel reads --------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """True while a stub is attached, or a stub whose worker process died lives on (it reconnects)."""
        if self._status is None or self._gave_up:
            return False
        if self._status.read()[1]:
            return True
        return bool(self._orphan) and _process_running(self._orphan)

    @property
    def busy(self) -> bool:
        return self._status is not None and self._status.read()[0]

    @property
    def last_active(self) -> float:
        return self._status.read()[4] if self._status is not None else 0.0

    @property
    def stub_stopped(self) -> bool:
        """True while the attached stub is stopped by a signal (``proxy/_stub_watch.py``)."""
        if self._status is None:
            return False
        _, connected, _, stub_pid, _ = self._status.read()
        return bool(connected and stub_pid) and _stub_watch.stopped(stub_pid)

    @property
    def pid(self) -> Optional[int]:
        """The current worker process's pid (None between a death and its replacement)."""
        child = self._child
        return child.pid if child is not None and child.poll() is None else None

    def retired_busy(self) -> bool:
        return self._status is not None and self._status.read()[2]

    def fail_stuck_call(self, text: str, older_than_s: float = 0.0) -> bool:
        """Ask the worker process to answer its stuck batch with ``Error(text)`` and serve on (no replacement).

        For pytriton/_serving/unresponsive.py (``InstanceWorker.fail_stuck_call`` runs in the worker process).
        False if the instance is not busy or no worker process is there to ask.
        """
        if not self.busy:
            return False
        try:
            self._send(_control.FailStuck(text, older_than_s))
        except OSError:
            return False
        return True

    def retire(self, generation: int) -> List[int]:
        """Like ``InstanceWorker.retire``, in the worker process; [] if it does not answer within 5 s."""
        result = self._request(lambda number: _control.Retire(number, generation))
        return list(result) if isinstance(result, list) else []

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """:meth:`launch`, then :meth:`wait_ready`."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Create the slot's socket and status page, and start the monitor thread (which starts the worker)."""
        refuse_in_worker()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(self._path)
            self._listener.listen(16)
            self._status = Status.create()
        except BaseException:
            self._close()
            raise
        self._launched_at = time.monotonic()
        self._thread = threading.Thread(target=self._monitor, name=f"pytriton-{self._name}-process", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until the first worker process has loaded the callable; raise ``WorkerStartError`` if it failed.

        ``timeout_s`` counts from :meth:`launch`, so a wait after :meth:`start_failure` polls gives the
        worker the same time in all.
        """
        if not self._ready.wait(max(0.0, self._launched_at + timeout_s - time.monotonic())):
            self._start_error = f"it did not report ready within {timeout_s:g} s"
        error = self._failure()
        if error is not None:
            raise error

    def start_failure(self, timeout_s: float = READY_TIMEOUT_S) -> Optional[WorkerStartError]:
        """Without waiting: the ``WorkerStartError`` :meth:`wait_ready` would raise, once the first worker
        process failed (or ``timeout_s`` passed since :meth:`launch` without it being ready); None while it
        loads, and once it is ready."""
        if not self._ready.is_set():
            if time.monotonic() - self._launched_at < timeout_s:
                return None
            self._start_error = f"it did not report ready within {timeout_s:g} s"
        return self._failure()

    def _failure(self) -> Optional[WorkerStartError]:
        if self._start_error is None:
            return None
        return WorkerStartError(
            f"Model {self._model!r}: the worker process of instance {self._name} could not load the inference "
            f"callable: {self._start_error}. Its module must be importable in a fresh Python process (the same "
            'sys.path is used), with the code that starts Triton under `if __name__ == "__main__":`; '
            "or bind it with instance_kind='thread'."
        )

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the worker process (killing it after ``timeout_s``) and release everything. Idempotent."""
        with self._lock:
            self._stopping = True
            child = self._child
        self._wake.set()
        if child is not None:
            with contextlib.suppress(OSError):
                self._send(_control.Stop(timeout_s))
            try:
                child.wait(timeout_s + 1.0)
            except subprocess.TimeoutExpired:
                LOGGER.warning(
                    "Model %s: the worker process of instance %s did not stop; killing it.", self._model, self._name
                )
                child.kill()
                child.wait()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s + 1.0)
        self._thread = None
        self._close()

    def _close(self) -> None:
        for sock in (self._listener, self._link.sock if self._link is not None else None):
            if sock is not None:
                sock.close()
        self._listener, self._link = None, None
        if self._status is not None:
            self._status.close()

    # -- the monitor thread -----------------------------------------------------------------
    def _monitor(self) -> None:
        """Start worker processes one after another for as long as the instance lives."""
        failures = 0
        try:
            while True:
                ready, code = self._run_one()
                if not self._ready.is_set():  # the first worker: bind()/run() reports its failure
                    self._start_error = self._start_error or f"its process ended ({describe_exit(code)})"
                    self._ready.set()
                    return
                if self._stopping:
                    return
                failures = 0 if ready else failures + 1
                if failures >= MAX_START_FAILURES:
                    LOGGER.error(
                        "Model %s: the worker process of instance %s died %d times in a row before it was ready; "
                        "giving up on this instance (its requests fail until the model is bound again).",
                        self._model,
                        self._name,
                        failures,
                    )
                    self._gave_up = True
                    if self._listener is not None:
                        # Closing (not only shutting down) it also ends the connections waiting in its
                        # backlog, so stubs waiting for their hello's answer fail at once.
                        self._listener.close()
                    return
                if self._wake.wait(_RESTART_BACKOFF_S[min(failures, len(_RESTART_BACKOFF_S) - 1)]):
                    return
        except BaseException as exc:  # noqa: BLE001 - log whatever ends this thread (e.g. no process could be started)
            LOGGER.exception("Model %s: supervising the worker process of instance %s failed", self._model, self._name)
            if not self._ready.is_set():
                self._start_error = f"starting it failed ({type(exc).__name__}: {exc})"
            self._gave_up = True
            self._ready.set()

    def _run_one(self) -> Tuple[bool, int]:
        """Start one worker process and serve its control socket until it ends; (was it ready, exit code)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        assert self._listener is not None and self._status is not None
        fds = (theirs.fileno(), self._listener.fileno(), self._status.fd)
        try:
            child = _Spawner.popen(
                [sys.executable, "-c", _BOOTSTRAP, str(os.getpid()), *map(str, fds)],
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            theirs.close()
        with self._lock:
            if self._stopping:
                child.kill()
            link = _control.ControlLink(ours)
            self._child, self._link = child, link
        ready = False
        try:
            export = (
                (_tracing.State.export_url, dict(_tracing.State.export_resource)) if _tracing.State.export_url else None
            )
            link.send(
                _control.Start(
                    self._payload, self._worker_options, preparation_data([self._payload]), _log_levels(), export
                )
            )
            while True:
                message = link.recv()
                if type(message) is _control.Ready:
                    ready = True
                    if self._ready.is_set():
                        LOGGER.warning(
                            "Model %s: instance %s serves again from a new worker process (pid %d).",
                            self._model,
                            self._name,
                            child.pid,
                        )
                    self._ready.set()
                else:
                    self._handle(message)
        except (EOFError, OSError):
            pass
        code = child.wait()
        self._after_death(child, ready, code)
        return ready, code

    def _handle(self, message: _control.ControlMessage) -> None:
        if type(message) is _control.Log:
            record = logging.makeLogRecord(message.fields)
            logger = logging.getLogger(record.name)
            if logger.isEnabledFor(record.levelno):
                logger.handle(record)
        elif type(message) is _control.Failed:
            self._start_error = message.text.rstrip(".")
            # It exits after its atexit handlers; one that hangs must not hold bind()/run() up.
            timer = threading.Timer(10.0, _kill_quietly, (self._child,))
            timer.daemon = True
            timer.start()
        elif type(message) is _control.Reply:
            future = self._replies.pop(message.number, None)
            if future is not None:
                future.set_result(message.value)
        elif type(message) is _control.StubLost and self._on_stub_lost is not None:
            self._on_stub_lost(message.generation, message.server_pid)
        elif type(message) is _control.Unrecoverable:
            self._on_unrecoverable(PyTritonUnrecoverableError(message.text))

    def _after_death(self, child: subprocess.Popen[bytes], ready: bool, code: int) -> None:
        """Reset the status page and sweep the dead worker's segments; log the death unless stopping."""
        with self._lock:
            self._child = None
            if self._link is not None:
                self._link.sock.close()
                self._link = None
        for future in self._replies.values():
            future.set_result(None)
        self._replies.clear()
        assert self._status is not None
        busy, connected, _, stub_pid, last_active = self._status.read()
        self._orphan = stub_pid if connected else 0
        self._status.write(False, False, False, 0, last_active)
        # Segments are named <prefix>-c<connection>-<pid of the creating process>-<n> (_arena.Arena).
        _sweep_segments_of(f"{self._shm_prefix}-c", child.pid)
        if self._stopping or not ready:
            if not self._stopping and self._ready.is_set():
                LOGGER.error(
                    "Model %s: a new worker process for instance %s ended (%s) before it was ready.",
                    self._model,
                    self._name,
                    describe_exit(code),
                )
            return
        self.restarts += 1
        if code == EXIT_REPLACED:
            LOGGER.warning(
                "Model %s: the worker process of instance %s (pid %d) ended its call that ran past the execution "
                "timeout by exiting; starting a new one.",
                self._model,
                self._name,
                child.pid,
            )
            return
        LOGGER.error(
            "Model %s: the worker process of instance %s (pid %d) died (%s)%s; starting a new one.",
            self._model,
            self._name,
            child.pid,
            describe_exit(code),
            "; the batch it was running failed" if busy else "",
        )

    def _send(self, message: _control.ToWorker) -> None:
        link = self._link
        if link is None:
            raise OSError("no worker process")
        link.send(message)

    def _request(
        self, command: Callable[[int], Union[_control.Retire, _control.Drain]], timeout_s: float = 5.0
    ) -> Optional[_control.ReplyValue]:
        """Send a command (built with its number) to the worker process and wait for its reply (None if there is none)."""
        future: concurrent.futures.Future[Optional[_control.ReplyValue]] = concurrent.futures.Future()
        number = next(self._ids)
        self._replies[number] = future
        try:
            self._send(command(number))
            return future.result(timeout_s)
        except (OSError, concurrent.futures.TimeoutError):
            return None
        finally:
            self._replies.pop(number, None)


def _log_levels() -> Dict[str, int]:
    """The log levels the worker process copies from this process at each start."""
    return {"": logging.getLogger().getEffectiveLevel(), "pytriton": logging.getLogger("pytriton").getEffectiveLevel()}


def _kill_quietly(child: Optional[subprocess.Popen[bytes]]) -> None:
    if child is not None and child.poll() is None:
        child.kill()


def _sweep_segments_of(prefix: str, pid: int) -> None:
    """Remove the ``/dev/shm`` segments named ``<prefix>...-<pid>-...`` (a dead worker process's arenas)."""
    marker = f"-{pid}-"
    with contextlib.suppress(OSError):
        for name in os.listdir(_arena.SHM_DIR):
            if name.startswith(prefix) and marker in name[len(prefix) :]:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(_arena.SHM_DIR, name))
