"""Run one ``tritonserver`` process: launch, log capture, readiness, death detection, stop.

Lifetime contract: :meth:`TritonServerProcess.start` spawns the server in its own session (so a
Ctrl-C in the terminal reaches only the user's process, which then stops the server in order) with
``PR_SET_PDEATHSIG`` so the kernel kills it if the user's process dies, even by SIGKILL.
:meth:`TritonServerProcess.stop` always leaves no process of the server's group behind.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import http.client
import logging
import os
import pathlib
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Callable, Deque, Dict, List, Optional

from pytriton._platform import hardening, native, proc
from pytriton._platform import launch as _launch
from pytriton.exceptions import PyTritonServerError
from pytriton.proxy.stubside import _stub_print
from pytriton.server import _allocator

LOGGER = logging.getLogger(__name__)
# The server's own output lines go to a logger of their own, documented in docs/configuration.md
# (log_verbose), so that they can be shown or silenced apart from pytriton's messages.
SERVER_LOG = logging.getLogger("pytriton.server.log")

_ERROR_LINE = re.compile(
    r"^(E\d{4} |error:|Error:)|Bad option|invalid argument|unrecognized option|Unexpected argument"
)
# Lines every CPU-only machine prints; they say nothing about why a start failed.
_HARMLESS = ("NVML", "CudaDriverHelper", "DCGM", "CUDA driver version is insufficient", "cuda")
# What a crashing server prints before its backtrace (C++ exception, fatal signal).
_CRASH_LINE = re.compile(r"terminate called|what\(\):|Signal \(\d+\) received|Segmentation fault|Aborted")
_BACKTRACE_LINE = re.compile(r"^\s*\d+# ")
# Triton prints one of these once an endpoint accepts connections: from then on, requests can reach it.
_LISTENING = re.compile(r"Started (HTTPService|GRPCInferenceService) at")
# The Python backend logs this (info level) as it starts a model instance, after its own
# initialization, which is when it creates its scratch directory (server/_scratch.py).
_PYTHON_INSTANCE = re.compile(r"python_be\.cc:\d+\] \"TRITONBACKEND_ModelInstanceInitialize: ")
_IN_USE = re.compile(r"Socket '([^']*):(\d+)' already in use")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    native.die_with_parent()


def _private_bytes(pid: int) -> int:
    """``VmData`` of ``pid`` in bytes: what ``RLIMIT_DATA`` counts (private writable mappings, stacks of threads included)."""
    kilobytes = proc.status_int(pid, "VmData")
    if kilobytes is None:
        raise ValueError(f"no VmData for pid {pid}")
    return kilobytes * 1024


def _prepare_child(data_limit: Optional[int]) -> None:  # runs in the child between fork and exec
    """Die with the parent; under jemalloc, refuse allocations larger than the machine (``_allocator.data_limit``)."""
    _die_with_parent()
    if data_limit is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard == resource.RLIM_INFINITY or data_limit <= hard:
            resource.setrlimit(resource.RLIMIT_DATA, (data_limit, hard))


def raise_open_files_limit() -> None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (as servers commonly do); say so at DEBUG.

    Under systemd the soft limit is 1024 whatever the hard limit: a frontend holding about a thousand
    idle connections would leave no descriptor for a restart of the server (reading ``/proc``,
    pipes for the new process). The server and its stubs inherit the raised limit. A hard limit of
    ``RLIM_INFINITY`` is taken as the kernel's ``fs.nr_open``. Failures are logged and ignored.
    """
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard
        if target == resource.RLIM_INFINITY:
            nr_open = proc.kernel_int("fs/nr_open")
            if nr_open is None:
                raise OSError("fs.nr_open could not be read")
            target = nr_open
        if soft != resource.RLIM_INFINITY and soft >= target:
            return
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        LOGGER.debug("Could not raise the open-files limit (RLIMIT_NOFILE) to its hard limit: %s", exc)
        return
    LOGGER.debug("Raised the soft open-files limit (RLIMIT_NOFILE) from %d to the hard limit %d.", soft, target)


def kill_stub(pid: int) -> bool:
    """SIGKILL ``pid`` if it is a running Python-backend stub; True if a signal was sent.

    Checks the command line first, so a pid reused by another process is never touched. The stub is
    killed at a moment it holds none of the Python backend's shared-memory locks
    (``native.kill_outside_robust_locks``): one killed holding such a lock makes tritonserver abort at
    its next use of that lock (``boost::interprocess::lock_exception``), which a stub stopped by a
    signal at a random moment can be.
    """
    argv = proc.cmdline(pid)
    if argv is None or not any("triton_python_backend_stub" in word for word in argv):
        return False
    try:
        outcome = native.kill_outside_robust_locks(pid)
    except (OSError, ValueError):
        return False
    if outcome == "held":
        LOGGER.warning(
            "The stub process %d still held a lock of the Python backend's shared memory when it was killed; "
            "tritonserver may abort (and be restarted).",
            pid,
        )
    return outcome != "gone"


