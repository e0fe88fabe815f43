"""Start ``tritonserver`` so that no other local user can read its access token or open its regions.

Two things a local user could get from a running server, closed at the launch (docs/security.md):

**The access token.** Triton takes the restricted-API key only from its command line
(``--http-restricted-api=<apis>:<header>=<token>``), and every local user reads every process's
command line in ``/proc/<pid>/cmdline``. A scrub of argv after start leaves a window. Instead, the
real flag never is in the command line: the server is executed with a placeholder argument in its
place and the real flag in an environment variable (``/proc/<pid>/environ`` is readable only by the
same user and root). The child asks to be traced (``PTRACE_TRACEME``) before ``exec``, so the kernel
stops it right after ``exec``, before its first instruction; this process then points that argv slot
(the pointer on the new stack that ``main`` receives) at the environment string and lets the server
run. ``/proc/<pid>/cmdline`` reads the original argument area, which holds only the placeholder, at
every instant; Triton's option parser reads the pointer and gets the real flag.

**Request tensors in the Python backend's regions.** The backend creates each region with
``shm_open(O_CREAT|O_EXCL, 0644)`` and then ``fchmod(0644)`` through boost.interprocess, so a umask
alone does not help, and anyone who opens the region in the moment before it is narrowed keeps a
descriptor to it. The server is started with umask 077 (the region is created 0600) and a seccomp
filter, inherited by every stub it forks, that refuses (``EPERM``) any ``chmod`` that would grant
group or other permissions. boost ignores the refused ``fchmod``, so every region is 0600 from its
first byte, at start, after restarts and after recycles (the same launch is used each time).

Where the kernel refuses ``PTRACE_TRACEME`` (Yama ``ptrace_scope`` 2 or 3, a seccomp filter, an LSM),
or another thread reaps the stop after ``exec`` (a ``waitpid(-1)`` reaper), or the kernel refuses the
seccomp filter, :class:`PrivateLaunch` says so in a warning and the server starts the old way; the
warning names the cause (:func:`trace_refusal`: the errno the child saw, Yama's setting, this
process's seccomp mode) and what is exposed, and to whom.

Unit test: tests/unit/test_launch.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import platform
import signal
import struct
import subprocess
import threading
import time
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

from pytriton._platform import hardening, proc

LOGGER = logging.getLogger("pytriton.server.process")  # where the server's launch has always logged

HIDDEN_FLAGS = ("--http-restricted-api=", "--grpc-restricted-protocol=")
"""argv elements that carry a secret and are passed through the environment instead."""

HIDDEN_ENV_PREFIX = "PYTRITON_HIDDEN_ARG_"
PLACEHOLDER = "hidden:see-pytriton-docs-security"
"""What ``/proc/<pid>/cmdline`` shows in place of the secret (an invalid value: never a usable flag)."""

YAMA_PTRACE_SCOPE = "kernel/yama/ptrace_scope"  # under /proc/sys
_STOP_TIMEOUT_S = 30.0  # exec of the server takes milliseconds; this only bounds a wait that went wrong
_PTRACE_TRACEME = 0
_PTRACE_DETACH = 17
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_GROUP_OTHER = 0o077
_CLONE_FS = 0x00000200
_T = TypeVar("_T")

# Per architecture: the audit arch value, and the chmod-family syscalls with the index of their mode argument.
_ARCHES: Dict[str, Tuple[int, Dict[int, int], bool]] = {
    # chmod, fchmod, fchmodat, fchmodat2; True: refuse the x32 ABI's numbers (same arch value).
    "x86_64": (0xC000003E, {90: 1, 91: 1, 268: 2, 452: 2}, True),
    # fchmod, fchmodat, fchmodat2 (no chmod on arm64).
    "aarch64": (0xC00000B7, {52: 1, 53: 2, 452: 2}, False),
}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000


def chmod_filter(machine: str) -> Optional[List[Tuple[int, int, int, int]]]:
    """The seccomp program (``(code, jt, jf, k)`` rows) for ``machine``; None where not supported.

    It allows every syscall except a chmod-family call whose mode has a group or other bit, which
    fails with ``EPERM``. Calls of another architecture's ABI are allowed (the server is native).
    """
    arch = _ARCHES.get(machine)
    if arch is None:
        return None
    audit_arch, calls, refuse_x32 = arch
    # Labels: rows are built with symbolic targets, then resolved to relative offsets.
    rows: List[Tuple[int, object, object, int]] = [
        (_LD_ABS, 0, 0, 4),
        (_JEQ, 0, "allow", audit_arch),
        (_LD_ABS, 0, 0, 0),
    ]
    if refuse_x32:
        rows.append((_JGE, "deny", 0, 0x40000000))
    for number, mode_arg in calls.items():
        rows.append((_JEQ, f"mode{mode_arg}", 0, number))
    rows.append((_RET, 0, 0, _ALLOW))
    labels: Dict[str, int] = {}
    for mode_arg in sorted(set(calls.values())):
        labels[f"mode{mode_arg}"] = len(rows)
        rows.append((_LD_ABS, 0, 0, 16 + 8 * mode_arg))  # low 32 bits of args[mode_arg] (little endian)
        rows.append((_JSET, "deny", "allow", _GROUP_OTHER))
    labels["allow"] = len(rows)
    rows.append((_RET, 0, 0, _ALLOW))
    labels["deny"] = len(rows)
    rows.append((_RET, 0, 0, _ERRNO | 1))  # EPERM
    program = []
    for index, (code, jt, jf, k) in enumerate(rows):
        offsets = [labels[target] - index - 1 if isinstance(target, str) else int(target) for target in (jt, jf)]  # type: ignore[call-overload]
        program.append((code, offsets[0], offsets[1], k))
    return program


def hide_secrets(argv: List[str], env: Dict[str, str]) -> Tuple[List[str], Dict[str, str], Dict[int, str]]:
    """``(argv, env, hidden)``: argv with placeholders, env with the secret flags, ``{argv index: env name}``."""
    shown, environ, hidden = list(argv), dict(env), {}
    for index, arg in enumerate(argv):
        flag = next((flag for flag in HIDDEN_FLAGS if arg.startswith(flag)), None)
        if flag is not None:
            name = f"{HIDDEN_ENV_PREFIX}{index}"
            environ[name] = arg
            shown[index] = flag + PLACEHOLDER
            hidden[index] = name
    return shown, environ, hidden


def _libc() -> Optional[ctypes.CDLL]:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()  # resolved before any fork: the child must not load libraries
_ulong = ctypes.c_ulong  # variadic prctl: a bare Python int would be passed as a 32-bit int


def _program(machine: str) -> Optional[_SockFprog]:
    """The chmod filter for ``machine`` as the kernel takes it; None where none is defined or libc is missing."""
    program = chmod_filter(machine)
    if program is None or _LIBC is None:
        return None
    rows = (_SockFilter * len(program))(*(_SockFilter(*row) for row in program))
    fprog = _SockFprog(len(program), ctypes.cast(rows, ctypes.POINTER(_SockFilter)))
    fprog._rows = rows  # type: ignore[attr-defined]  # keeps the rows alive as long as the program
    return fprog


def _install_filter(fprog: _SockFprog) -> int:
    """Install ``fprog`` on the calling thread (and what it starts later); 0, else the errno. Fork-safe (no allocation)."""
    assert _LIBC is not None
    if _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, _ulong(1), _ulong(0), _ulong(0), _ulong(0)) != 0:
        return ctypes.get_errno() or errno.EPERM
    # No SECCOMP_FILTER_FLAG_TSYNC: only this thread is filtered, never its process's other threads.
    if _LIBC.prctl(
        _PR_SET_SECCOMP, _ulong(_SECCOMP_MODE_FILTER), _ulong(ctypes.addressof(fprog)), _ulong(0), _ulong(0)
    ):
        return ctypes.get_errno() or errno.EPERM
    return 0


class PrivateLaunch:
    """How to start one server process privately; one instance per ``Popen``.

    Use: ``Popen(launch.argv, env=launch.env, preexec_fn=launch.preexec, ...)``, then at once, from
    the same thread (the tracer is the thread that forked), :meth:`after_spawn` with the pid, before
    anything else waits for the process. ``traced=False`` starts it without hiding (the fallback).
    """

    def __init__(self, argv: List[str], env: Dict[str, str], *, traced: bool = True, filtered: bool = True):
        self.original = list(argv)
        if traced:
            self.argv, self.env, self.hidden = hide_secrets(argv, env)
        else:
            self.argv, self.env, self.hidden = list(argv), dict(env), {}
        self._fprog = _program(platform.machine()) if filtered else None
        self.filtering = self._fprog is not None
        """Whether :meth:`preexec` installs the chmod filter (False where the architecture is unknown)."""
        self.report_fd: Optional[int] = None
        """Where :meth:`preexec` writes the errno of a refused ``PTRACE_TRACEME`` (set by the spawner)."""

    def preexec(self) -> None:
        """Runs in the child between fork and exec: umask, the chmod filter, and the trace request."""
        os.umask(0o077)
        if _LIBC is None:
            return
        if self._fprog is not None:
            _install_filter(self._fprog)
        if self.hidden and _LIBC.ptrace(_PTRACE_TRACEME, 0, None, None) != 0:
            error = ctypes.get_errno()
            # Popen reports only "Exception occurred in preexec_fn.": the errno goes to the parent
            # through the report pipe (_try_spawn), which is open until exec (close-on-exec).
            if self.report_fd is not None:
                with contextlib.suppress(OSError):
                    os.write(self.report_fd, str(error).encode())
            raise OSError(error, "PTRACE_TRACEME refused")

    def after_spawn(self, pid: int) -> None:
        """Wait for the post-exec stop, point each hidden argv slot at its environment value, resume.

        Raises ``OSError`` (the child is killed) if the process's stack is not as expected.
        """
        if not self.hidden:
            return
        assert _LIBC is not None
        # Polled with a deadline, not a blocking wait: should another thread of this process reap
        # the stop with waitpid(-1), the child is killed and the launch falls back instead of hanging.
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        waited, status = os.waitpid(pid, os.WNOHANG)
        while waited == 0 and time.monotonic() < deadline:
            time.sleep(0.0002)
            waited, status = os.waitpid(pid, os.WNOHANG)
        if waited == 0 or not os.WIFSTOPPED(status):
            if waited == 0:
                os.kill(pid, signal.SIGKILL)
                raise OSError(REAPED)
            raise OSError(f"the process did not stop after exec (wait status {status:#x}), so it could not be traced")
        try:
            redirect_argv(pid, self.argv, self.hidden)
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            raise
        finally:
            _LIBC.ptrace(_PTRACE_DETACH, pid, None, None)

    @staticmethod
    def filtered(pid: int) -> Optional[bool]:
        """Whether process ``pid`` runs under a seccomp filter (``/proc/<pid>/status``); None if it is gone."""
        if proc.stat(pid) is None:
            return None
        return proc.status_int(pid, "Seccomp") == 2


REAPED = (
    "the new process's stop after exec never reached pytriton: another thread of this process reaps "
    "children with waitpid(-1) (a SIGCHLD handler or a child reaper), so the process could not be traced"
)


def trace_refusal(error: Optional[int], ptrace_scope: Optional[int], seccomp_mode: Optional[int]) -> str:
    """Why ``PTRACE_TRACEME`` was refused, in words, with what to change.

    Args:
        error: the errno the child saw (None when it could not report it).
        ptrace_scope: ``/proc/sys/kernel/yama/ptrace_scope`` (None: no Yama).
        seccomp_mode: the ``Seccomp:`` field of this process's ``/proc/self/status`` (0 none, 2 filter).
    """
    what = "the kernel refused PTRACE_TRACEME"
    if error:
        what += f" ({errno.errorcode.get(error, str(error))}: {os.strerror(error)})"
    if ptrace_scope == 3:
        cause = "Yama's kernel.yama.ptrace_scope is 3, so no process may use ptrace until the machine restarts"
    elif ptrace_scope == 2:
        cause = (
            "Yama's kernel.yama.ptrace_scope is 2, so only a process with CAP_SYS_PTRACE may be traced; "
            "set it to 1 (sysctl kernel.yama.ptrace_scope=1) or grant CAP_SYS_PTRACE"
        )
    elif seccomp_mode == 2 or error == errno.ENOSYS:
        cause = (
            "this process runs under a seccomp filter that refuses ptrace (a container runtime's default "
            "profile, systemd's SystemCallFilter=, a sandbox); allow ptrace in that profile"
        )
    else:
        cause = "neither Yama nor seccomp refuses it here, so a security module (AppArmor, SELinux) or a sandbox does"
    return f"{what}: {cause}"


def _refusal_from_report(report_fd: int) -> str:
    """:func:`trace_refusal` for the errno the child wrote to ``report_fd`` (read to its end), and this machine."""
    data = b""
    with contextlib.suppress(OSError):
        data = os.read(report_fd, 64)
    error = int(data) if data.strip().isdigit() else None
    return trace_refusal(error, proc.kernel_int(YAMA_PTRACE_SCOPE), proc.status_int("self", "Seccomp"))


_POINTER = struct.Struct("@P")


def _read_string(mem: BinaryIO, address: int, limit: int = 1 << 16) -> bytes:
    mem.seek(address)
    return mem.read(limit).split(b"\0", 1)[0]


def redirect_argv(pid: int, argv: List[str], hidden: Dict[int, str]) -> None:
    """In stopped process ``pid`` (just exec'd with ``argv``), point ``argv[i]`` at env ``hidden[i]``'s value.

    The initial stack holds ``argc`` at ``start_stack`` (``/proc/<pid>/stat`` field 28), then the argv
    pointers; the environment strings lie between ``env_start`` and ``env_end`` (fields 50-51).
    Every assumption is checked (argc, the placeholder string, the variable) before anything is written.
    """
    fields = proc.stat_fields(pid)
    if len(fields) <= proc.ENV_END:
        raise OSError(f"process {pid} is gone, or its /proc/{pid}/stat is cut short")
    start_stack, env_start = int(fields[proc.START_STACK]), int(fields[proc.ENV_START])
    env_end = int(fields[proc.ENV_END])
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
        mem.seek(start_stack)
        (argc,) = _POINTER.unpack(mem.read(_POINTER.size))
        if argc != len(argv):
            raise OSError(f"unexpected initial stack in process {pid} (argc {argc}, expected {len(argv)})")
        mem.seek(env_start)
        environ = mem.read(env_end - env_start)
        for index, name in hidden.items():
            key = b"\0" + name.encode() + b"="
            position = (b"\0" + environ).find(key)
            if position < 0:
                raise OSError(f"variable {name} not in the environment of process {pid}")
            value_address = env_start + position + len(key) - 1
            slot = start_stack + _POINTER.size * (1 + index)
            mem.seek(slot)
            (current,) = _POINTER.unpack(mem.read(_POINTER.size))
            if _read_string(mem, current) != argv[index].encode():
                raise OSError(f"argv[{index}] of process {pid} is not the expected placeholder")
            mem.seek(slot)
            mem.write(_POINTER.pack(value_address))


def spawn(
    argv: List[str],
    env: Dict[str, str],
    before_exec: Callable[[], None],
    *,
    protections: Optional[hardening.Protections] = None,
    **popen: object,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` privately (:class:`PrivateLaunch`); ``popen`` are further ``subprocess.Popen`` arguments.

    ``before_exec`` runs in the child first (e.g. a parent-death signal). ``protections`` (default: a
    new record in the mode of ``PYTRITON_HARDENING``) receives what was applied: under ``off`` the
    process is started plainly (no trace, no filter, argv as given). Under ``auto``, where the kernel
    refuses the trace, or the new process's stack is not as expected, a WARNING (once per cause) says
    the token is then visible and the process is started with ``argv`` as given; where it refuses the
    filter, a WARNING says so. Under ``strict`` either refusal raises ``PyTritonServerError`` naming the
    cause, and no process is left running. Must be called from the thread that will not exit while
    the launch runs (the tracer is that thread).
    """
    if protections is None:
        protections = hardening.Protections(hardening.resolve())
    if not protections.enabled:
        protections.skipped(hardening.HIDDEN_TOKEN)
        protections.skipped(hardening.CHMOD_FILTER)
        LOGGER.debug("Starting tritonserver (PYTRITON_HARDENING=off: no private launch): %s", _shown(argv))
        plain = _try_spawn(PrivateLaunch(argv, env, traced=False, filtered=False), before_exec, popen)
        assert isinstance(plain, subprocess.Popen)  # nothing is traced: Popen raised otherwise
        return plain
    launch = PrivateLaunch(argv, env)
    if not launch.filtering:
        protections.refused(hardening.CHMOD_FILTER, f"no seccomp filter is defined for {platform.machine()}")
    LOGGER.debug("Starting tritonserver: %s", " ".join(launch.argv))  # secrets replaced by placeholders
    reason = _try_spawn(launch, before_exec, popen)
    if isinstance(reason, subprocess.Popen):
        process = reason
        if launch.hidden:
            protections.applied(hardening.HIDDEN_TOKEN)
        else:
            protections.skipped(hardening.HIDDEN_TOKEN, "no access token on the command line")
    else:
        protections.refused(  # raises under strict
            hardening.HIDDEN_TOKEN,
            reason,
            f"Cannot start tritonserver with its access token hidden ({reason}): the token is in its command line, "
            "readable by every local user in /proc/<pid>/cmdline. Allow a process to trace its own children "
            "(Yama kernel.yama.ptrace_scope <= 1, seccomp allowing ptrace) to close this (docs/security.md).",
        )
        fallback = _try_spawn(PrivateLaunch(argv, env, traced=False), before_exec, popen)
        assert isinstance(fallback, subprocess.Popen)  # nothing is traced: Popen raised otherwise
        process = fallback
    if launch.filtering:
        if launch.filtered(process.pid) is False:
            try:
                protections.refused(
                    hardening.CHMOD_FILTER,
                    "the kernel refused the seccomp filter",
                    "The kernel refused the seccomp filter: the Python backend's shared-memory regions are "
                    "readable by other local users until pytriton narrows them (docs/security.md).",
                )
            except BaseException:
                process.kill()  # strict: no server runs without the protection
                process.wait()
                raise
        else:
            protections.applied(hardening.CHMOD_FILTER)
    return process


def confine_thread() -> Optional[str]:
    """Give the calling thread what :class:`PrivateLaunch` gives a server: umask 077 and the chmod filter.

    For the in-process server, whose Python backend runs in the user's own process: the thread that
    creates the server (and so every thread Triton starts from it, which is where the backend creates
    its regions and forks its stubs) gets a private copy of the process's umask, root and working
    directory (``unshare(CLONE_FS)``), sets the umask to 077 there, and installs the chmod filter on
    itself only (no ``TSYNC``). The process's other threads keep their umask and are never filtered.
    Both are permanent for the thread and inherited by the threads and processes it starts. Returns
    None when both are in place, else why not (after a refused ``unshare`` nothing is changed; after
    a refused filter only the private umask is).
    """
    if _LIBC is None:
        return "the C library cannot be loaded with ctypes"
    fprog = _program(platform.machine())
    if fprog is None:
        return f"no seccomp filter is defined for {platform.machine()}"
    if _LIBC.unshare(ctypes.c_int(_CLONE_FS)) != 0:
        error = ctypes.get_errno()
        return f"unshare(CLONE_FS) refused ({os.strerror(error)}), so the umask cannot be set for one thread only"
    os.umask(0o077)  # this thread's own copy now
    error = _install_filter(fprog)
    if error:
        return f"the kernel refused the seccomp filter ({os.strerror(error)})"
    return None


def call_confined(call: Callable[[], _T], protections: hardening.Protections) -> _T:
    """Run ``call`` in a new thread confined by :func:`confine_thread`; its result, or its exception re-raised.

    ``protections`` records :data:`~hardening.INPROCESS_MODES`: applied, or refused with the cause
    (``strict`` raises before ``call`` runs; ``auto`` warns once and runs it unconfined in effect).
    Under ``off`` the caller should simply call ``call()``. The thread ends when ``call`` returns;
    threads it started (Triton's) keep the confinement. An interrupt while waiting (Ctrl-C) waits
    for ``call`` to finish (a C call cannot be abandoned half-way) and is then re-raised.
    """
    results: List[_T] = []
    errors: List[BaseException] = []

    def confined() -> None:
        try:
            reason = confine_thread()
            if reason is None:
                protections.applied(hardening.INPROCESS_MODES)
            else:
                protections.refused(  # raises under strict: call() never runs
                    hardening.INPROCESS_MODES,
                    reason,
                    f"Cannot confine the in-process server's threads ({reason}): the Python backend's shared-memory "
                    "regions are readable by other local users until pytriton's guard narrows them (docs/security.md).",
                )
            results.append(call())
        except BaseException as exc:  # handed to the waiting thread
            errors.append(exc)

    thread = threading.Thread(target=confined, name="pytriton-confined-start")
    thread.start()
    try:
        thread.join()
    except BaseException:
        thread.join()
        raise
    if errors:
        raise errors[0]
    return results[0]


def _shown(argv: List[str]) -> str:
    """``argv`` for a log line, each secret flag's value replaced by the placeholder."""
    return " ".join(hide_secrets(argv, {})[0])


def _try_spawn(
    launch: PrivateLaunch, before_exec: Callable[[], None], popen: Dict[str, Any]
) -> subprocess.Popen[bytes] | str:
    """The started process, or why the private launch failed (the process is then gone)."""

    def preexec() -> None:
        before_exec()
        launch.preexec()

    # The child writes the errno of a refused trace here; both ends are close-on-exec.
    report = os.pipe() if launch.hidden else None
    launch.report_fd = report[1] if report is not None else None
    try:
        process: subprocess.Popen[bytes] = subprocess.Popen(  # noqa: S603 - argv is built by pytriton, no shell
            launch.argv,
            env=launch.env,
            preexec_fn=preexec,  # noqa: PLW1509 - only calls already-resolved libc functions
            **popen,
        )
    except subprocess.SubprocessError:  # PTRACE_TRACEME refused in the child ("Exception occurred in preexec_fn.")
        if report is None:
            raise
        os.close(report[1])  # the child's copy is gone with it: the read ends at what it wrote
        report = (report[0], -1)
        return _refusal_from_report(report[0])
    finally:
        launch.report_fd = None
        if report is not None:
            for descriptor in report:
                if descriptor >= 0:
                    os.close(descriptor)
    try:
        launch.after_spawn(process.pid)
    except OSError as exc:
        process.wait()
        return str(exc)
    return process


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hold back this module's WARNINGs (a probe reports its findings itself)."""
    level = LOGGER.level
    LOGGER.setLevel(logging.ERROR)
    try:
        yield
    finally:
        LOGGER.setLevel(level)


def probe(executable: str) -> Tuple[Optional[str], Optional[str]]:
    """Try the private launch on ``executable -c`` (a Python); ``(trace problem, filter problem)``, None where it works.

    For ``pytriton check``: the child reports whether it received the hidden flag while its command
    line showed the placeholder, and whether it runs under the seccomp filter.
    """
    flag = HIDDEN_FLAGS[0] + "probe:x=y"
    code = (
        "import sys; c = open('/proc/self/cmdline', 'rb').read(); s = open('/proc/self/status').read();"
        f"import os; a = os.environ.get('{HIDDEN_ENV_PREFIX}4', '');"
        "print(sys.argv[1] == a != '' and a.encode() not in c, any(l.split() == ['Seccomp:', '2'] for l in s.splitlines()))"
    )
    # Always tried as under auto (a refusal is recorded, not raised), and without the fallback warnings.
    protections = hardening.Protections(hardening.AUTO)
    with _quiet():
        process = spawn(
            [executable, "-S", "-c", code, flag],
            dict(os.environ),
            lambda: None,
            protections=protections,
            stdout=subprocess.PIPE,
        )
        out, _ = process.communicate(timeout=60)
    causes = {record.name: record.cause for record in protections.records() if not record.active}
    hidden, filtered = (out.decode().split() + ["False", "False"])[:2]
    trace_problem = None
    if hidden != "True":
        trace_problem = (
            f"{causes.get(hardening.HIDDEN_TOKEN, 'the flag did not arrive hidden')}: the token would be in the "
            "server's command line, readable by every local user in /proc/<pid>/cmdline"
        )
    filter_problem = (
        None if filtered == "True" else causes.get(hardening.CHMOD_FILTER, "the kernel refused the seccomp filter")
    )
    return trace_problem, filter_problem
