"""The one reader of ``/proc``: a process's stat, status and command line, its children, this process's threads.

Every other module of pytriton asks here instead of opening ``/proc`` files itself
(tests/unit/test_platform_boundary.py holds them to it), so the format's traps are handled once:

- ``/proc/<pid>/stat``: the command name (field 2) is in parentheses and may itself hold spaces and
  parentheses, so the fields are split after the *last* ``)``. :func:`stat_fields` returns them from
  field 3 (the state) on: index ``n - 3`` holds field ``n`` of proc(5).
- A process may exit between a listing and a read: every reader answers "gone" (``[]``, None, False)
  instead of raising, and a scan skips it.
- ``pid`` may be a number or ``"self"``; ``root`` (default ``/proc``) lets unit tests use a fake tree
  (tests/unit/test_platform_proc.py).

Costs: one small file read per call; a scan (:func:`children`, :func:`group_members`) reads the stat
file of every process on the host (thousands on a busy one): callers scan only when a cheaper check
says they must.
"""

from __future__ import annotations

import os
import platform
from typing import Dict, FrozenSet, List, NamedTuple, Optional, Tuple, Union

PROC = "/proc"
TASK_DIR = "/proc/self/task"
Pid = Union[int, str]

STATE = 0
"""Index of the state (``R``, ``S``, ``T``, ``Z``...) in :func:`stat_fields`."""
PPID = 1
PGID = 2
START_TIME = 19
"""Index of the start time (clock ticks since boot, field 22): with the pid, it names one process for good."""
START_STACK = 25
ENV_START = 47
ENV_END = 48
_GONE = ("Z", "X")  # zombie, dead: such a process holds no memory, locks or sockets any more


