"""Rolling restart of pytriton replicas behind nginx under load: does any request fail?

Run as ``python -m bench.rollout`` (``make rollout-test``). It starts three replicas
(``bench/rollout_replica.py``, each its own process with its own ``Triton`` on free loopback
ports) and nginx in front of them, for HTTP and for gRPC (HTTP/2), with its configuration, pid,
logs and temporary files in a temporary directory, as the current user. It then drives
``--in-flight`` requests at once through nginx (half over HTTP, half over gRPC, tritonclient,
each checked bit for bit), restarts the replicas one by one while the load runs (SIGTERM, wait for
the exit, start again on the same ports, wait until ready), and reports total and failed requests
and latency percentiles during the rollout: a table on stdout and a JSON in ``bench/results/``.
Exit status 1 if any request failed, 2 if nginx is missing.

Why no request is lost (docs/rollout.md has the full argument): a replica told to stop keeps
serving what it has and refuses only what it cannot serve, in ways nginx retries on another
replica (``proxy_next_upstream``/``grpc_next_upstream`` with ``non_idempotent``): a new connection
is closed before any response or refused (``error``), an HTTP request reaching a draining worker
gets 503 (``http_503``). A gRPC refusal is a gRPC status (UNAVAILABLE) inside an HTTP 200, which
nginx cannot see; the gRPC client retries it (``--client-retries``), as gRPC clients are meant to.

Everything started is ended on exit, on Ctrl-C and on SIGTERM; every wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import http.client
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np

RESULTS = pathlib.Path(__file__).parent / "results"
REPLICAS = 3
START_TIMEOUT_S = 90.0
EXIT_TIMEOUT_S = 30.0
NGINX_HINT = (
    "nginx is not installed (no 'nginx' on PATH or in /usr/sbin). Install it, e.g. "
    "'apt-get install -y nginx' (Debian/Ubuntu; the service need not run) or 'dnf install nginx', "
    "or pass --nginx /path/to/nginx."
)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def free_ports(count: int) -> List[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class NginxMissing(RuntimeError):
    """No nginx binary was found (the message says how to install one)."""


def find_nginx(explicit: Optional[str]) -> str:
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit
        raise NginxMissing(f"--nginx {explicit}: not an executable file. {NGINX_HINT}")
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx", "/usr/local/sbin/nginx"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise NginxMissing(NGINX_HINT)


def nginx_config(workdir: pathlib.Path, http_port: int, grpc_port: int, replicas: List[List[int]]) -> str:
    """nginx.conf: one HTTP and one gRPC (HTTP/2) front, passive retry to the next replica."""
    http_servers = "\n".join(f"        server 127.0.0.1:{ports[0]} max_fails=1 fail_timeout=1s;" for ports in replicas)
    grpc_servers = "\n".join(f"        server 127.0.0.1:{ports[1]} max_fails=1 fail_timeout=1s;" for ports in replicas)
    temp = {name: workdir / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    return f"""
worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
    # One line per request: the status of each replica tried ("503, 200" = retried once).
    log_format tried '$upstream_status';
    client_body_temp_path {temp["body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
    upstream replicas_http {{
{http_servers}
        keepalive 64;
    }}
    upstream replicas_grpc {{
{grpc_servers}
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{http_port};
        access_log {workdir}/access-http.log tried;
        location / {{
            proxy_pass http://replicas_http;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_connect_timeout 2s;
            proxy_read_timeout 30s;
            proxy_next_upstream error timeout http_502 http_503 non_idempotent;
            proxy_next_upstream_timeout 10s;
        }}
    }}
    server {{
        listen 127.0.0.1:{grpc_port} http2;
        access_log {workdir}/access-grpc.log tried;
        location / {{
            grpc_pass grpc://replicas_grpc;
            grpc_connect_timeout 2s;
            grpc_read_timeout 30s;
            grpc_next_upstream error timeout http_502 http_503 non_idempotent;
            grpc_next_upstream_timeout 10s;
        }}
    }}
}}
"""


def http_ready(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
    try:
        connection.request("GET", "/v2/health/ready")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not done within {timeout_s:.0f} s")
        time.sleep(0.05)


class Replica:
    """One replica process; its log goes to ``<workdir>/replica-<n>.log``."""

    def __init__(self, index: int, ports: List[int], workdir: pathlib.Path, extra: List[str]):
        self.index, self.ports, self.workdir, self.extra = index, ports, workdir, extra
        self.process: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> None:
        log = (self.workdir / f"replica-{self.index}.log").open("ab")
        self.process = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "bench.rollout_replica", *map(str, self.ports), *self.extra],
            cwd=pathlib.Path(__file__).parents[1],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal reaches only this script, which stops them in order
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
        log.close()

    def wait_ready(self) -> None:
        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"replica {self.index} exited with {self.process.returncode}: {self.log_tail()}")
            return http_ready(self.ports[0])

        wait_until(ready, START_TIMEOUT_S, f"replica {self.index} ready")

    def stop(self, timeout_s: float = EXIT_TIMEOUT_S) -> Optional[int]:
        """SIGTERM (the replica drains), wait for the exit; SIGKILL after ``timeout_s``."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                return process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        return process.returncode

    def log_tail(self, lines: int = 15) -> str:
        path = self.workdir / f"replica-{self.index}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


