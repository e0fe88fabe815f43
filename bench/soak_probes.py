"""Fault probes of ``python -m bench.soak``: each does one bad thing to a running server and checks the aftermath.

A probe returns ``{"passed": bool, "detail": str, ...}``. "Recovered" always means: an
identity request answers bit-exact again, within ``RECOVERY_S``. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from bench.soak_client import ACCESS_HEADER, HttpClient, Processes
from bench.soak_server import RAISES

RECOVERY_S = 45.0
Probe = Dict[str, Any]


class Target:
    """The served process under test, as the probes see it."""

    def __init__(self, info: Dict[str, Any], models: List[str]):
        self.info = info
        self.models = models
        self.http = HttpClient(info["http_port"], timeout_s=30.0)
        self.token: Optional[str] = info.get("access_token")

    def processes(self) -> Processes:
        return Processes.find(self.info["pid"], self.models)

    def identity_ok(self) -> bool:
        """One bit-exact identity request; False on any failure."""
        sent = np.random.default_rng().standard_normal(16).astype(np.float32)[None, :]
        try:
            answer = self.http.infer("identity_f32", {"INPUT": sent})
        except OSError:
            return False
        received = answer.outputs.get("OUTPUT")
        return answer.status == 200 and received is not None and received.tobytes() == sent.tobytes()

    def wait_recovered(self, timeout_s: float = RECOVERY_S) -> Optional[float]:
        """Seconds until :meth:`identity_ok` holds (polled), or None if it never did."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.identity_ok():
                return time.monotonic() - started
            time.sleep(0.1)
        return None


def dump_server_threads(target: Target) -> None:
    """Ask the serving process to write every thread's stack into its log (see bench/soak_server.py)."""
    try:
        os.kill(target.info["pid"], signal.SIGUSR1)
    except ProcessLookupError:
        return
    time.sleep(0.5)  # faulthandler writes from a signal handler: give it a moment before the log is read


def _recovery(target: Target, what: str, extra: Optional[Dict[str, Any]] = None) -> Probe:
    seconds = target.wait_recovered()
    if seconds is None:
        dump_server_threads(target)
    result: Probe = dict(extra or {})
    result["passed"] = seconds is not None
    result["recovered_after_s"] = None if seconds is None else round(seconds, 2)
    result["detail"] = (
        f"{what}; identity bit-exact again after {seconds:.2f} s"
        if seconds is not None
        else f"{what}; identity still failing after {RECOVERY_S:.0f} s"
    )
    return result


def probe_base_exceptions(target: Target) -> Probe:
    """Each BaseException kind fails its own request only; the next request on the same model works."""
    problems = []
    for code, label in RAISES.items():
        try:
            failed = target.http.infer("raises", {"CODE": np.array([[code]], dtype=np.int32)})
            after = target.http.infer("raises", {"CODE": np.array([[0]], dtype=np.int32)})
        except OSError as exc:
            problems.append(f"{label}: {exc}")
            continue
        if failed.status == 200:
            problems.append(f"{label}: answered 200 instead of an error")
        elif label not in ("bad __str__",) and label.split()[0] not in failed.error:
            problems.append(f"{label}: error does not name the exception: {failed.error!r}")
        if after.status != 200 or int(after.outputs["OUTPUT"].flat[0]) != 0:
            problems.append(f"{label}: the next request failed ({after.status}: {after.error!r})")
    return {
        "passed": not problems,
        "detail": "; ".join(problems) or f"{len(RAISES)} kinds, each an error for its request only",
    }


_MALFORMED = [
    ("not JSON", b"{not json", {}),
    ("wrong datatype", json.dumps({"inputs": [{"name": "INPUT", "shape": [1, 2], "datatype": "INT8", "data": [1, 2]}]}).encode(), {}),
    ("shape and data disagree", json.dumps({"inputs": [{"name": "INPUT", "shape": [1, 5], "datatype": "FP32", "data": [1.0]}]}).encode(), {}),
    ("unknown input", json.dumps({"inputs": [{"name": "NOPE", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}).encode(), {}),
    ("negative dimension", json.dumps({"inputs": [{"name": "INPUT", "shape": [1, -4], "datatype": "FP32", "data": [1.0]}]}).encode(), {}),
    ("binary size beyond the body", json.dumps({"inputs": [{"name": "INPUT", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 1 << 30}}]}).encode(), {"Inference-Header-Content-Length": "-1"}),
    ("no inputs", b'{"inputs": []}', {}),
    ("string for a number", json.dumps({"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": ["x"]}]}).encode(), {}),
]  # fmt: skip


