"""The worker process of a process instance (``bind(..., instance_kind="process")``).

Started by :class:`pytriton.proxy._process.ProcessInstance` as ``python -c <bootstrap> PARENT_PID
CONTROL_FD LISTEN_FD STATUS_FD``. It ties its life to the user's process (``PR_SET_PDEATHSIG``,
then a check that the parent is still the one that started it), reads its settings from the
control socket, imports the callable's modules as ``multiprocessing``'s spawn does, unpickles the
callable and serves the inherited listening socket with the same
:class:`~pytriton.proxy._worker.InstanceWorker` as a thread instance: same data path through shared
memory, decorators, ``async`` callables, generators, output checks and error handling.

To its parent it sends, over the control socket: ``ready`` (or ``failed`` with the reason), the log
records of this process (re-emitted there by the logger of the same name, so the user's logging
configuration applies), ``stub_lost`` and ``unrecoverable`` events, and replies to ``retire``. It
publishes ``busy``/``connected``/``last_active`` in the shared status page (``_process.Status``) at
each change. It exits on ``stop`` (after stopping the worker) or as soon as the control socket
closes (the parent is gone). It ends with ``os._exit``, so threads left running by a hung callable
cannot hold it up; ``atexit`` handlers (of the callable's modules, or of a ``Triton`` that a main
module without its ``__main__`` guard created while being imported) run first, except when the
parent is gone.

Unit tests: tests/unit/test_process_instances.py.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.spawn
import os
import socket
import sys
import threading
import traceback
from typing import Any, Dict, List, Union

from pytriton._platform import native
from pytriton.proxy import _control, _process, _tracing
from pytriton.proxy._admission import Admission
from pytriton.proxy._context import TritonContext, attach_context
from pytriton.proxy._control import ControlLink, ControlMessage
from pytriton.proxy._session import Session
from pytriton.proxy._worker import InstanceWorker, error_text
from pytriton.proxy.stubside import _zmq_channel

LOGGER = logging.getLogger(__name__)


def _die_with_parent(parent_pid: int) -> None:
    """Get SIGKILL when the user's process dies; exit now if it already has (its child was re-parented)."""
    native.die_with_parent()
    if os.getppid() != parent_pid:
        os._exit(0)


class _Link(ControlLink):
    """The control socket to the parent, shared by every thread of this process."""

    def send(self, message: ControlMessage) -> None:
        try:
            super().send(message)
        except OSError:
            pass  # the parent is gone; the control loop sees it and exits


class _ForwardingHandler(logging.Handler):
    """Sends each log record to the parent, formatted as far as a ``LogRecord`` dict allows."""

    def __init__(self, link: _Link):
        super().__init__()
        self._link = link

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = dict(record.__dict__)
            fields["msg"] = record.getMessage()
            fields["args"] = None
            if record.exc_info:
                fields["exc_text"] = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            fields["exc_info"] = None
            fields = {key: value for key, value in fields.items() if _plain(value)}
            self._link.send(_control.Log(fields))
        except Exception:  # noqa: BLE001 - logging must never fail the caller
            pass


def _plain(value: object) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


class _PublishedSession(Session):
    """A connection whose state changes are published to the parent (see :class:`_PublishingWorker`)."""

    _TRACKED = frozenset({"busy", "connected", "abandoned", "retired", "stub_pid"})
    _owner: _PublishingWorker

    def __init__(
        self,
        owner: _PublishingWorker,
        number: int,
        sock: Union[socket.socket, _zmq_channel.Connection, None],
        prefix: str,
    ):
        object.__setattr__(self, "_owner", owner)
        super().__init__(number, sock, prefix)

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name in self._TRACKED:
            self._owner.publish()

    def close(self) -> None:
        super().close()
        self._owner.publish()  # called once the session has left the worker's list


