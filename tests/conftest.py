"""Shared test helpers: free loopback ports and leak checks."""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest

# Before any test imports tritonclient's gRPC: the in-process and embedded servers fork stubs from
# several threads at once, which grpcio 1.67's fork handlers abort on (see pytriton/inprocess).
import pytriton.inprocess  # noqa: F401

# pytriton binds every interface by default; the tests serve on loopback only. A test's explicit
# TritonConfig still wins over these variables, and child processes the tests start inherit them.
for _endpoint in ("HTTP", "GRPC", "METRICS"):
    os.environ.setdefault(f"PYTRITON_TRITON_CONFIG_{_endpoint}_ADDRESS", "127.0.0.1")

# Every numeric dtype Triton carries (BYTES is tested separately).
DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]


def stub_numpy_status() -> Tuple[str, Optional[str]]:
    """How this interpreter's backend stub gets numpy, and why string tensors cannot work, if so."""
    import numpy

    from pytriton.proxy.stubside import _stub_bytes
    from pytriton.server.distribution import stub_environment

    try:
        env = stub_environment()
    except Exception as exc:  # reported by the tests that start a server
        return f"stub environment unusable: {exc}", None
    if env.own:
        return "numpy 1.x in pytriton's private stub environment", None
    if env.numpy2:
        text = f"numpy {numpy.__version__} from this environment (numeric via DLPack, strings via _stub_bytes)"
        return text, _stub_bytes.numpy2_problem()
    return f"numpy {numpy.__version__} from this environment", None


STUB_NUMPY, STUB_STRINGS_PROBLEM = stub_numpy_status()
# For tests that need string (BYTES) tensors through the stub: skipped, with the reason, where the
# stub cannot carry them (none of the supported Pythons today; see README "Python versions").
needs_stub_strings = pytest.mark.skipif(
    STUB_STRINGS_PROBLEM is not None, reason=f"string tensors unavailable: {STUB_STRINGS_PROBLEM}"
)


def pytest_terminal_summary(terminalreporter) -> None:
    """End every run (``-q`` included) with the Python and the stub numpy it tested."""
    version = ".".join(str(part) for part in sys.version_info[:3])
    strings = "available" if STUB_STRINGS_PROBLEM is None else f"UNAVAILABLE ({STUB_STRINGS_PROBLEM})"
    terminalreporter.write_line(f"pytriton: Python {version}; backend stub: {STUB_NUMPY}; string tensors {strings}")


def free_ports(count: int) -> List[int]:
    """``count`` distinct TCP ports that are free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def triton_ports() -> Dict[str, int]:
    http, grpc, metrics = free_ports(3)
    return {"http_port": http, "grpc_port": grpc, "metrics_port": metrics}


def shm_entries(prefix: str) -> List[str]:
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(prefix))


def owned_resources(triton) -> tuple:
    """What a running launched ``Triton`` owns, for a clean-up check after it stopped:
    (server pid, shared-memory prefix, socket directory, workspace path, scratch directory or None)."""
    backend = triton._backend
    return (
        backend.server.pid,
        triton._shm_prefix,
        triton._socket_dir,
        triton._workspace.path,
        backend.scratch.path,
    )


def process_group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def shm_span(pid: int) -> Tuple[int, int]:
    """The lowest start and highest end of ``pid``'s mappings of ``/dev/shm`` files (a stub's region); (0, 0) if none."""
    from pytriton._platform import proc

    spans = [(start, end) for start, end, path in proc.mappings(pid) if path.startswith("/dev/shm/")]
    return (min(start for start, _ in spans), max(end for _, end in spans)) if spans else (0, 0)


def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


@pytest.fixture()
def ports():
    return triton_ports()


@pytest.fixture()
def scratch_root(tmp_path, monkeypatch):
    """A fake ``/tmp`` for the Python backend's ``python_env_*`` directories (server/_scratch.py), and a
    private ``PYTRITON_HOME`` for the first-load window's lock; the fake ``/tmp`` is returned, empty."""
    from pytriton.server import _scratch

    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(_scratch, "SCRATCH_ROOT", str(root))
    monkeypatch.setenv("PYTRITON_HOME", str(tmp_path / "home"))
    return root
