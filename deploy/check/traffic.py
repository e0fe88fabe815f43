"""Traffic for ``deploy/deploy_check.sh``: readiness waits, HTTP and gRPC answers checked, bounded load.

Run with the repository's virtualenv (it needs ``tritonclient`` and numpy); every address is
127.0.0.1. Subcommands:

* ``wait-ready PORT``: poll ``GET /v2/health/ready`` until 200 (exit 1 after ``--timeout`` seconds);
* ``probes PORT``: the Deployment's probe paths (``/v2/health/live`` and ``/v2/health/ready``) answer 200;
* ``smoke --http PORT --grpc PORT``: one request over each protocol; the answers must equal the example
  model computed here from ``examples/production/weights.npz``;
* ``load``: threads sending HTTP inference requests (each answer checked) to the ports listed in an
  endpoints file (re-read before each request, like a Service whose endpoints change), until a stop
  file appears, readiness goes off (``--until-unready``, the client-side view of a drained server) or
  ``--max-seconds``; prints a JSON summary and exits 1 when any request failed.

A request counts as failed when it was sent and did not come back as 200 with the right numbers:
connection errors, resets, timeouts and error statuses alike. Nothing is retried.
"""

from __future__ import annotations

import argparse
import http.client
import json
import pathlib
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
MODEL = "Classifier"


def _expected(features: np.ndarray) -> np.ndarray:
    """The example model's probabilities, computed locally with the same code and weights as the image."""
    sys.path.insert(0, str(REPO / "examples" / "production"))
    try:
        import server  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    return np.asarray(server.load_model()(features), dtype=np.float32)


def _features(rows: int = 2) -> np.ndarray:
    return (np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) % 7) / 2.0


