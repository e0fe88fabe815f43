"""Triton's KServe v2 HTTP inference on the frontend's own event loop: a keep-alive connection pool.

Why: over gRPC, each reply of tritonclient's asyncio client reaches the event loop from gRPC's own
threads, and on a busy host that wake-up cost more than the frontend's whole Python
(bench/history.md). Here the request is written and its answer read by asyncio streams on the
loop itself: no thread hand-off at all. Only non-streaming inference goes this way; decoupled
models keep gRPC streams (docs/openai.md).

Wire format: the binary tensor extension both ways. The request is a JSON header (its length in
``Inference-Header-Content-Length``) followed by each input's raw bytes (BYTES tensors as 4-byte
little-endian lengths and contents); ``binary_data_output`` asks Triton to send every output the
same way.

Connections: at most ``max_idle`` idle connections are kept for reuse; a request opens a new one
when none is idle. A connection is closed, not reused, after any error or cancellation during its
request (its state is unknown then), and when Triton says ``Connection: close``. A request whose
reused connection turns out to be closed by Triton before any answer arrived (an idle timeout) is
sent once more on a new connection: Triton never saw it. :meth:`TritonHttp.close` closes the idle ones.

Unit test: tests/unit/test_openai_http.py (against a fake HTTP server on a socket).
"""

from __future__ import annotations

import asyncio
import json
import struct
import urllib.parse
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import numpy.typing as npt

Outputs = Dict[str, np.ndarray]  # type: ignore[type-arg]

_HEADER_LENGTH = "inference-header-content-length"
# Triton's HTTP status for each of its error kinds, as gRPC status names (the backend maps those).
_STATUS_NAMES = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 503: "UNAVAILABLE", 429: "RESOURCE_EXHAUSTED"}
# One encoder for every request header: json.dumps with options builds a new encoder on each call.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