class Load:
    """``in_flight`` client threads (half HTTP, half gRPC) sending identity requests until stopped."""

    def __init__(self, http_port: int, grpc_port: int, in_flight: int, client_retries: int, backoff_s: float):
        self.http_port, self.grpc_port = http_port, grpc_port
        self.client_retries, self.backoff_s = client_retries, backoff_s
        self.records: List[tuple] = []  # (protocol, started, latency_s, ok, error)
        self.retries = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=("http" if n % 2 else "grpc", n), daemon=True)
            for n in range(in_flight)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 40.0) -> bool:
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _run(self, protocol: str, seed: int) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException

        rng = np.random.default_rng(seed)
        client: Any
        if protocol == "http":
            client = httpclient.InferenceServerClient(f"127.0.0.1:{self.http_port}", network_timeout=60.0)
        else:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc_port}")
        module: Any = httpclient if protocol == "http" else grpcclient
        try:
            while not self._stop.is_set():
                data = rng.random((1, 16), dtype=np.float32)
                tensor = module.InferInput("INPUT", list(data.shape), "FP32")
                tensor.set_data_from_numpy(data)
                started = time.monotonic()
                error = ""
                for attempt in range(1 + self.client_retries):
                    try:
                        kwargs = {"client_timeout": 30.0} if protocol == "grpc" else {}
                        result = client.infer("identity", [tensor], **kwargs).as_numpy("OUTPUT")
                        error = "" if np.array_equal(result, data) else "wrong result"
                        break
                    except InferenceServerException as exc:
                        error = f"{exc.status()}: {str(exc.message())[:120]}"
                        # Only a gRPC UNAVAILABLE is retried: a refusal (or nginx's 502 when a
                        # replica ended under a request), never executed to completion.
                        if protocol != "grpc" or "UNAVAILABLE" not in str(exc.status()):
                            break
                        if attempt < self.client_retries:
                            with self._lock:
                                self.retries += 1
                            # Exponential backoff: the attempts span the replica's refusal phase
                            # (the rest of its drain), after which it refuses connections, which
                            # nginx retries itself.
                            time.sleep(self.backoff_s * 2**attempt)
                    except Exception as exc:  # noqa: BLE001 - counted as a failure with its text
                        error = f"{type(exc).__name__}: {str(exc)[:120]}"
                        break
                with self._lock:
                    self.records.append((protocol, started, time.monotonic() - started, not error, error))
        finally:
            client.close()


def nginx_retried(log: pathlib.Path) -> Dict[str, int]:
    """From nginx's access log: requests it sent to more than one replica, and the statuses it retried on."""
    retried = 0
    statuses: Dict[str, int] = {}
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            tried = [status.strip() for status in line.replace(":", ",").split(",")]
            if len(tried) > 1:
                retried += 1
                for status in tried[:-1]:
                    statuses[status] = statuses.get(status, 0) + 1
    return {"requests": retried, **{f"after_{status}": count for status, count in sorted(statuses.items())}}


def percentile_ms(values: List[float], q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)) * 1000.0, 2) if values else None