def _ready(port: int, path: str = "/v2/health/ready", timeout: float = 2.0) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def wait_ready(port: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _ready(port):
            return 0
        time.sleep(0.5)
    print(f"not ready: GET 127.0.0.1:{port}/v2/health/ready did not answer 200 within {timeout:.0f} s", file=sys.stderr)
    return 1


def probes(port: int) -> int:
    bad = [path for path in ("/v2/health/live", "/v2/health/ready") if not _ready(port, path)]
    if bad:
        print(f"probe paths not answering 200 on 127.0.0.1:{port}: {bad}", file=sys.stderr)
        return 1
    print(f"probes: /v2/health/live and /v2/health/ready answer 200 on 127.0.0.1:{port}")
    return 0


def smoke(http_port: int, grpc_port: int) -> int:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    features = _features()
    expected = _expected(features)
    failures: List[str] = []
    for name, module, port in (("HTTP", httpclient, http_port), ("gRPC", grpcclient, grpc_port)):
        client = module.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            request = module.InferInput("features", list(features.shape), "FP32")
            request.set_data_from_numpy(features)
            result = client.infer(MODEL, [request])
            probabilities = result.as_numpy("probabilities")
            label = result.as_numpy("label")
        finally:
            client.close()
        if not np.allclose(probabilities, expected, rtol=1e-5, atol=1e-6):
            failures.append(f"{name}: probabilities {probabilities.tolist()} != expected {expected.tolist()}")
        elif label.reshape(-1).tolist() != expected.argmax(axis=1).tolist():
            failures.append(f"{name}: label {label.tolist()} != {expected.argmax(axis=1).tolist()}")
        else:
            print(
                f"{name} 127.0.0.1:{port}: {MODEL} answered {probabilities.shape} probabilities, labels {label.reshape(-1).tolist()} (match the local model)"
            )
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


class _Load:
    """Threads sending checked HTTP requests; counts every outcome (nothing is retried)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.features = _features(1)
        self.expected = _expected(self.features)
        self.body = json.dumps(
            {
                "inputs": [
                    {
                        "name": "features",
                        "shape": [1, 4],
                        "datatype": "FP32",
                        "data": self.features.reshape(-1).tolist(),
                    }
                ]
            }
        ).encode()
        self.lock = threading.Lock()
        self.ok = 0
        self.failed = 0
        self.errors: List[str] = []
        self.per_port: Dict[int, int] = {}
        self.started: List[float] = []
        self.finished: List[float] = []
        self.stop = threading.Event()
        self.endpoints: List[int] = []
        self._endpoints_mtime = -1.0

    def _ports(self) -> List[int]:
        path = pathlib.Path(self.args.endpoints)
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return self.endpoints
        with self.lock:
            if mtime != self._endpoints_mtime:
                text = path.read_text()
                ports = [int(word) for word in text.split()]
                if ports:
                    self.endpoints, self._endpoints_mtime = ports, mtime
            return list(self.endpoints)

    def _one(self, conns: Dict[int, http.client.HTTPConnection], port: int) -> Optional[str]:
        conn = conns.get(port)
        if conn is None:
            conn = conns[port] = http.client.HTTPConnection("127.0.0.1", port, timeout=self.args.request_timeout)
        try:
            conn.request(
                "POST", f"/v2/models/{MODEL}/infer", body=self.body, headers={"Content-Type": "application/json"}
            )
            response = conn.getresponse()
            payload = response.read()
        except Exception as error:  # every transport error is a failed request
            conn.close()
            conns.pop(port, None)
            return f"{type(error).__name__}: {error}"
        if response.status != 200:
            return f"HTTP {response.status}: {payload[:200]!r}"
        outputs = {output["name"]: output for output in json.loads(payload)["outputs"]}
        got = np.asarray(outputs["probabilities"]["data"], dtype=np.float32).reshape(self.expected.shape)
        if not np.allclose(got, self.expected, rtol=1e-5, atol=1e-6):
            return f"wrong answer {got.tolist()}"
        return None

    def _worker(self, index: int) -> None:
        conns: Dict[int, http.client.HTTPConnection] = {}
        sent = 0
        while not self.stop.is_set() and sent < self.args.max_requests_per_thread:
            ports = self._ports()
            if not ports:
                time.sleep(0.05)
                continue
            port = ports[(index + sent) % len(ports)]
            begin = time.time()
            error = self._one(conns, port)
            end = time.time()
            sent += 1
            with self.lock:
                self.started.append(begin)
                self.finished.append(end)
                if error is None:
                    self.ok += 1
                    self.per_port[port] = self.per_port.get(port, 0) + 1
                else:
                    self.failed += 1
                    if len(self.errors) < 10:
                        self.errors.append(f"port {port}: {error}")
        for conn in conns.values():
            conn.close()

    def _watch(self) -> None:
        """Ends the load when the stop file appears, readiness goes off (--until-unready) or time is up."""
        deadline = time.monotonic() + self.args.max_seconds
        stop_file = pathlib.Path(self.args.stop_file) if self.args.stop_file else None
        while time.monotonic() < deadline:
            if stop_file is not None and stop_file.exists():
                break
            if self.args.until_unready:
                ports = self._ports()
                if ports and not _ready(ports[0], timeout=1.0):
                    break
            time.sleep(0.05)
        self.stop.set()

    def run(self) -> Dict[str, Any]:
        workers = [threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(self.args.threads)]
        for worker in workers:
            worker.start()
        watcher = threading.Thread(target=self._watch, daemon=True)
        watcher.start()
        if self.args.started_file:
            pathlib.Path(self.args.started_file).write_text("started\n")
        watcher.join()
        for worker in workers:
            worker.join(self.args.request_timeout + 5)
        summary: Dict[str, Any] = {
            "ok": self.ok,
            "failed": self.failed,
            "per_port": self.per_port,
            "errors": self.errors,
        }
        if self.args.signal_file and pathlib.Path(self.args.signal_file).exists():
            signal_at = float(pathlib.Path(self.args.signal_file).read_text().split()[0])
            pairs = list(zip(self.started, self.finished))
            summary["in_flight_at_signal"] = sum(1 for begin, end in pairs if begin <= signal_at < end)
            summary["completed_after_signal"] = sum(1 for _, end in pairs if end >= signal_at)
        return summary


def load(args: argparse.Namespace) -> int:
    summary = _Load(args).run()
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(summary) + "\n")
    else:
        print(json.dumps(summary))
    if summary["ok"] == 0:
        print("load: no request succeeded", file=sys.stderr)
        return 1
    return 1 if summary["failed"] else 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    wait = sub.add_parser("wait-ready")
    wait.add_argument("port", type=int)
    wait.add_argument("--timeout", type=float, default=180.0)
    probe = sub.add_parser("probes")
    probe.add_argument("port", type=int)
    check = sub.add_parser("smoke")
    check.add_argument("--http", type=int, required=True)
    check.add_argument("--grpc", type=int, required=True)
    traffic = sub.add_parser("load")
    traffic.add_argument("--endpoints", required=True, help="file with the HTTP ports to spread requests over")
    traffic.add_argument("--threads", type=int, default=8)
    traffic.add_argument("--max-seconds", type=float, default=90.0)
    traffic.add_argument("--max-requests-per-thread", type=int, default=20000)
    traffic.add_argument("--request-timeout", type=float, default=30.0)
    traffic.add_argument("--stop-file", help="the load ends when this file appears")
    traffic.add_argument("--started-file", help="written once the threads run")
    traffic.add_argument("--signal-file", help="holds the time.time() at which SIGTERM was sent")
    traffic.add_argument("--until-unready", action="store_true", help="end once the first endpoint is no longer ready")
    traffic.add_argument("--out", help="also write the JSON summary here")
    args = parser.parse_args(argv)
    if args.command == "wait-ready":
        return wait_ready(args.port, args.timeout)
    if args.command == "probes":
        return probes(args.port)
    if args.command == "smoke":
        return smoke(args.http, args.grpc)
    return load(args)


if __name__ == "__main__":
    sys.exit(main())
