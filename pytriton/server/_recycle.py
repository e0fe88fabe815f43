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

**Pinned generations.** It also finds the regions of model generations that Triton 2.51 can never
free (:class:`PinnedRegions`): once a request has been handed to a dead stub's instance, the Python
backend keeps a response factory per request without deleting it, each factory holds the model, and
that generation (its instances' threads, about 36 each, and their regions) lives as long as the
server process. Such a region belongs to no live stub of the server. Only a new server process gives
them back; the supervisor recycles the server when they accumulate (pytriton/_serving/supervisor.py,
docs/architecture.md "Stub death").
"""

from __future__ import annotations

import os
import pathlib
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

from pytriton._platform import proc as _proc

_STUB = "triton_python_backend_stub"
# A region without a live stub is counted as pinned only after this long: a region exists for a
# moment before its stub starts (a load) and after its stub ended (an unload removes it then).
PINNED_GRACE_S = 5.0
# Pinned regions (one per instance of each pinned generation) past which the server is recycled even
# while it serves; below it, only once every model has been idle (docs/architecture.md, "Stub death").
# Why 64: a recycle under traffic refuses every request for 0.5-1 s, so it is kept for a runaway
# (64 regions: about 2,300 server threads and 256 MiB of /dev/shm); a handful of deaths under steady
# traffic then fails no healthy request and is freed at the next idle moment.
# PYTRITON_RECYCLE_PINNED_REGIONS: another limit; 0 never recycles under traffic.
PINNED_REGIONS_LIMIT = 64
# How long after a stub replacement ended the models are not taken as idle for a server recycle. A
# request Triton handed to a dead stub's instance (until the new generation serves, or queued for the
# old generation's survivor when it is ended) never becomes a batch, so the models look idle while
# its client waits: Triton 2.51 fails it only after the Python backend's waits (python_be.cc r24.10,
# SendMessageToStub and ReceiveMessageFromStub: a 1 s queue wait, then up to 1 s for the health
# mutex; longer on a loaded host), and 2.48-2.50 never answer it. Replacing the server then closes
# that client's connection ("connection closed") instead of its answer; 5 s covers the 2.51 waits
# with room for a loaded host (tests/e2e/test_healing.py, tests/unit/test_pinned_recycle.py).
DEAD_REQUEST_S = 5.0


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


def pinned_limit(environ: Dict[str, str]) -> int:
    """``PYTRITON_RECYCLE_PINNED_REGIONS`` (default :data:`PINNED_REGIONS_LIMIT`; 0: only when idle).

    Raises:
        ValueError: the value is not a whole number >= 0 (the message says which variable).
    """
    text = environ.get("PYTRITON_RECYCLE_PINNED_REGIONS", "").strip()
    if not text:
        return PINNED_REGIONS_LIMIT
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            f"PYTRITON_RECYCLE_PINNED_REGIONS={text!r} is not a whole number >= 0: give how many regions of "
            "pinned model generations make pytriton recycle tritonserver under traffic (0: only when idle)."
        )
    return value


def model_stubs(server_pid: int, model: str, proc: pathlib.Path = pathlib.Path(_proc.PROC)) -> List[int]:
    """Pids of the live (not zombie) stub processes of ``model`` under ``server_pid``, sorted.

    A stub names its model's ``<repository>/<model>/<version>/model.py`` on its command line. For
    the benchmarks and tests that kill stubs (bench/stub_deaths.py, tests/e2e/test_healing.py).
    """
    found = []
    for pid in _proc.children(server_pid, str(proc), running_only=True):
        words = _proc.cmdline(pid, str(proc)) or []
        if words and words[0].endswith(_STUB) and any(f"/{model}/" in word for word in words):
            found.append(pid)
    return sorted(found)


def live_stub_regions(server_pid: int, region_prefix: str, proc: pathlib.Path = pathlib.Path(_proc.PROC)) -> Set[str]:
    """Names of the regions (``region_prefix...``) named on the command lines of the server's live stubs.

    A zombie stub (dead, not yet reaped: Triton never reaps a stub of a pinned generation) has an
    empty command line, so its region is not among them.
    """
    live: Set[str] = set()
    for pid in _proc.children(server_pid, str(proc)):
        words = _proc.cmdline(pid, str(proc)) or []
        if not words or not words[0].endswith(_STUB):
            continue
        live.update(word for word in words if word.startswith(region_prefix) and "/" not in word)
    return live


def server_regions(region_prefix: str, shm: pathlib.Path = pathlib.Path("/dev/shm")) -> Set[str]:
    """Names of the entries of ``shm`` that start with ``region_prefix`` (empty if ``shm`` cannot be read)."""
    try:
        with os.scandir(shm) as entries:
            return {entry.name for entry in entries if entry.name.startswith(region_prefix)}
    except OSError:
        return set()


class PinnedRegions:
    """Which of one server's regions have had no live stub for :data:`PINNED_GRACE_S` or longer.

    :meth:`update` takes the server's regions and the live stubs' regions (read by the caller, or by
    the unit tests from a fake) and returns the pinned ones. A region that gets a live stub again, or
    disappears, is forgotten. Make a new instance for a new server process.
    """

    def __init__(self, grace_s: float = PINNED_GRACE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._grace_s = grace_s
        self._clock = clock
        self._orphaned_since: Dict[str, float] = {}

    def reset(self) -> None:
        """Forget every region (a new server process: none of the old one's regions count)."""
        self._orphaned_since = {}

    @property
    def tracking(self) -> bool:
        """True while some region is without a live stub (pinned, or within its grace period)."""
        return bool(self._orphaned_since)

    def update(self, regions: Set[str], live: Set[str]) -> Set[str]:
        """The regions of ``regions`` not in ``live`` since at least the grace period (by earlier calls)."""
        now = self._clock()
        orphans = regions - live
        self._orphaned_since = {name: self._orphaned_since.get(name, now) for name in orphans}
        return {name for name, since in self._orphaned_since.items() if now - since >= self._grace_s}


def server_recycle_reason(pinned: int, limit: int, idle_for_s: Optional[float], idle_s: float) -> Optional[str]:
    """Why the server should be recycled now to free ``pinned`` regions, or None.

    ``idle_for_s``: how long every model has been idle (None while a batch runs). With any pinned
    region, an idle server is recycled (no request is there to fail); a busy one only once ``pinned``
    reaches ``limit`` (0: never while busy), because a recycle refuses the requests that arrive during
    it (docs/architecture.md, "Stub death").
    """
    if pinned <= 0:
        return None
    if idle_for_s is not None and idle_for_s >= idle_s:
        return f"{pinned} region(s) of pinned model generations, every model idle for {idle_for_s:.0f} s"
    if limit and pinned >= limit:
        return f"{pinned} region(s) of pinned model generations reached the limit of {limit}"
    return None
