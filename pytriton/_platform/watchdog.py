"""Clean-up guard: removes a ``Triton`` instance's leftovers if its process dies without stopping.

Started by ``Triton.run`` as ``<python> -S <path of this file> READ_FD SERVER_PGID SHM_PREFIX PATH...``
(a script that imports only the standard library and its sibling ``proc.py``, the layer's one ``/proc``
reader, without ``site``). It blocks reading a pipe whose
write end only the user's process holds, which sends newline-terminated lines: ``scratch PATH``
once a Python backend's scratch directory is known (server/_scratch.py), ``pgid N`` when a
restarted server runs in process group N, and ``done`` from ``Triton.stop`` (nothing left to do).
If the pipe closes without ``done``, the user's process died (e.g. SIGKILL) and the watchdog kills
the current server's process group (the last ``pgid`` line, else the one it started with: earlier
groups were ended before their replacement started, and their number may have been reused since)
and every Python-backend stub of this instance, then removes the shared-memory segments, socket
directory, workspace and (if empty) every scratch directory. ``SERVER_PGID`` 0 means there is no
server process to kill (``Triton(embedded=True)``).

Why the stubs are killed here. In embedded mode the stubs are children of the user's process and
in no group of their own. Triton's stub notices its parent's death by itself (it probes the parent
every 300 ms) but its own shutdown path can deadlock (measured: a stub whose metrics thread was
waiting for the dead parent's answer never exited), so the watchdog ends them with SIGKILL. The
pipe closes when the kernel tears down the dead process, so the stubs are gone within the time it
takes this process to be scheduled and scan ``/proc`` once (well under a second on an idle
machine). A stub is recognised positively: the process runs ``triton_python_backend_stub``, belongs
to this user, and its shared-memory region argument starts with this instance's ``SHM_PREFIX``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from typing import List

try:  # imported as part of pytriton (its path, tests)
    from pytriton._platform import proc
except ImportError:  # run as `python -S <this file>`: sys.path[0] is this directory, whose proc.py is stdlib-only
    import proc  # type: ignore[no-redef]

STUB_EXECUTABLE = "triton_python_backend_stub"


def _stub_of(pid: int, shm_prefix: str) -> bool:
    """True if process ``pid`` is a Python-backend stub of ours whose region name starts with ``shm_prefix-``."""
    if proc.owner(pid) != os.geteuid():
        return False
    argv = proc.cmdline(pid) or []
    return (
        bool(argv)
        and os.path.basename(argv[0]) == STUB_EXECUTABLE
        and any(arg.startswith(f"{shm_prefix}-") for arg in argv[1:])
    )


def kill_stubs(shm_prefix: str) -> List[int]:
    """SIGKILL every running stub of the instance whose shared-memory prefix is ``shm_prefix``; returns their pids.

    Each candidate is pinned with a pidfd (where the kernel and Python have one) and checked again
    through it, so a pid reused between the check and the signal is never hit.
    """
    killed = []
    for pid in proc.pids():
        if not _stub_of(pid, shm_prefix):
            continue
        pidfd = -1
        with contextlib.suppress(OSError, AttributeError):
            pidfd = os.pidfd_open(pid)  # Linux 5.3, Python 3.9
        try:
            if pidfd >= 0:
                if _stub_of(pid, shm_prefix):  # still the same process: the pidfd pins it
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    killed.append(pid)
            else:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        except OSError:
            pass  # it exited meanwhile
        finally:
            if pidfd >= 0:
                os.close(pidfd)
    return killed


def main(argv: List[str]) -> int:
    read_fd, pgid, shm_prefix, paths = int(argv[0]), int(argv[1]), argv[2], argv[3:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    data = b""
    while True:
        chunk = os.read(read_fd, 64)
        if not chunk:
            break
        data += chunk
    lines = data.decode(errors="replace").splitlines()
    if "done" in lines:
        return 0
    for line in lines:
        if line.startswith("pgid ") and line[5:].isdigit():
            pgid = int(line[5:])
    if pgid > 0:  # 0: an embedded server, whose stubs are children of the user's process (killed below)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    kill_stubs(shm_prefix)
    time.sleep(0.2)  # let the killed stubs release their mappings before sweeping names
    for name in os.listdir("/dev/shm"):
        if name.startswith(shm_prefix):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/dev/shm", name))
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
    for line in lines:
        if line.startswith("scratch /tmp/python_env_"):
            with contextlib.suppress(OSError):
                os.rmdir(line[len("scratch ") :])  # only ever removes an empty directory
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
