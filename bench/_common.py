"""What the benchmark's scripts share: ports, load-generator processes, the plain baseline's server.

Every scenario module (``bench.suite``, ``bench.kinds``, ``bench.inprocess``, ``bench.instances``,
``bench.remote``, ``bench.ab``, ...) imports its helpers from here; this module imports no other
``bench`` module but ``bench.models``, so there is no import cycle among them. Load generators run
in child processes (``python -m bench.load``) so that the client's CPU is not the serving process's.
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np

from bench.models import write_plain_models
from pytriton.server.security import TRITON_ACCESS_HEADER

ROOT = pathlib.Path(__file__).resolve().parents[1]


def free_ports(count: int) -> List[int]:
    """``count`` loopback ports free at the time of the call (closed again before returning)."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def load(spec: Dict[str, Any], timeout_s: float = 120.0) -> Dict[str, Any]:
    """Run one load generator in its own process and return its JSON result."""
    completed = subprocess.run(
        [sys.executable, "-m", "bench.load", json.dumps(spec)], capture_output=True, text=True, cwd=ROOT,
        timeout=timeout_s, check=False,
    )  # fmt: skip
    if completed.returncode != 0:
        raise RuntimeError(f"load generator failed for {spec}: {completed.stderr[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def parallel_load(spec: Dict[str, Any], processes: int) -> Dict[str, Any]:
    """Split ``concurrency`` over several client processes (one Python client cannot saturate the server)."""
    per_process = dict(spec, concurrency=max(1, spec["concurrency"] // processes))
    children = [
        subprocess.Popen([sys.executable, "-m", "bench.load", json.dumps(per_process)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(processes)
    ]  # fmt: skip
    results = []
    for child in children:
        out, err = child.communicate(timeout=120)
        if child.returncode != 0:
            raise RuntimeError(f"load generator failed: {err[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return {
        "requests_per_s": sum(r["requests_per_s"] for r in results),
        "p50_ms": float(np.median([r["p50_ms"] for r in results])),
        "p99_ms": float(max(r["p99_ms"] for r in results)),
    }


def _auth(token: Optional[str]) -> Dict[str, str]:
    """The header that passes the server's restricted endpoints (statistics, model repository)."""
    return {TRITON_ACCESS_HEADER: token} if token else {}


def model_stats(port: int, model: str, token: Optional[str] = None) -> Dict[str, Any]:
    """Triton's counters for ``model``: inferences, executions and the mean µs per request of each phase."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", f"/v2/models/{model}/stats", headers=_auth(token))
    stats = json.loads(connection.getresponse().read())["model_stats"][0]
    connection.close()
    phases = stats["inference_stats"]
    result: Dict[str, Any] = {"inferences": int(stats["inference_count"]), "executions": int(stats["execution_count"])}
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        count = int(phases[phase]["count"])
        result[f"{phase}_us"] = int(phases[phase]["ns"]) / count / 1e3 if count else 0.0
    return result


def load_plain_models(port: int, names: List[str], token: Optional[str] = None) -> None:
    """Load the plain baseline models ``names`` through the repository API (raises on a refusal)."""
    for name in names:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.request("POST", f"/v2/repository/models/{name}/load", body=b"{}", headers=_auth(token))
        response = connection.getresponse()
        body = response.read()
        connection.close()
        if response.status != 200:
            raise RuntimeError(f"could not load {name}: {body!r}")


def startup_plain(repeats: int) -> Dict[str, Any]:
    """Median launch-to-ready and SIGINT-to-exit of a plain ``tritonserver`` with one Python-backend model."""
    from pytriton._serving.launched import server_environment as _server_environment
    from pytriton.server.distribution import find_server, shared_libpython_dir, stub_environment

    server = find_server()
    env = _server_environment(stub_environment().bin_dir, [shared_libpython_dir(), *server.library_dirs])
    ready, stop = [], []
    with tempfile.TemporaryDirectory() as repo:
        write_plain_models(pathlib.Path(repo))
        for _ in range(repeats):
            http_port, grpc_port, metrics_port = free_ports(3)
            started = time.monotonic()
            process = subprocess.Popen(
                [str(server.binary), f"--model-repository={repo}", f"--backend-directory={server.backend_dir}",
                 f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
                 "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                 "--model-control-mode=explicit", "--load-model=plain_identity", "--disable-auto-complete-config",
                 "--backend-config=python,shm-region-prefix-name=pytriton-bench-plain"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=1)
                try:
                    connection.request("GET", "/v2/health/ready")
                    if connection.getresponse().status == 200:
                        break
                except OSError:
                    pass
                finally:
                    # An open connection would make Triton's SIGINT wait for it (up to its exit timeout).
                    connection.close()
                time.sleep(0.005)
            ready.append(time.monotonic() - started)
            stopping = time.monotonic()
            process.send_signal(signal.SIGINT)
            process.wait(60)
            stop.append(time.monotonic() - stopping)
    return {"ready_s": float(np.median(ready)), "stop_s": float(np.median(stop)), "runs": repeats}


def environment() -> Dict[str, Any]:
    """Versions, CPUs and time of the run, recorded with every result."""
    import tritonclient

    from pytriton import __version__
    from pytriton.server.distribution import TRITON_VERSION

    return {
        "pytriton": __version__, "tritonserver": TRITON_VERSION, "python": platform.python_version(),
        "numpy": np.__version__, "tritonclient": getattr(tritonclient, "__version__", "?"),
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "platform": platform.platform(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip
