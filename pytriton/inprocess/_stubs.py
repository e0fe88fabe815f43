"""The Python-backend stub processes of an in-process server, as ``/proc`` shows them.

Why this exists: Triton's unload reports a model not ready at once, but a detached thread of
Triton destroys the old instances afterwards: it stops each instance's backend thread, then
finalizes the instance, which ends its stub. Loading the same model again inside that window
raced the destruction in Triton 2.51 and crashed the whole process (SIGSEGV in
``TritonBackendThread::StopBackendThread``, about one reload loop in ten under load). A stub that
has exited is the first sign visible from outside that its instance got past that point, so
``Server.unload(wait_until_unloaded=True)`` waits for the stubs it saw before the unload.

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

    def serves(self, model: str) -> bool:
        """Whether this stub runs an instance of ``model`` (by its directory or its instance name)."""
        if pathlib.PurePosixPath(self.model_file).parent.parent.name == model:
            return True
        return re.fullmatch(re.escape(model) + r"_\d+_\d+", self.instance) is not None


def _read_stub(entry: pathlib.Path, parent: int, region_prefix: str) -> Optional[Stub]:
    try:
        stat = (entry / "stat").read_text()
        cmdline = (entry / "cmdline").read_bytes()
    except OSError:  # ended between the listing and the read
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    # fields[0] is the state, fields[1] the parent: a zombie ("Z") has exited already.
    if len(fields) < 2 or fields[0] == "Z" or fields[1] != str(parent):
        return None
    argv = cmdline.decode(errors="replace").split("\0")
    if len(argv) < 9 or os.path.basename(argv[0]) != STUB_EXECUTABLE or not argv[2].startswith(region_prefix):
        return None
    return Stub(int(entry.name), argv[1], argv[2], argv[8])


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
    old: Iterable[Stub],
    deadline: float,
    interval_s: float = 0.02,
    parent: Optional[int] = None,
    proc: str = "/proc",
) -> List[Stub]:
    """Wait until none of ``old`` is alive (a stub is the same one if its pid and region match).

    Returns the ones still alive at ``deadline`` (``time.monotonic()``), or ``[]``. Reads ``/proc``
    at most once per ``interval_s``.
    """
    waiting = {(stub.pid, stub.region): stub for stub in old}
    prefix = os.path.commonprefix([stub.region for stub in waiting.values()])
    while waiting:
        alive = {(stub.pid, stub.region) for stub in stubs(prefix, parent, proc)}
        waiting = {key: stub for key, stub in waiting.items() if key in alive}
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    return list(waiting.values())