def run(args: argparse.Namespace) -> Dict[str, Any]:
    nginx = find_nginx(args.nginx)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="pytriton-rollout-"))
    ports = free_ports(3 * REPLICAS + 2)
    replica_ports = [ports[3 * n : 3 * n + 3] for n in range(REPLICAS)]
    front_http, front_grpc = ports[-2:]
    extra = ["--work-ms", str(args.work_ms), "--drain-delay-secs", str(args.drain_delay_secs)]
    replicas = [Replica(n, replica_ports[n], workdir, extra) for n in range(REPLICAS)]
    nginx_process: Optional[subprocess.Popen[bytes]] = None
    load: Optional[Load] = None
    report: Dict[str, Any] = {}
    try:
        for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (workdir / name).mkdir()
        (workdir / "nginx.conf").write_text(nginx_config(workdir, front_http, front_grpc, replica_ports))
        for replica in replicas:
            replica.start()
        nginx_process = subprocess.Popen(  # noqa: S603
            [nginx, "-p", str(workdir), "-c", str(workdir / "nginx.conf"), "-e", str(workdir / "nginx-error.log")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(workdir / "nginx-stderr.log").open("wb"),
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
        for replica in replicas:
            replica.wait_ready()
        wait_until(lambda: http_ready(front_http), 10.0, "nginx ready")
        print(f"3 replicas ready behind nginx (HTTP :{front_http}, gRPC :{front_grpc}); workdir {workdir}", flush=True)
        load = Load(front_http, front_grpc, args.in_flight, args.client_retries, args.backoff_s)
        load.start()
        time.sleep(args.warmup_s)
        rollout_start = time.monotonic()
        steps = []
        for replica in replicas:
            began = time.monotonic()
            code = replica.stop()
            stopped = time.monotonic()
            replica.start()
            replica.wait_ready()
            steps.append(
                {
                    "replica": replica.index,
                    "exit_code": code,
                    "stop_s": round(stopped - began, 2),
                    "restart_to_ready_s": round(time.monotonic() - stopped, 2),
                }
            )
            print(
                f"replica {replica.index}: exit {code}, stopped in {steps[-1]['stop_s']} s, "
                f"ready again in {steps[-1]['restart_to_ready_s']} s",
                flush=True,
            )
        rollout_end = time.monotonic()
        time.sleep(args.cooldown_s)
        if not load.stop():
            raise RuntimeError("load threads did not finish within 40 s")
        records = list(load.records)
        during = [r for r in records if rollout_start <= r[1] <= rollout_end]
        failures = [r for r in records if not r[3]]
        errors: Dict[str, int] = {}
        for record in failures:
            errors[f"{record[0]} {record[4]}"] = errors.get(f"{record[0]} {record[4]}", 0) + 1
        report = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "replicas": REPLICAS,
            "in_flight": args.in_flight,
            "work_ms": args.work_ms,
            "drain_delay_secs": args.drain_delay_secs,
            "client_retries": args.client_retries,
            "rollout_s": round(rollout_end - rollout_start, 2),
            "steps": steps,
            "total_requests": len(records),
            "failed_requests": len(failures),
            "grpc_client_retries_used": load.retries,
            "backoff_s": args.backoff_s,
            "nginx_retried": {
                protocol: nginx_retried(workdir / f"access-{protocol}.log") for protocol in ("http", "grpc")
            },
            "errors": errors,
            "during_rollout": {
                "requests": len(during),
                "failed": sum(1 for r in during if not r[3]),
                "p50_ms": percentile_ms([r[2] for r in during], 50),
                "p99_ms": percentile_ms([r[2] for r in during], 99),
                "http_p50_ms": percentile_ms([r[2] for r in during if r[0] == "http"], 50),
                "grpc_p50_ms": percentile_ms([r[2] for r in during if r[0] == "grpc"], 50),
            },
            "whole_run": {
                "p50_ms": percentile_ms([r[2] for r in records], 50),
                "p99_ms": percentile_ms([r[2] for r in records], 99),
            },
        }
        return report
    finally:
        if load is not None:
            load.stop(5.0)
        for replica in replicas:
            replica.stop(EXIT_TIMEOUT_S)
        if nginx_process is not None and nginx_process.poll() is None:
            os.killpg(nginx_process.pid, signal.SIGQUIT)  # graceful: its worker ends too
            try:
                nginx_process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(nginx_process.pid, signal.SIGKILL)
                nginx_process.wait(10)
        if report.get("failed_requests"):
            tail = (workdir / "nginx-error.log").read_text(errors="replace").splitlines()[-10:]
            report["nginx_error_log_tail"] = tail
        shutil.rmtree(workdir, ignore_errors=True)


def _table(report: Dict[str, Any]) -> str:
    during = report["during_rollout"]
    rows = [
        ("total requests", report["total_requests"]),
        ("failed requests", report["failed_requests"]),
        ("gRPC UNAVAILABLE retried by the client", report["grpc_client_retries_used"]),
        ("HTTP requests nginx retried on another replica", report["nginx_retried"]["http"]["requests"]),
        ("gRPC requests nginx retried on another replica", report["nginx_retried"]["grpc"]["requests"]),
        ("requests during the rollout", during["requests"]),
        ("p50 during the rollout (ms)", during["p50_ms"]),
        ("p99 during the rollout (ms)", during["p99_ms"]),
        ("p50 / p99 whole run (ms)", f"{report['whole_run']['p50_ms']} / {report['whole_run']['p99_ms']}"),
        ("rollout duration (s)", report["rollout_s"]),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=32, help="requests in flight (half HTTP, half gRPC)")
    parser.add_argument("--work-ms", type=float, default=5.0, help="model time per batch in the replicas")
    parser.add_argument("--drain-delay-secs", type=int, default=0, help="the replicas' TritonConfig.drain_delay_secs")
    parser.add_argument("--client-retries", type=int, default=4, help="gRPC UNAVAILABLE retries per request")
    parser.add_argument("--backoff-s", type=float, default=0.1, help="first retry's backoff (doubles each time)")
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--cooldown-s", type=float, default=2.0)
    parser.add_argument("--nginx", default=None, help="the nginx binary (default: from PATH or /usr/sbin)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "rollout.json")

    args = parser.parse_args(argv)

    def on_sigterm(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)  # clean up as for Ctrl-C
    try:
        report = run(args)
    except KeyboardInterrupt:
        print("interrupted; everything started was stopped", file=sys.stderr)
        return 130
    except NginxMissing as exc:
        print(f"rollout: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(_table(report))
    if report["errors"]:
        print("errors:", json.dumps(report["errors"], indent=2))
    print(f"JSON: {args.out}")
    return 1 if report["failed_requests"] else 0


if __name__ == "__main__":
    sys.exit(main())