class TritonHttpError(Exception):
    """Triton answered with an error: ``status`` is its gRPC-style name, ``message`` Triton's text."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Stale(Exception):
    """A reused connection was closed before any answer arrived: the request may be sent again."""


# Why not tritonclient.utils' (de)serialize_byte_tensor: they walk numpy object arrays generically and
# cost several times these loops for the one short text a chat request carries (bench/history.md).
_LENGTH = struct.Struct("<I")


def _triton_dtype(array: np.ndarray) -> str:  # type: ignore[type-arg]
    if array.dtype == np.object_ or array.dtype.kind == "S":
        return "BYTES"
    name = _dtypes().np_to_triton_dtype(array.dtype)
    if name is None:
        raise TritonHttpError("INVALID_ARGUMENT", f"No Triton data type for numpy {array.dtype}.")
    return str(name)


def _dtypes() -> Any:
    import tritonclient.utils

    return tritonclient.utils


def _serialize_bytes(array: np.ndarray) -> bytes:  # type: ignore[type-arg]
    """A BYTES tensor as Triton's wire format: each element's 4-byte little-endian length, then its bytes."""
    chunks: List[bytes] = []
    for item in array.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        chunks.append(_LENGTH.pack(len(data)))
        chunks.append(data)
    return b"".join(chunks)


def _deserialize_bytes(raw: bytes) -> np.ndarray:  # type: ignore[type-arg]
    """The elements of a BYTES tensor in Triton's wire format, as a flat object array."""
    items: List[bytes] = []
    offset, end = 0, len(raw)
    while offset < end:
        (size,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + size > end:
            raise TritonHttpError("INTERNAL", "Triton's answer holds a truncated BYTES tensor.")
        items.append(raw[offset : offset + size])
        offset += size
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array


def encode_request(inputs: Dict[str, np.ndarray], parameters: Optional[Mapping[str, object]]) -> Tuple[bytes, int]:  # type: ignore[type-arg]
    """The body of an inference request and the length of its JSON header (binary tensor extension)."""
    tensors: List[Dict[str, object]] = []
    chunks: List[bytes] = []
    for name, value in inputs.items():
        datatype = _triton_dtype(value)
        data = _serialize_bytes(value) if datatype == "BYTES" else np.ascontiguousarray(value).tobytes()
        tensors.append({"name": name, "shape": list(value.shape), "datatype": datatype,
                        "parameters": {"binary_data_size": len(data)}})  # fmt: skip
        chunks.append(data)
    header = {"inputs": tensors, "parameters": {**(parameters or {}), "binary_data_output": True}}
    encoded = _COMPACT.encode(header).encode()
    return b"".join([encoded, *chunks]), len(encoded)


def decode_response(body: bytes, header_length: Optional[int]) -> Outputs:
    """The outputs of an inference answer (binary data where the output says so, else its JSON data)."""
    header = json.loads(body[:header_length] if header_length is not None else body)
    offset = header_length if header_length is not None else len(body)
    outputs: Outputs = {}
    for output in header.get("outputs", []):
        shape, datatype = output["shape"], output["datatype"]
        size = (output.get("parameters") or {}).get("binary_data_size")
        if size is None:  # JSON data (Triton sends it so only when asked; kept for completeness)
            dtype = np.object_ if datatype == "BYTES" else _dtypes().triton_to_np_dtype(datatype)
            data = [item.encode() if isinstance(item, str) else item for item in output.get("data", [])]
            outputs[output["name"]] = np.array(data, dtype=dtype).reshape(shape)
            continue
        raw = body[offset : offset + size]
        offset += size
        if datatype == "BYTES":
            array = _deserialize_bytes(raw)
        else:
            array = np.frombuffer(raw, dtype=_dtypes().triton_to_np_dtype(datatype)).copy()
        outputs[output["name"]] = array.reshape(shape)
    return outputs


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", body.decode(errors="replace")))
    except (ValueError, AttributeError):
        return body.decode(errors="replace")


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class TritonHttp:
    """A keep-alive HTTP/1.1 client for Triton's inference route at ``host:port``; one event loop only."""

    def __init__(self, host: str, port: int, headers: Optional[Dict[str, str]] = None, max_idle: int = 16) -> None:
        self._host = host
        self._port = port
        self._extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        self._idle: List[_Connection] = []
        self._max_idle = max_idle

    async def _open(self) -> _Connection:
        reader, writer = await asyncio.open_connection(self._host, self._port)
        return _Connection(reader, writer)

    async def infer(
        self,
        model: str,
        version: Optional[int],
        inputs: Dict[str, npt.NDArray[np.generic]],
        parameters: Optional[Mapping[str, object]],
    ) -> Outputs:
        """One inference request; raises :class:`TritonHttpError` for Triton's errors, ``OSError`` when unreachable."""
        body, header_length = encode_request(inputs, parameters)
        path = (
            f"/v2/models/{urllib.parse.quote(model, safe='')}"
            + (f"/versions/{version}" if version is not None else "")
            + "/infer"
        )
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {header_length}\r\nContent-Length: {len(body)}\r\n{self._extra}\r\n"
        ).encode()
        while self._idle:
            connection = self._idle.pop()
            try:
                return await self._exchange(connection, head + body)
            except _Stale:
                continue
        return await self._exchange(await self._open(), head + body, fresh=True)

    async def _exchange(self, connection: _Connection, request: bytes, fresh: bool = False) -> Outputs:
        keep = False
        try:
            connection.writer.write(request)
            try:  # the status line and the headers at once: one read, not one per line
                head = (await connection.reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    raise ConnectionError("Triton closed the HTTP connection in the middle of its answer.") from None
                if fresh:
                    raise ConnectionError("Triton closed the HTTP connection without answering.") from None
                raise _Stale() from None
            status_line, *lines = head.split("\r\n")
            status = int(status_line.split(" ", 2)[1])
            headers: Dict[str, str] = {}
            for line in lines:
                name, _, value = line.partition(":")
                if value:
                    headers[name.strip().lower()] = value.strip()
            if "content-length" not in headers:
                raise ConnectionError(f"Triton's HTTP answer has no Content-Length: {status_line!r}.")
            payload = await connection.reader.readexactly(int(headers["content-length"]))
            keep = headers.get("connection", "").lower() != "close"
        finally:
            if keep and len(self._idle) < self._max_idle:
                self._idle.append(connection)
            else:
                connection.close()
        if status != 200:
            raise TritonHttpError(_STATUS_NAMES.get(status, "INTERNAL"), _error_message(payload))
        length = headers.get(_HEADER_LENGTH)
        return decode_response(payload, int(length) if length is not None else None)

    async def close(self) -> None:
        """Close the idle connections (a request still in flight closes its own when it ends)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
            try:
                await connection.writer.wait_closed()
            except (OSError, asyncio.CancelledError):
                pass