def group_members(pgid: int) -> List[int]:
    """The pids of group ``pgid`` that run (zombies, which hold no memory, locks or sockets, do not count)."""
    return proc.group_members(pgid)


def _group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` runs (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(group_members(pgid))


def port_taken(address: str, port: int) -> Optional[str]:
    """Why ``port`` on ``address`` cannot be bound as tritonserver binds it, or None when it can.

    tritonserver's HTTP, gRPC and metrics listeners set ``SO_REUSEADDR``, so a port whose last
    connections linger in TIME_WAIT is free for them (checked: a server started on three such ports);
    the probe sets it too, and only a live socket on the port makes it taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def check_ports_free(ports: Dict[str, int], address: str = "127.0.0.1") -> None:
    """Raise ``PyTritonServerError`` naming the first port already taken on ``address``."""
    for label, port in ports.items():
        if port == 0:
            continue
        reason = port_taken(address, port)
        if reason is not None:
            raise PyTritonServerError(
                f"Cannot start Triton: {label} port {port} on {address} is already in use ({reason}). "
                f"Stop the process using it or choose another port (TritonConfig({label}_port=...) "
                f"or PYTRITON_TRITON_CONFIG_{label.upper()}_PORT)."
            )


class TritonServerProcess:
    """One supervised ``tritonserver`` process.

    The server's output is kept in a bounded buffer (``log_lines``), optionally appended to
    ``log_path``, and forwarded to the ``pytriton.server.log`` logger at DEBUG level.
    """

    def __init__(
        self,
        argv: List[str],
        env: Dict[str, str],
        *,
        log_path: Optional[pathlib.Path] = None,
        log_buffer_lines: int = 2000,
        data_headroom: int = 0,
    ):
        """``data_headroom``: see :meth:`cap_memory` (bytes; 0: no cap)."""
        self._data_headroom = data_headroom
        self._argv = argv
        self._env = env
        self._log_path = log_path
        self._lines: Deque[str] = collections.deque(maxlen=log_buffer_lines)
        self._process: Optional[subprocess.Popen[bytes]] = None
        self._reader: Optional[threading.Thread] = None
        self._waiter: Optional[threading.Thread] = None
        self._on_exit: List[Callable[[int], None]] = []
        self._stopping = False
        self._ready = False  # exit callbacks fire only for a server that had come up
        self._listening = False
        self._python_backend_started = False
        self._lock = threading.Lock()
        self.protections: Optional[hardening.Protections] = None
        """What the last :meth:`start` applied (mode: ``PYTRITON_HARDENING`` in ``env``, else the process's)."""

    @property
    def pid(self) -> Optional[int]:
        """Process id of the server while it runs."""
        return self._process.pid if self._process else None

    @property
    def returncode(self) -> Optional[int]:
        """The server process's exit status once it ended (negative: the signal that ended it), else None."""
        return self._process.poll() if self._process is not None else None

    @property
    def listening(self) -> bool:
        """True once the server said that its HTTP or gRPC endpoint accepts connections.

        A server that dies after that may have been killed by a request (restart it), unlike one
        that dies while still loading its models or parsing its flags (a failed start).
        """
        return self._listening

    @property
    def python_backend_started(self) -> bool:
        """True once the server's log showed its Python backend starting a model instance.

        The backend had initialized by then, so it had created its scratch directory: a start that
        fails later (a model whose warmup fails, a worker that cannot load its callable) leaves it
        behind like a start that succeeds, and it is removed the same way (server/_scratch.py).
        False with info logging turned off, whatever happened.
        """
        return self._python_backend_started

    @property
    def log_lines(self) -> List[str]:
        """The last lines the server printed (bounded)."""
        return list(self._lines)

    def error_lines(self, limit: int = 20) -> List[str]:
        """The server's error lines (glog ``E`` lines and ``error:`` lines), the most recent last."""
        return [
            line.strip()
            for line in self._lines
            if _ERROR_LINE.search(line) and not any(word in line for word in _HARMLESS)
        ][-limit:]

    def crash_lines(self, limit: int = 5) -> List[str]:
        """Why the server died, in its own words: error and crash lines, else its last lines (no backtrace)."""
        lines = [line.strip() for line in self._lines if line.strip() and not _BACKTRACE_LINE.search(line)]
        chosen = [
            line
            for line in lines
            if _CRASH_LINE.search(line) or (_ERROR_LINE.search(line) and not any(word in line for word in _HARMLESS))
        ]
        return (chosen or lines)[-limit:]

    def register_on_exit(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(returncode)`` from a helper thread when the server exits on its own.

        Only for a server that had come up (:meth:`wait_until` succeeded) and that :meth:`stop`
        did not end; the callback runs on the log reader thread, so it must return quickly.
        """
        self._on_exit.append(callback)

    def start(self) -> None:
        """Spawn the server. Returns at once; use :meth:`wait_until_ready`.

        Raises ``PyTritonServerError`` under ``PYTRITON_HARDENING=strict`` when a protection cannot be applied.
        """
        self.protections = hardening.Protections(hardening.resolve(None, self._env))
        self._process = _launch.spawn(
            self._argv,
            self._env,
            functools.partial(_prepare_child, _allocator.data_limit(self._env)),
            protections=self.protections,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
        try:
            self._reader = threading.Thread(target=self._read_output, name="pytriton-server-log", daemon=True)
            self._reader.start()
            # Death is detected by waiting for the process, not by the end of its output: its stubs
            # inherit the output pipe and may outlive a killed server for a long time.
            self._waiter = threading.Thread(target=self._wait_exit, name="pytriton-server-wait", daemon=True)
            self._waiter.start()
        except BaseException:
            # No thread to watch it (e.g. "can't start new thread" under memory pressure): a server
            # nobody supervises must not run. The caller sees the error (a restart retries it).
            with self._lock:
                self._stopping = True
            self._kill_group(self._process.pid)
            self._process.wait()
            # A started reader ends at the pipe's end (the group is dead); threads that never started are dropped.
            if self._reader is not None and self._reader.ident is None:
                self._reader = None
                if self._process.stdout is not None:
                    self._process.stdout.close()
            if self._waiter is not None and self._waiter.ident is None:
                self._waiter = None
            raise

    def _read_output(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        sink: Optional[IO[str]] = None
        if self._log_path is not None:
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            sink = self._log_path.open("a", encoding="utf-8")
        try:
            for raw in iter(self._process.stdout.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self._lines.append(line)
                if not self._python_backend_started and _PYTHON_INSTANCE.search(line):
                    self._python_backend_started = True
                if not self._listening and _LISTENING.search(line):
                    self._listening = True
                    # Requests can arrive from now on, before the readiness probe sees the
                    # server: cap its memory at once (the startup models are loaded by now).
                    self.cap_memory()
                if sink is not None:
                    sink.write(line + "\n")
                    sink.flush()
                SERVER_LOG.debug("%s", line)
                forwarded = _stub_print.parse(line)
                if forwarded is not None:
                    _write_forwarded(*forwarded)
        finally:
            if sink is not None:
                sink.close()

    def _wait_exit(self) -> None:
        assert self._process is not None
        returncode = self._process.wait()
        with self._lock:
            report = self._ready and not self._stopping
        if report:
            # Its stubs outlive it and keep every socket they inherited, the HTTP and gRPC
            # connections that were open when they were forked included (Triton does not make them
            # close-on-exec): a client waiting on such a connection, pytriton's own repository call
            # among them, would wait for its whole timeout. A dead server's stubs serve nobody.
            self._kill_group(self._process.pid)
            LOGGER.warning("tritonserver exited unexpectedly with code %s", returncode)
            for callback in list(self._on_exit):
                try:
                    callback(returncode)
                except Exception:  # a callback must not kill the log reader
                    LOGGER.exception("tritonserver exit callback failed")

    def is_alive(self) -> bool:
        """True while the server process runs."""
        return self._process is not None and self._process.poll() is None

    def failure(self, what: str) -> PyTritonServerError:
        """An error describing why the server died, quoting its own error lines."""
        assert self._process is not None
        if self._reader is not None:
            self._reader.join(timeout=2.0)
        errors = self.error_lines() or self.log_lines[-15:]
        message = f"{what}: tritonserver exited with code {self._process.returncode}."
        for line in errors:
            match = _IN_USE.search(line)
            if match:
                message += f" Port {match.group(2)} on {match.group(1)} is already in use; choose another port."
                break
        if errors:
            message += " Its error output:\n  " + "\n  ".join(errors)
        return PyTritonServerError(message)

    def wait_until(self, probe: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll ``probe`` until it returns True; fail fast if the server process dies."""
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        while True:
            if not self.is_alive():
                raise self.failure(what)
            if probe():
                self._ready = True
                self.cap_memory()
                return
            if time.monotonic() > deadline:
                raise PyTritonServerError(
                    f"{what}: not done after {timeout_s:.0f} s although tritonserver is running. "
                    "Last server output:\n  " + "\n  ".join(self.log_lines[-15:])
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def cap_memory(self) -> None:
        """Cap the server's private memory at what it uses now plus ``data_headroom`` (soft ``RLIMIT_DATA``).

        Called as soon as the server says it listens (the log reader thread), once it is ready
        (:meth:`wait_until`) and again after each model load (each model instance adds Triton
        threads, whose stacks count): the cap follows the models, and the headroom is what requests
        may take on top. An allocation past it fails (Triton 2.51 then
        aborts on the uncaught ``std::bad_alloc`` and is restarted) instead of taking the machine's
        memory. Stubs started later inherit the cap as it is then. A no-op without a headroom or a
        process; a failure (the server just died) is ignored.
        """
        process = self._process
        if self._data_headroom <= 0 or process is None or process.poll() is not None:
            return
        try:
            _, hard = resource.prlimit(process.pid, resource.RLIMIT_DATA)
            soft = _private_bytes(process.pid) + self._data_headroom
            if hard != resource.RLIM_INFINITY:
                soft = min(soft, hard)
            resource.prlimit(process.pid, resource.RLIMIT_DATA, (soft, hard))
        except (OSError, ValueError) as exc:
            LOGGER.debug("Could not cap tritonserver's memory: %s", exc)

    def stop(self, grace_s: float = 30.0, wait_idle: Optional[Callable[[float], bool]] = None) -> None:
        """Stop the server and everything it spawned. Idempotent.

        Sends SIGINT so Triton drains in-flight requests and unloads models; ``wait_idle`` (if
        given) is called with a deadline and returns True once nothing is left to drain, after
        which the server's 1 s shutdown polling is cut short with SIGKILL. Whatever is still
        running after ``grace_s`` is killed.
        """
        with self._lock:
            self._stopping = True
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT)
            deadline = time.monotonic() + grace_s
            if wait_idle is not None and wait_idle(deadline):
                self._kill_group(process.pid)
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                if grace_s > 0:  # 0: the caller ends it at once on purpose (a restart, a replacement)
                    LOGGER.warning("tritonserver did not stop within %.1f s; killing it", grace_s)
        self._kill_group(process.pid)
        process.wait()
        # Stubs are reaped by whoever inherits them; wait until they are gone, so that their slot
        # locks, sockets and mappings are released when this returns (a restart relies on it).
        deadline = time.monotonic() + 5.0
        while _group_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        for thread in (self._reader, self._waiter):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=5.0)
        if process.stdout is not None:
            process.stdout.close()

    @staticmethod
    def _kill_group(pgid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def http_ready_probe(
    host: str, port: int, path: str = "/v2/health/ready", headers: Optional[Dict[str, str]] = None
) -> Callable[[], bool]:
    """A probe that is True when ``GET path`` (sent with ``headers``) answers 200."""

    def probe() -> bool:
        connection = http.client.HTTPConnection(host, port, timeout=1.0)
        try:
            connection.request("GET", path, headers=headers or {})
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    return probe


def listening_probe(host: str, port: int) -> Callable[[], bool]:
    """A probe that is True when ``host:port`` accepts a TCP connection (closed at once)."""

    def probe() -> bool:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
        except OSError:
            return False
        return True

    return probe


def grpc_ready_probe(host: str, port: int, headers: Optional[Dict[str, str]] = None) -> Callable[[], bool]:
    """A probe that is True when the gRPC endpoint reports the server ready (asked with ``headers``)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"{host}:{port}")

    def probe() -> bool:
        try:
            return bool(client.is_server_ready(headers=headers, client_timeout=1.0))
        except Exception:  # connection refused while starting
            return False

    return probe


def _write_forwarded(stream: str, label: str, text: str) -> None:
    """Write what a backend instance's callable printed (stubside/_stub_print.py) to this process's stream.

    The text alone, as a thread instance's ``print`` would show it; the server log keeps the label.
    A closed or broken stream of this process loses the line, never the server-output reader.
    """
    target = sys.stdout if stream == "stdout" else sys.stderr
    if target is None:
        return
    with contextlib.suppress(Exception):
        target.write(text + "\n")
        target.flush()
