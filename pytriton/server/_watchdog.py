"""Clean-up guard: removes a ``Triton`` instance's leftovers if its process dies without stopping.

Started by ``Triton.run`` as ``<python> -S <path of this file> READ_FD SERVER_PGID SHM_PREFIX PATH...``
(a script that imports only the standard library, without ``site``). It blocks reading a pipe whose
write end only the user's process holds, which sends newline-terminated lines: ``scratch PATH``
once a Python backend's scratch directory is known (server/_scratch.py), ``pgid N`` when a
restarted server runs in process group N, and ``done`` from ``Triton.stop`` (nothing left to do).
If the pipe closes without ``done``, the user's process died (e.g. SIGKILL) and the watchdog kills
the current server's process group (the last ``pgid`` line, else the one it started with: earlier
groups were ended before their replacement started, and their number may have been reused since),
then removes the shared-memory segments, socket directory, workspace and (if empty) every scratch
directory. ``SERVER_PGID`` 0 means there is no server process to kill (``Triton(embedded=True)``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from typing import List


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
    if pgid > 0:  # 0: an embedded server, whose stubs exit on their own once the user's process is gone
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
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
