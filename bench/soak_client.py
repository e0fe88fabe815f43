"""What the soak needs to talk to and look at a server: a bit-exact HTTP client and process sampling.

Everything here targets 127.0.0.1 only, and every call has a timeout.
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

_DTYPES: Dict[str, np.dtype] = {"FP32": np.dtype(np.float32), "UINT8": np.dtype(np.uint8), "INT32": np.dtype(np.int32)}
_DATATYPES = {dtype: name for name, dtype in _DTYPES.items()}
ACCESS_HEADER = "triton-access-token"


class Answer:
    """One HTTP answer: its status and, for a successful inference, the output arrays."""

    def __init__(self, status: int, outputs: Dict[str, np.ndarray], error: str):
        self.status = status
        self.outputs = outputs
        self.error = error


class HttpClient:
    """A keep-alive HTTP/1.1 client for binary-tensor inference; reconnects after a dropped connection."""

    def __init__(self, port: int, timeout_s: float = 60.0):
        self._port = port
        self._timeout_s = timeout_s
        self._connection: Optional[http.client.HTTPConnection] = None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def request(
        self, method: str, path: str, body: bytes = b"", headers: Optional[Dict[str, str]] = None
    ) -> Tuple[int, Dict[str, str], bytes]:
        """Send one request; a transport failure closes the connection and raises ``OSError``."""
        if self._connection is None:
            self._connection = http.client.HTTPConnection("127.0.0.1", self._port, timeout=self._timeout_s)
        try:
            self._connection.request(method, path, body=body, headers=headers or {})
            response = self._connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise OSError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        return response.status, {key.lower(): value for key, value in response.getheaders()}, data

    def infer(self, model: str, inputs: Dict[str, np.ndarray]) -> Answer:
        """Inference with binary inputs and outputs."""
        header: Dict[str, Any] = {
            "inputs": [
                {
                    "name": name,
                    "shape": list(array.shape),
                    "datatype": _DATATYPES[array.dtype],
                    "parameters": {"binary_data_size": array.nbytes},
                }
                for name, array in inputs.items()
            ],
            "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}],
        }
        encoded = json.dumps(header).encode()
        body = encoded + b"".join(np.ascontiguousarray(array).tobytes() for array in inputs.values())
        headers = {"Inference-Header-Content-Length": str(len(encoded)), "Content-Type": "application/octet-stream"}
        status, response_headers, data = self.request("POST", f"/v2/models/{model}/infer", body, headers)
        if status != 200:
            return Answer(status, {}, _error_text(data))
        return Answer(status, _decode_outputs(response_headers, data), "")


def _error_text(data: bytes) -> str:
    try:
        return str(json.loads(data).get("error", data[:300]))
    except (ValueError, AttributeError):
        return data[:300].decode(errors="replace")


def _decode_outputs(headers: Dict[str, str], data: bytes) -> Dict[str, np.ndarray]:
    length = int(headers.get("inference-header-content-length", len(data)))
    meta = json.loads(data[:length])
    offset = length
    outputs = {}
    for output in meta.get("outputs", []):
        dtype = _DTYPES[output["datatype"]]
        size = output.get("parameters", {}).get("binary_data_size")
        if size is None:  # a JSON answer (not requested, but decode it anyway)
            outputs[output["name"]] = np.asarray(output["data"], dtype=dtype).reshape(output["shape"])
            continue
        raw = data[offset : offset + size]
        offset += size
        outputs[output["name"]] = np.frombuffer(raw, dtype=dtype).reshape(output["shape"])
    return outputs


# -- process sampling ----------------------------------------------------------------------------


def _status_kib(pid: int, key: str) -> int:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _children(pid: int) -> List[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # the command may contain spaces or parentheses: the fields start after the last ")"
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _cmdline(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


@dataclass
class Processes:
    """The processes of one served ``Triton``: the user's process, ``tritonserver`` and its stubs."""

    user: int
    server: Optional[int] = None
    stubs: Dict[int, str] = field(default_factory=dict)  # pid -> model name

    @classmethod
    def find(cls, user_pid: int, models: List[str]) -> Processes:
        found = cls(user=user_pid)
        for child in _children(user_pid):
            if "tritonserver" in _cmdline(child):
                found.server = child
        if found.server is not None:
            for stub in _children(found.server):
                line = _cmdline(stub)
                if "triton_python_backend_stub" not in line:
                    continue  # e.g. the config auto-complete stub is not ours; nothing else runs here
                for model in models:
                    if f"/{model}/" in line:
                        found.stubs[stub] = model
        return found

    def sample(self, shm_prefix: str) -> Dict[str, Any]:
        """RSS (KiB), open fds and the shared-memory use of every process, at this moment."""
        row: Dict[str, Any] = {
            "user_rss_kib": _status_kib(self.user, "VmRSS"),
            "user_fds": _fd_count(self.user),
            "server_rss_kib": _status_kib(self.server, "VmRSS") if self.server else 0,
            "server_fds": _fd_count(self.server) if self.server else 0,
            "stubs_rss_kib": sum(_status_kib(pid, "VmRSS") for pid in self.stubs),
            "stubs": len([pid for pid in self.stubs if _status_kib(pid, "VmRSS")]),
        }
        row.update(shm_usage(shm_prefix))
        return row


def shm_usage(prefix: str) -> Dict[str, int]:
    """Count and bytes in use (allocated blocks, not apparent size) of ``/dev/shm`` entries with ``prefix``."""
    count = used = 0
    for name in os.listdir("/dev/shm"):
        if not name.startswith(prefix):
            continue
        try:
            info = os.stat(os.path.join("/dev/shm", name))
        except OSError:
            continue
        count += 1
        used += info.st_blocks * 512
    return {"shm_segments": count, "shm_kib": used // 1024}
