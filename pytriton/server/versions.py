"""Which Triton builds pytriton runs on, how a server's version is read, and the version gates.

**Builds.** :data:`BUILDS` lists every supported Triton build: the ``nvidia-pytriton`` wheel on PyPI
that carries it, that wheel's sha256 per architecture (``install-server`` refuses any other file)
and the Pythons its backend stub exists for. :data:`DEFAULT_VERSION` is what ``install-server``
installs and ``find_server`` looks for unless ``PYTRITON_TRITON_VERSION`` names another one.

**The server's version** is read once, when the server is located (``distribution.find_server``),
from the install itself, without starting anything: the ``TRITON_VERSION`` file at the install's
root (``install-server`` writes it; NGC containers ship ``/opt/tritonserver/TRITON_VERSION``), else
the wheel hash ``install-server`` recorded. ``tritonserver`` itself has no ``--version`` option.

**Gates.** Each workaround of a Triton (or numpy/Python) bug, and each native feature of a newer
server, is a :class:`Gate` with the inclusive version ranges it applies to. ``Gate.active`` says
whether it applies to a given version and logs one DEBUG line per gate and version when it does
not. :data:`GATES` is the registry that docs/architecture.md ("Version gates") lists.

This module imports nothing of ``pytriton`` (the stub side may import it too).

Unit tests: tests/unit/test_triton_versions.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import threading
from typing import Dict, Optional, Set, Tuple

LOGGER = logging.getLogger("pytriton.server.versions")

Version = Tuple[int, ...]
# Inclusive bounds; None: open on that side. Compared on as many parts as the bound has, so
# ("2.48", "2.51") holds 2.48.0 to 2.51.x.
Range = Tuple[Optional[str], Optional[str]]

VERSION_ENV = "PYTRITON_TRITON_VERSION"
VERSION_FILE = "TRITON_VERSION"
COMPLETE_MARKER = ".pytriton-complete"


@dataclasses.dataclass(frozen=True)
class Build:
    """One supported Triton build and the PyPI wheel it comes from."""

    triton: str  # e.g. "2.51.0"
    wheel_version: str  # nvidia-pytriton's version carrying it
    sha256: Dict[str, str]  # architecture -> sha256 of the wheel (verified by hand when pinned)
    pythons: Tuple[Tuple[int, int], Tuple[int, int]]  # the backend stubs it ships, inclusive
    wheel_mb: int  # download size, for the progress line


BUILDS: Dict[str, Build] = {
    "2.51.0": Build(
        triton="2.51.0",
        wheel_version="0.7.0",
        sha256={
            "x86_64": "21f063ff93bb426d0c06b7a55e7eb9efcfe62c0dddd9a908e9877e18710128df",
            "aarch64": "f99e07ee56fe065337453956afba17d2673e02ec6a632c3de26ce6e7b32a0898",
        },
        pythons=((3, 8), (3, 13)),
        wheel_mb=55,
    ),
    # The older builds: nvidia-pytriton 0.5.12, 0.5.11 and 0.5.10, downloaded 2026-11-29 with `pip download
    # --no-deps --only-binary=:all: --platform manylinux_2_35_x86_64 nvidia-pytriton==<v>` and hashed
    # here (x86_64 only). Their stubs: 3.8 to 3.12. Each version was confirmed by the live server's
    # metadata (tests/e2e/test_check.py under `make test-triton-older TRITON_OLDER=<v>`).
    "2.50.0": Build(
        triton="2.50.0",
        wheel_version="0.5.12",
        sha256={"x86_64": "a44e099c6c4a77bdef94632591077f8217f6996571daeab77430c0aa5dca515c"},
        pythons=((3, 8), (3, 12)),
        wheel_mb=41,
    ),
    "2.49.0": Build(
        triton="2.49.0",
        wheel_version="0.5.11",
        sha256={"x86_64": "4f3e20b0e10e1f3dc9190a15be51fe308b796c11d1f018cb34b9915ca2cb54c9"},
        pythons=((3, 8), (3, 12)),
        wheel_mb=41,
    ),
    "2.48.0": Build(
        triton="2.48.0",
        wheel_version="0.5.10",
        sha256={"x86_64": "0c08d905d25ad71e887864625ec9e2692e6cb4a746c32c93e332e5c8476bc669"},
        pythons=((3, 8), (3, 12)),
        wheel_mb=41,
    ),
}
DEFAULT_VERSION = "2.51.0"


def parse(text: str) -> Version:
    """``"2.51.0"`` -> ``(2, 51, 0)``; ``ValueError`` for anything that is not dotted integers."""
    parts = text.strip().split(".")
    if not parts or not all(part.isdigit() for part in parts):
        raise ValueError(f"{text!r} is not a version like 2.51 or 2.51.0")
    return tuple(int(part) for part in parts)


def in_range(version: str, bounds: Range) -> bool:
    """Whether ``version`` lies within the inclusive ``bounds`` (each compared on its own length)."""
    parsed = parse(version)
    low, high = bounds
    if low is not None and parsed[: len(parse(low))] < parse(low):
        return False
    return high is None or parsed[: len(parse(high))] <= parse(high)


def range_text(bounds: Range) -> str:
    """``("2.44", "2.51")`` -> ``2.44 to 2.51``; open ends read "up to", "and later", "any version"."""
    low, high = bounds
    if low is None and high is None:
        return "any version"
    if high is None:
        return f"{low} and later"
    if low is None:
        return f"up to {high}"
    return f"{low} to {high}"


def supported_text() -> str:
    """The supported builds in words, newest first, e.g. ``2.51.0 (default), 2.48.0``."""
    ordered = sorted(BUILDS, key=parse, reverse=True)
    return ", ".join(f"{v} (default)" if v == DEFAULT_VERSION else v for v in ordered)


def resolve(requested: str) -> Build:
    """The supported build ``requested`` names; ``ValueError`` naming the supported ones.

    Matched on major.minor: ``2.48``, ``2.48.0`` and a patch release such as ``2.48.1`` (an NGC
    container's) all name the 2.48 build, whose workarounds and stubs they share.
    """
    try:
        wanted = parse(requested)[:2]
    except ValueError:
        wanted = ()
    for version, build in BUILDS.items():
        if len(wanted) == 2 and parse(version)[:2] == wanted:
            return build
    raise ValueError(f"Triton {requested} is not a build pytriton supports; supported: {supported_text()}.")


def selected_version(environ: Optional[Dict[str, str]] = None) -> str:
    """The build to use: ``PYTRITON_TRITON_VERSION`` resolved to a full version, else the default."""
    value = (os.environ if environ is None else environ).get(VERSION_ENV, "").strip()
    if not value:
        return DEFAULT_VERSION
    try:
        return resolve(value).triton
    except ValueError as exc:
        raise ValueError(f"{VERSION_ENV}={value}: {exc}") from None


def read_version(root: pathlib.Path) -> Optional[str]:
    """The Triton version of the install at ``root``, from its files; None when they do not say.

    ``TRITON_VERSION`` (a line like ``2.51.0``) wins; else the wheel sha256 that ``install-server``
    recorded in its completion marker, looked up in :data:`BUILDS`.
    """
    version_file = root / VERSION_FILE
    try:
        text = version_file.read_text().strip()
    except OSError:
        text = ""
    if text:
        first = text.split()[0]
        try:
            parse(first)
            return first
        except ValueError:
            return None
    try:
        recorded = (root / COMPLETE_MARKER).read_text().strip()
    except OSError:
        return None
    for build in BUILDS.values():
        if recorded and recorded in build.sha256.values():
            return build.triton
    return None


_SERVER_VERSION: Optional[str] = None


def note_server_version(version: str) -> None:
    """Remember the version of the server this process located (``find_server`` calls it)."""
    global _SERVER_VERSION
    _SERVER_VERSION = version


def server_version() -> Optional[str]:
    """The version of the server this process last located, or None before any was."""
    return _SERVER_VERSION


@dataclasses.dataclass(frozen=True)
class Gate:
    """A workaround (or a native feature) and the versions it applies to.

    ``triton``: inclusive Triton range; for a workaround, the builds known to have the bug (an open
    upper end: not known fixed in any build), for a feature, the builds that have it. ``numpy`` /
    ``python``: further ranges where the bug depends on them (None: does not). ``reason`` says what
    the bug or feature is; ``where`` names the code that applies it.
    """

    name: str
    reason: str
    where: str
    triton: Range = (None, None)
    numpy: Optional[Range] = None
    python: Optional[Range] = None

    def active(
        self, triton: Optional[str] = None, *, numpy: Optional[str] = None, python: Optional[str] = None
    ) -> bool:
        """Whether the gate applies to these versions (a version not given is not checked).

        Logs one DEBUG line per gate and set of versions when it does not apply.
        """
        checks = [("Triton", triton, self.triton), ("numpy", numpy, self.numpy), ("Python", python, self.python)]
        for label, version, bounds in checks:
            if version is None or bounds is None or in_range(version, bounds):
                continue
            _debug_once(
                (self.name, triton, numpy, python),
                f"{self.name} inactive: {label} {version} is outside {range_text(bounds)} ({self.reason})",
            )
            return False
        return True


_LOGGED: Set[Tuple[Optional[str], ...]] = set()
_LOGGED_LOCK = threading.Lock()


def _debug_once(key: Tuple[Optional[str], ...], message: str) -> None:
    with _LOGGED_LOCK:
        if key in _LOGGED:
            return
        _LOGGED.add(key)
    LOGGER.debug(message)


# -- the registry --------------------------------------------------------------------------------
# A native feature: used where the server has it.
HTTP_MAX_INPUT_SIZE = Gate(
    "http-max-input-size",
    "tritonserver's --http-max-input-size bounds the buffer a JSON input's declared shape allocates; "
    "pytriton passes max_request_bytes through it",
    "_serving/plan.py (LaunchPlan.http_max_input_size), _serving/launched.py, _remote.py",
    triton=("2.59", None),
)
# The backend stub was compiled against numpy 1: with numpy 2 its own conversions return empty
# numeric tensors and crash on BYTES, in every python_backend build pytriton runs.
STUB_NUMPY2 = Gate(
    "stub-numpy2",
    "the python_backend stub's numpy conversions were built against numpy 1",
    "server/distribution.py (stub_environment), proxy/stubside/_stub_bytes.py",
    triton=(None, None),
    numpy=("2", None),
)
STUB_DLPACK_KEYWORDS = Gate(
    "stub-dlpack-keywords",
    "the stub's Tensor.__dlpack__ takes none of the keywords numpy 2 passes first",
    "proxy/stubside/_stub_dlpack.py",
    triton=("2.48", None),
    numpy=("2", None),
)
# Workarounds of bugs seen in the supported builds (2.48 to 2.51) and not known fixed in any later
# one: active on every supported version. When a newer build is shown to fix one, its upper bound
# goes here, and the code that applies it asks ``active(server_version())``.
GRPC_TOKEN_KEY = Gate(
    "grpc-token-metadata-key",
    "a restricted gRPC protocol reads its token from 'triton-grpc-protocol-<key>', and refuses with UNAVAILABLE",
    "client/auth.py, client/_core.py",
    triton=("2.48", None),
)
JSON_DECLARED_SIZE_CAP = Gate(
    "declared-size-memory-cap",
    "a JSON HTTP input allocates what its declared shape says before reading the data "
    "(kept from 2.59 as well, beside --http-max-input-size)",
    "server/settings.py, server/process.py (RLIMIT_DATA)",
    triton=("2.48", None),
)
CRASH_RESTART = Gate(
    "restart-after-crash",
    "requests and failing warmups can crash tritonserver",
    "server/_restarts.py, _serving/launched.py, _serving/backend.py, _serving/models.py, triton.py",
    triton=("2.48", None),
)
DRAIN_HTTP_CONNECTIONS = Gate(
    "drain-http-connections",
    "after SIGINT the HTTP phase of shutdown waits for every HTTP connection to close",
    "server/_drain.py",
    triton=("2.48", None),
)
CORRID_STRING_BATCH = Gate(
    "corrid-string-batch",
    "with a TYPE_STRING CORRID control batched requests are refused; a string id reaches UINT64 models",
    "model_config/generator.py, proxy/stubside/_sequences.py, proxy/stubside/_stub.py",
    triton=("2.48", None),
)
STUB_STOP_DESTRUCTION = Gate(
    "stub-stop-destruction",
    "a stopped stub wedges the Python backend; destroying a stub mid-request crashed the in-process server",
    "proxy/_stub_watch.py",
    triton=("2.48", None),
)
MODEL_DELETER_THREADS = Gate(
    "model-deleter-threads",
    "ServerStop can return while the model deleter still runs; ServerDelete then frees what it holds",
    "inprocess/_teardown.py",
    triton=("2.48", None),
)
UNLOAD_AFTER_LOAD = Gate(
    "unload-right-after-load",
    "an unload or stop right after a load can meet the instance's backend thread still finishing the load's "
    "warm-up; the model deleter then crashes the process (StopBackendThread reads its queue unsynchronized)",
    "inprocess/_settle.py",
    triton=("2.48", None),
)
STUB_KILLED_IN_LOCK = Gate(
    "stub-killed-in-lock",
    "a stub killed while it holds one of the Python backend's shared-memory mutexes makes tritonserver abort "
    "at its next use of that mutex (boost::interprocess::lock_exception)",
    "_platform/native.py (kill_outside_robust_locks), server/process.py (kill_stub), proxy/_stub_watch.py, "
    "proxy/_backend_kind.py, inprocess/_stopped_stubs.py",
    triton=("2.48", None),
)
DEAD_STUB_KEPT = Gate(
    "dead-stub-kept",
    "the Python backend neither restarts a dead stub nor completes the unload of its model",
    "_serving/supervisor.py, server/_recycle.py",
    triton=("2.48", None),
)
# A bug of the older builds only: python_backend r24.07 to r24.09 (Triton 2.48 to 2.50) waits for the
# stub's reply to an execute on a condition variable with no timeout and no health check; r24.10
# (2.51) went back to the 24.05 path, which polls the stub's health and fails the request with "Stub
# process ... is not healthy". Nothing outside the server can answer the waiting request, so pytriton
# only says so (the model is still replaced and serves new requests).
DEAD_STUB_REQUEST_UNANSWERED = Gate(
    "dead-stub-request-unanswered",
    "a request that reached the instance of a stub that died is never answered (the backend waits for the "
    "stub's reply without a timeout); 2.51 fails it with 'Stub process is not healthy'",
    "_serving/supervisor.py",
    triton=("2.48", "2.50"),
)
QUEUED_CANCELLED = Gate(
    "cancelled-while-queued",
    "a request cancelled while it waited for a busy instance still reaches execute",
    "proxy/stubside/_stub_cancel.py",
    triton=("2.48", None),
)
GRPC_STREAM_WEDGE = Gate(
    "grpc-stream-wedge",
    "a cancellation arriving mid-response, or a refused request, can keep a gRPC stream open until the exit timeout",
    "client/_decoupled.py, openai/_backend.py, client/legacy/_requests.py",
    triton=("2.48", None),
)
# The Python backend creates each stub's region with boost.interprocess: shm_open(..., 0644) and then an
# explicit fchmod(fd, 0644), so the umask cannot narrow it; every supported build does so.
BACKEND_REGION_MODE = Gate(
    "backend-region-mode",
    "the Python backend creates its shared-memory regions 0644 (shm_open, then fchmod 0644), readable by every local user",
    "_platform/launch.py (the private launch's and the in-process server's chmod filter and umask), server/_shm_guard.py",
    triton=("2.48", None),
)
METRIC_SERIES_PER_STUB = Gate(
    "metric-series-per-stub",
    "a custom metric series is freed once per stub that created it",
    "proxy/stubside/_stub_metrics.py",
    triton=("2.48", None),
)
GATES: Tuple[Gate, ...] = (
    HTTP_MAX_INPUT_SIZE,
    STUB_NUMPY2,
    STUB_DLPACK_KEYWORDS,
    GRPC_TOKEN_KEY,
    JSON_DECLARED_SIZE_CAP,
    CRASH_RESTART,
    DRAIN_HTTP_CONNECTIONS,
    CORRID_STRING_BATCH,
    STUB_STOP_DESTRUCTION,
    MODEL_DELETER_THREADS,
    UNLOAD_AFTER_LOAD,
    STUB_KILLED_IN_LOCK,
    DEAD_STUB_KEPT,
    DEAD_STUB_REQUEST_UNANSWERED,
    QUEUED_CANCELLED,
    GRPC_STREAM_WEDGE,
    BACKEND_REGION_MODE,
    METRIC_SERIES_PER_STUB,
)
