"""Which models' Python-backend shared memory has grown: the input to recycling their instances.

Triton's Python backend gives every stub process one shared-memory region for the tensors it
exchanges with the server (``shm-default-byte-size``, 4 MiB here). A larger request grows the
region, and it never shrinks: its pages stay resident in ``/dev/shm`` and in the RSS of both the
server and the stub for as long as the stub lives. The only way to give that memory back is a new
stub with a new region, which ``Triton`` gets by loading a new generation of the model once it is
idle (docs/architecture.md, "Memory after large requests").

This module only reads ``/proc`` and ``/dev/shm``: it finds the server's stub processes, the model
each one serves (from its command line: the model's ``model.py`` in the repository) and how much of
its region is resident (allocated blocks of the region's file, not its apparent size).
"""

from __future__ import annotations

import os
import pathlib
from typing import Dict, Tuple

from pytriton._platform import proc as _proc

_STUB = "triton_python_backend_stub"


def _resident(path: pathlib.Path) -> int:
    """Allocated bytes of a file (not its apparent size); 0 if it is gone."""
    try:
        return os.stat(path).st_blocks * 512
    except OSError:
        return 0


def any_region_over(region_prefix: str, threshold_bytes: int, shm: pathlib.Path = pathlib.Path("/dev/shm")) -> bool:
    """True if a region named ``region_prefix...`` holds more than ``threshold_bytes`` resident.

    One listing of ``shm`` and a ``stat`` per region of this server: the check the supervisor makes
    every few seconds, so that :func:`stub_regions`, which reads every process's ``/proc`` entry
    (thousands on a busy host), runs only when a region has grown.
    """
    try:
        with os.scandir(shm) as entries:
            names = [entry.name for entry in entries if entry.name.startswith(region_prefix)]
    except OSError:
        return False
    return any(_resident(shm / name) > threshold_bytes for name in names)


def stub_regions(
    server_pid: int,
    repository: pathlib.Path,
    region_prefix: str,
    proc: pathlib.Path = pathlib.Path(_proc.PROC),
    shm: pathlib.Path = pathlib.Path("/dev/shm"),
) -> Dict[int, Tuple[str, int]]:
    """``{stub pid: (model name, resident bytes of its region)}`` for the stubs of ``server_pid``.

    Stubs of other repositories, and regions without ``region_prefix``, are ignored. A stub or
    region that vanishes while it is read is skipped (stubs come and go during reloads). Reads
    every process's ``/proc/<pid>/stat``: call it when :func:`any_region_over` says it is needed.
    """
    found: Dict[int, Tuple[str, int]] = {}
    root = str(repository).rstrip("/") + "/"
    for pid in _proc.children(server_pid, str(proc)):
        words = [word for word in _proc.cmdline(pid, str(proc)) or [] if word]
        if not words or not words[0].endswith(_STUB):
            continue
        model = next((word[len(root) :].split("/", 1)[0] for word in words if word.startswith(root)), None)
        region = next((word for word in words if word.startswith(region_prefix) and "/" not in word), None)
        if model is None or region is None:
            continue
        try:
            resident = os.stat(shm / region).st_blocks * 512
        except OSError:
            continue
        found[pid] = (model, resident)
    return found


def grown_models(regions: Dict[int, Tuple[str, int]], threshold_bytes: int) -> Dict[str, int]:
    """``{model: largest resident region}`` for models with a region above ``threshold_bytes``."""
    grown: Dict[str, int] = {}
    for model, resident in regions.values():
        if resident > threshold_bytes:
            grown[model] = max(resident, grown.get(model, 0))
    return grown
