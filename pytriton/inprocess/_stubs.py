"""The Python-backend stub processes of an in-process server, as ``/proc`` shows them.

Why this exists: Triton's unload reports a model not ready at once, but a detached thread of
Triton destroys the old instances afterwards: it stops each instance's backend thread, then
finalizes the instance, which ends its stub. Loading the same model again inside that window
raced the destruction in Triton 2.51 and crashed the whole process (SIGSEGV in
``TritonBackendThread::StopBackendThread``, about one reload loop in ten under load). A stub that
has exited is the first sign visible from outside that its instance got past that point, so
``Server.unload(wait_until_unloaded=True)`` waits for the stubs it saw before the unload (until
each is a zombie or gone; a reused pid is told apart by its start time).

A stub is recognised by its command line (``triton_python_backend_stub <model.py> <region> ...
<instance name> ...``): its region name starts with the server's prefix, and its model file lies
in a directory named after the model or its instance is named ``<model>_<group>_<index>``.

Unit test: tests/unit/test_inprocess_stubs.py (a fake ``/proc``).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import time
from typing import Iterable, List, Optional

STUB_EXECUTABLE = "triton_python_backend_stub"


@dataclasses.dataclass(frozen=True)
class Stub:
    """One live stub process: ``region`` is its shared-memory region, unique for its lifetime."""

    pid: int
    model_file: str
    region: str
    instance: str
    started: int  # the process's start time (clock ticks after boot): a reused pid has another

    def alive(self, proc: str = "/proc") -> bool:
        """Whether this process has not exited yet.

        Read from its ``stat`` alone: an exiting process's ``cmdline`` reads empty once its memory
        is released, before it has finished exiting.
        """
        fields = _stat_fields(pathlib.Path(proc) / str(self.pid))
        return fields is not None and fields[0] != "Z" and fields[19] == str(self.started)

    def serves(self, model: str) -> bool:
        """Whether this stub runs an instance of ``model`` (by its directory or its instance name)."""
        if pathlib.PurePosixPath(self.model_file).parent.parent.name == model:
            return True
        return re.fullmatch(re.escape(model) + r"_\d+_\d+", self.instance) is not None


def _stat_fields(entry: pathlib.Path) -> Optional[List[str]]:
    """``/proc/<pid>/stat`` from the state on (``[0]`` state, ``[1]`` parent, ``[19]`` start time), or None.

    Split after the last ``)``: the command name before it may hold spaces and parentheses.
    """
    try:
        fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:  # ended between the listing and the read
        return None
    return fields if len(fields) >= 20 else None


def _read_stub(entry: pathlib.Path, parent: int, region_prefix: str) -> Optional[Stub]:
    fields = _stat_fields(entry)
    # A zombie ("Z") has exited already.
    if fields is None or fields[0] == "Z" or fields[1] != str(parent):
        return None
    try:
        argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    if len(argv) < 9 or os.path.basename(argv[0]) != STUB_EXECUTABLE or not argv[2].startswith(region_prefix):
        return None
    return Stub(int(entry.name), argv[1], argv[2], argv[8], int(fields[19]))


def stubs(region_prefix: str, parent: Optional[int] = None, proc: str = "/proc") -> List[Stub]:
    """The live stubs whose parent is ``parent`` (this process) and whose region has ``region_prefix``."""
    parent = os.getpid() if parent is None else parent
    found = []
    for entry in pathlib.Path(proc).iterdir():
        if entry.name.isdigit():
            stub = _read_stub(entry, parent, region_prefix)
            if stub is not None:
                found.append(stub)
    return found


def wait_until_exited(
    old: Iterable[Stub], deadline: float, interval_s: float = 0.02, proc: str = "/proc"
) -> List[Stub]:
    """Wait until none of ``old`` is alive; returns the ones still alive at ``deadline`` (``time.monotonic()``), or ``[]``.

    Reads ``/proc`` at most once per ``interval_s``.
    """
    waiting = list(old)
    while waiting:
        waiting = [stub for stub in waiting if stub.alive(proc)]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    return waiting