class Stat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` that pytriton uses."""

    state: str
    ppid: int
    pgid: int
    start_time: int

    @property
    def running(self) -> bool:
        """Not a zombie (``Z``) nor dead (``X``): a zombie holds no memory, locks or sockets any more."""
        return self.state not in _GONE


def _path(pid: Pid, name: str, root: str) -> str:
    return os.path.join(root, str(pid), name)


def stat_fields(pid: Pid, root: str = PROC) -> List[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first); [] if the process is gone."""
    try:
        with open(_path(pid, "stat", root), "rb") as source:
            data = source.read()
    except OSError:
        return []
    end = data.rfind(b")")
    if end < 0:
        return []
    return data[end + 1 :].decode(errors="replace").split()


def stat(pid: Pid, root: str = PROC) -> Optional[Stat]:
    """:class:`Stat` of ``pid``; None if the process is gone (or its stat is cut short)."""
    fields = stat_fields(pid, root)
    if len(fields) <= START_TIME:
        return None
    try:
        return Stat(fields[STATE], int(fields[PPID]), int(fields[PGID]), int(fields[START_TIME]))
    except ValueError:
        return None


def status_field(pid: Pid, key: str, root: str = PROC) -> Optional[str]:
    """The first word after ``key:`` in ``/proc/<pid>/status`` (``"VmData"`` -> ``"1234"``, in kB); None if absent."""
    prefix = key + ":"
    try:
        with open(_path(pid, "status", root), errors="replace") as source:
            for line in source:
                if line.startswith(prefix):
                    words = line[len(prefix) :].split()
                    return words[0] if words else None
    except OSError:
        return None
    return None


def cmdline(pid: Pid, root: str = PROC) -> Optional[List[str]]:
    """The argument vector of ``pid`` (decoded, the final NUL dropped); None if the process is gone.

    A kernel thread, or a zombie, has an empty one.
    """
    try:
        with open(_path(pid, "cmdline", root), "rb") as source:
            data = source.read()
    except OSError:
        return None
    if data.endswith(b"\0"):
        data = data[:-1]
    return data.decode(errors="replace").split("\0") if data else []


def program_is(pid: Pid, executable: str, root: str = PROC) -> bool:
    """True if the first argument of ``pid`` ends with ``executable`` (False if it is gone)."""
    argv = cmdline(pid, root)
    return bool(argv) and argv[0].endswith(executable)  # type: ignore[index]


def owner(pid: Pid, root: str = PROC) -> Optional[int]:
    """The uid that owns process ``pid`` (its ``/proc`` entry); None if it is gone."""
    try:
        return os.stat(os.path.join(root, str(pid))).st_uid
    except OSError:
        return None


def pids(root: str = PROC) -> List[int]:
    """Every process id listed in ``root`` (a snapshot: some may be gone by the time they are read)."""
    try:
        return [int(entry) for entry in os.listdir(root) if entry.isdigit()]
    except OSError:
        return []


def children(ppid: int, root: str = PROC, *, running_only: bool = False) -> List[int]:
    """The processes whose parent is ``ppid`` (a scan of every process); zombies too unless ``running_only``."""
    found = []
    for pid in pids(root):
        fields = stat_fields(pid, root)
        if len(fields) > PPID and fields[PPID] == str(ppid) and (not running_only or fields[STATE] not in _GONE):
            found.append(pid)
    return found


def group_members(pgid: int, root: str = PROC) -> List[int]:
    """The running (not zombie) processes of process group ``pgid`` (a scan of every process)."""
    found = []
    for pid in pids(root):
        fields = stat_fields(pid, root)
        if len(fields) > PGID and fields[PGID] == str(pgid) and fields[STATE] not in _GONE:
            found.append(pid)
    return found


def tasks(task_dir: str = TASK_DIR) -> Optional[FrozenSet[int]]:
    """The ids of this process's threads (``task_dir``: ``/proc/self/task``); None where ``/proc`` cannot tell."""
    try:
        return frozenset(int(entry) for entry in os.listdir(task_dir) if entry.isdigit())
    except OSError:
        return None


def task_states(pid: Pid, root: str = PROC) -> Dict[int, str]:
    """``{thread id: state}`` of every thread of ``pid`` (``/proc/<pid>/task/<tid>/stat``); {} if it is gone."""
    found: Dict[int, str] = {}
    for tid in tasks(_path(pid, "task", root)) or ():
        fields = stat_fields(f"{pid}/task/{tid}", root)
        if fields:
            found[tid] = fields[STATE]
    return found


def read_memory(pid: Pid, address: int, size: int, root: str = PROC) -> Optional[bytes]:
    """``size`` bytes of the memory of ``pid`` at ``address`` (``/proc/<pid>/mem``); None if not readable.

    Reading another process's memory needs the right to trace it (the same user, and under Yama's
    ``ptrace_scope`` 1 a descendant of this process, as tritonserver's stubs are), else None.
    """
    try:
        descriptor = os.open(_path(pid, "mem", root), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.pread(descriptor, size, address)
    except (OSError, OverflowError, ValueError):
        return None
    finally:
        os.close(descriptor)
    return data if len(data) == size else None


def mappings(pid: Pid, root: str = PROC) -> List[Tuple[int, int, str]]:
    """``(start, end, path)`` of each mapping of a file by ``pid`` (``/proc/<pid>/maps``); [] if it is gone."""
    found = []
    try:
        with open(_path(pid, "maps", root), errors="replace") as source:
            for line in source:
                words = line.split(maxsplit=5)
                if len(words) == 6 and "-" in words[0]:
                    start, end = words[0].split("-", 1)
                    found.append((int(start, 16), int(end, 16), words[5].rstrip("\n")))
    except (OSError, ValueError):
        return found
    return found


def syscall(pid: Pid, root: str = PROC) -> Optional[List[str]]:
    """The words of ``/proc/<pid>/syscall``: the number of the system call it is blocked in, then its arguments.

    ``["running"]`` while it runs, ``["-1", sp, pc]`` when blocked outside a call; None if it is gone or
    unreadable (a thread of this process can always read its own threads', see proc(5)).
    """
    try:
        with open(_path(pid, "syscall", root)) as source:
            return source.read().split()
    except OSError:
        return None


FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
"""futex(2)'s system call number on this machine (``/proc/<pid>/syscall`` names calls by number); None if not known."""
FUTEX_LOCK_WAITS = frozenset({0, 6, 13})
"""How glibc waits for a contended mutex: ``FUTEX_WAIT`` (robust and plain mutexes), ``FUTEX_LOCK_PI``,
``FUTEX_LOCK_PI2``. A condition variable or semaphore waits with ``FUTEX_WAIT_BITSET`` (9) instead."""


class FutexWait(NamedTuple):
    """The futex a thread is blocked on: its address, and the operation without ``FUTEX_PRIVATE_FLAG`` and
    ``FUTEX_CLOCK_REALTIME`` (compare with :data:`FUTEX_LOCK_WAITS`)."""

    address: int
    operation: int


def futex_wait(pid: Pid, root: str = PROC) -> Optional[FutexWait]:
    """The futex the thread ``pid`` (``"self/task/<tid>"`` for one of this process's) is blocked on.

    None when it is running, blocked in another call, gone, or when this machine's futex number is not
    known (:data:`FUTEX`).
    """
    words = syscall(pid, root)
    if FUTEX is None or not words or len(words) < 3 or words[0] != str(FUTEX):
        return None
    try:
        return FutexWait(int(words[1], 16), int(words[2], 16) & 0x7F)
    except ValueError:
        return None


def meminfo(path: str = os.path.join(PROC, "meminfo")) -> Dict[str, int]:
    """``/proc/meminfo`` in bytes (``{"MemTotal": ..., "SwapTotal": ...}``); {} if unreadable."""
    sizes: Dict[str, int] = {}
    try:
        with open(path) as source:
            for line in source:
                name, _, rest = line.partition(":")
                words = rest.split()
                if words and words[0].isdigit():
                    sizes[name] = int(words[0]) * (1024 if words[1:] == ["kB"] else 1)
    except OSError:
        return {}
    return sizes


def kernel_int(name: str, root: str = PROC) -> Optional[int]:
    """The integer in ``/proc/sys/<name>`` (``"kernel/yama/ptrace_scope"``); None if unreadable (no such knob)."""
    try:
        with open(os.path.join(root, "sys", name)) as source:
            return int(source.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def status_int(pid: Pid, key: str, root: str = PROC) -> Optional[int]:
    """:func:`status_field` as an integer (``"Seccomp"`` -> 2); None if absent or not a number."""
    value = status_field(pid, key, root)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