class _PublishingWorker(InstanceWorker):
    """``InstanceWorker`` that mirrors ``busy``, ``connected``, ``retired_busy`` and ``last_active`` into the status page."""

    def __init__(self, status: _process.Status, **kwargs: Any):
        self._status = status
        self._publish_lock = threading.Lock()
        self._last_active = 0.0
        super().__init__(**kwargs)

    @property  # type: ignore[override]
    def last_active(self) -> float:
        return self._last_active

    @last_active.setter
    def last_active(self, value: float) -> None:
        self._last_active = value
        self._status.write_last_active(value)

    def _new_session(self, number: int, sock: Union[socket.socket, _zmq_channel.Connection]) -> Session:
        return _PublishedSession(self, number, sock, self._shm_prefix)

    def publish(self) -> None:
        """Write the worker's ``busy``, ``connected`` and ``retired_busy`` (as ``InstanceWorker`` defines them).

        On the path of every batch (twice), so one plain loop instead of the properties (5 us -> 1 us).
        """
        sessions = getattr(self, "_sessions", None)
        if sessions is None:
            return  # still in __init__
        with self._publish_lock:
            busy = connected = retired_busy = False
            stub_pid = 0
            for session in sessions:
                if session.abandoned:
                    continue
                if session.busy:
                    busy = True
                    retired_busy = retired_busy or session.retired
                if session.connected:
                    connected = True
                    stub_pid = max(stub_pid, session.stub_pid)
            self._status.write(busy, connected, retired_busy, stub_pid, self._last_active)


def _load(start: _control.Start) -> object:
    """Import the user's modules as the parent has them and unpickle the callable."""
    _process.IN_WORKER_PROCESS = True  # a main module that starts Triton again gets a clear error
    multiprocessing.spawn.prepare(start.preparation)
    if start.trace_export is not None:  # spans made here are exported where the parent's are
        _tracing.State.export_url, _tracing.State.export_resource = start.trace_export[0], dict(start.trace_export[1])
    context = TritonContext()
    func = _process.load_callable(start.payload, context)
    attach_context(func, context, start.worker["config"])
    return func


def _set_up_logging(link: _Link, levels: Dict[str, int]) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_ForwardingHandler(link))
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)


def main(argv: List[str]) -> None:
    """Entry point of the worker process (see the module docstring); never returns."""
    parent_pid, control_fd, listen_fd, status_fd = (int(arg) for arg in argv)
    _die_with_parent(parent_pid)
    link = _Link(socket.socket(fileno=control_fd))
    try:
        start = link.recv()
    except (EOFError, OSError):
        os._exit(0)
    if type(start) is not _control.Start:
        os._exit(1)
    _set_up_logging(link, start.levels)
    try:
        func = _load(start)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it from bind()/run()
        link.send(_control.Failed(error_text(exc)))
        LOGGER.error("Loading the inference callable failed", exc_info=exc)
        _exit(1, run_atexit=True)
    worker = _PublishingWorker(
        _process.Status(status_fd),
        infer_func=func,
        on_unrecoverable=lambda exc: link.send(_control.Unrecoverable(error_text(exc))),
        on_stub_lost=lambda generation, server_pid: link.send(_control.StubLost(generation, server_pid)),
        on_hung_call=_replace,
        **start.worker,
    )
    worker.start(listener=socket.socket(fileno=listen_fd))
    link.send(_control.Ready())
    code = _control_loop(link, worker)
    _exit(code, run_atexit=code == 0)


def _replace() -> None:
    """A call ran past the execution timeout: end this process, so that a new one serves the slot.

    Runs while the stub's new connection waits for its welcome, which it then never gets: the stub
    connects again before its next batch, to the new worker process (the parent keeps the slot's
    socket listening), and the hung call ends with this process, whatever it was blocked in.
    """
    _exit(_process.EXIT_REPLACED, run_atexit=False)


def _control_loop(link: _Link, worker: InstanceWorker) -> int:
    """Answer the parent's commands until ``stop`` (0) or until the parent is gone (1)."""
    while True:
        try:
            message = link.recv()
        except (EOFError, OSError):
            return 1  # the parent closed its end: it is gone, or gave up on this process
        if type(message) is _control.Retire:
            link.send(_control.Reply(message.number, worker.retire(message.generation)))
        elif type(message) is _control.Drain:  # Triton.stop() drains: admit this many more requests, refuse the rest
            worker.admission = Admission(message.remaining)
            link.send(_control.Reply(message.number, True))
        elif type(message) is _control.FailStuck:  # answer the stuck batch; the process serves on
            worker.fail_stuck_call(message.text, message.older_than_s)
        elif type(message) is _control.Stop:
            worker.stop(message.timeout_s)
            return 0


def _exit(code: int, run_atexit: bool) -> None:
    """Run the ``atexit`` handlers if asked, flush what this process wrote and end it at once."""
    if run_atexit:
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001 - a failing handler must not keep the process alive
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream
            pass
    os._exit(code)