def probe_malformed(target: Target) -> Probe:
    """Malformed inference requests each get an HTTP error; the server stays correct."""
    problems = []
    for label, body, headers in _MALFORMED:
        if "Inference-Header-Content-Length" in headers:
            headers = {"Inference-Header-Content-Length": str(len(body))}
        try:
            status, _, _ = target.http.request("POST", "/v2/models/identity_f32/infer", body, headers)
        except OSError as exc:
            problems.append(f"{label}: no answer ({exc})")
            continue
        if status < 400:
            problems.append(f"{label}: answered {status}")
    for label, path in (
        ("unknown model", "/v2/models/nope/infer"),
        ("unknown version", "/v2/models/identity_f32/versions/9/infer"),
    ):
        try:
            status, _, _ = target.http.request("POST", path, b'{"inputs": []}')
        except OSError as exc:
            problems.append(f"{label}: no answer ({exc})")
            continue
        if status < 400:
            problems.append(f"{label}: answered {status}")
    if not target.identity_ok():
        problems.append("identity request failed afterwards")
    count = len(_MALFORMED) + 2
    return {
        "passed": not problems,
        "detail": "; ".join(problems) or f"{count} malformed requests, each refused; server correct",
    }


def _hostile(target: Target, body: bytes, what: str) -> Probe:
    before = target.processes().server
    try:
        status, _, _ = target.http.request("POST", "/v2/models/identity_f32/infer", body)
        answer = f"answered {status}"
    except OSError:
        answer = "connection dropped"
    result = _recovery(target, f"{what}: {answer}")
    after = target.processes().server
    result["server_restarted"] = before != after
    return result


def probe_huge_shape(target: Target) -> Probe:
    """A ~100-byte JSON request declaring shape [1, 2**33] (aborts tritonserver 2.51 with bad_alloc)."""
    body = json.dumps({"inputs": [{"name": "INPUT", "shape": [1, 2**33], "datatype": "FP32", "data": [1.0]}]}).encode()
    return _hostile(target, body, "shape [1, 2**33]")


def probe_deep_json(target: Target) -> Probe:
    """200,000 bytes of ``[`` (overflows the server's JSON parser)."""
    return _hostile(target, b"[" * 200_000, "200,000 '['")


def probe_oversized(target: Target, limit_bytes: Optional[int]) -> Probe:
    """A request above the configured maximum request size gets a clean error, and the server stays correct."""
    if limit_bytes is None:
        return {"passed": False, "detail": "the server reported no maximum request size"}
    size = limit_bytes + 4096
    try:
        answer = target.http.infer("identity_u8", {"INPUT": np.zeros((1, size), dtype=np.uint8)})
        outcome = f"answered {answer.status}: {answer.error[:160]!r}"
        clean = answer.status >= 400 and bool(answer.error)
    except OSError as exc:
        outcome, clean = f"no answer ({exc})", False
    recovered = target.identity_ok()
    return {"passed": clean and recovered, "detail": f"{size} bytes: {outcome}; server correct afterwards: {recovered}"}


def probe_tokens(target: Target) -> Probe:
    """Management endpoints refuse a caller without the access token and serve one with it."""
    if not target.token:
        return {"passed": False, "detail": "the server reported no access token (management endpoints are open)"}
    problems = []
    checks = [
        ("POST", "/v2/repository/index", b"{}"),
        ("GET", "/v2/models/stats", b""),
        ("POST", "/v2/repository/models/identity_f32/load", json.dumps({"parameters": {"file:1/model.py": "cHJpbnQoMSk="}}).encode()),
        ("GET", "/v2/logging", b""),
        ("GET", "/v2/trace/setting", b""),
        ("GET", "/v2/systemsharedmemory/status", b""),
    ]  # fmt: skip
    for method, path, body in checks:
        for header, wanted in (({}, "refused"), ({ACCESS_HEADER: "wrong-token"}, "refused")):
            status, _, _ = target.http.request(method, path, body, header)
            if status < 400:
                problems.append(f"{method} {path} with {header or 'no token'}: {status}, expected {wanted}")
    for method, path in (("POST", "/v2/repository/index"), ("GET", "/v2/models/stats")):
        status, _, _ = target.http.request(
            method, path, b"{}" if method == "POST" else b"", {ACCESS_HEADER: target.token}
        )
        if status != 200:
            problems.append(f"{method} {path} with the token: {status}")
    if not target.identity_ok():
        problems.append("inference without a token failed")
    return {
        "passed": not problems,
        "detail": "; ".join(problems)
        or "6 management endpoints refused without the token; served with it; inference open",
    }


def _kill_and_recover(target: Target, pick: Callable[[Processes], Optional[int]], what: str) -> Probe:
    victim = pick(target.processes())
    if victim is None:
        return {"passed": False, "detail": f"no {what} process found"}
    os.kill(victim, signal.SIGKILL)
    return _recovery(target, f"SIGKILL of the {what} (pid {victim})", {"victim_pid": victim})


def probe_stub_killed(target: Target) -> Probe:
    def pick(processes: Processes) -> Optional[int]:
        return next((pid for pid, model in processes.stubs.items() if model == "identity_f32"), None)

    result = _kill_and_recover(target, pick, "identity_f32 stub")
    stubs = target.processes().stubs
    result["stubs_after"] = sorted(stubs.values())
    return result


def probe_server_killed(target: Target) -> Probe:
    result = _kill_and_recover(target, lambda processes: processes.server, "tritonserver")
    # every model, not only the one the recovery check used
    if result["passed"]:
        answer = target.http.infer("raises", {"CODE": np.array([[0]], dtype=np.int32)})
        result["passed"] = answer.status == 200
        result["detail"] += f"; the other models answer: {answer.status == 200}"
    return result
