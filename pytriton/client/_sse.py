"""HTTP streaming for decoupled models: Triton's ``generate_stream`` endpoint (server-sent events).

Request: ``POST /v2/models/<name>[/versions/<v>]/generate_stream`` with a JSON object mapping each
input name to its values (flattened; Triton shapes them to the model's input) plus optional
``parameters``. Reply: ``text/event-stream``; each ``data:`` event is a JSON object with the outputs
(flattened, a single element as a scalar) or ``{"error": message}``. The stream ends when the server
closes it. The pure helpers here (encoding, event parsing, decoding) hold no I/O; :class:`HttpStream`
does the socket work for :class:`~pytriton.client._decoupled.DecoupledModelClient`.

Unit test: tests/unit/test_client_sse.py.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

import numpy as np
import numpy.typing as npt
from tritonclient.utils import InferenceServerException

from pytriton.client._core import map_error
from pytriton.client._url import TritonUrl
from pytriton.client.exceptions import PyTritonClientError, PyTritonClientInferenceServerError
from pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig


def _plain(array: npt.NDArray[np.generic]) -> object:
    flat = array.reshape(-1)
    if flat.dtype.kind in "SO":
        return [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in flat]
    return flat.tolist()


def encode_request(arrays: Dict[str, npt.NDArray[np.generic]], parameters: Optional[Mapping[str, object]]) -> bytes:
    """The JSON body of a ``generate_stream`` request."""
    body: Dict[str, object] = {name: _plain(array) for name, array in arrays.items()}
    if parameters:
        body["parameters"] = parameters
    return json.dumps(body).encode("utf-8")


def iter_events(lines: Iterable[bytes]) -> Iterator[Dict[str, Any]]:
    """Parse server-sent events: the JSON of each event's ``data:`` lines (other fields ignored)."""
    data: List[Any] = []
    for raw in lines:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield json.loads("\n".join(data))
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    if data:
        yield json.loads("\n".join(data))


def _shape(spec: TensorSpec, size: int, batch_axis: bool) -> Optional[Tuple[int, ...]]:
    dims = ((1,) if batch_axis else ()) + tuple(spec.shape)
    unknown = [i for i, d in enumerate(dims) if d < 0]
    known = int(np.prod([d for d in dims if d >= 0])) if dims else 1
    if len(unknown) == 1 and known and size % known == 0:
        return tuple(size // known if d < 0 else d for d in dims)
    if not unknown and known == size:
        return dims
    return None


def decode_event(
    event: Mapping[str, object], config: TritonModelConfig, keep_batch_axis: bool
) -> Dict[str, npt.NDArray[np.generic]]:
    """Output arrays of one event, shaped by the config (with a batch axis of 1 when ``keep_batch_axis``).

    ``PyTritonClientInferenceServerError`` for an error event.
    """
    if "error" in event:
        raise PyTritonClientInferenceServerError(
            f"Streaming inference on model {config.model_name!r} failed: {event['error']}"
        )
    outputs = {}
    for spec in config.outputs:
        if spec.name not in event:
            continue
        value = event[spec.name]
        values = value if isinstance(value, list) else [value]
        if np.dtype(spec.dtype).kind in "SOU":
            array = np.array([v.encode("utf-8") if isinstance(v, str) else v for v in values], dtype=object)
        else:
            array = np.array(values, dtype=spec.dtype)
        shape = _shape(spec, array.size, keep_batch_axis and config.batching)
        outputs[spec.name] = array.reshape(shape) if shape is not None else array
    return outputs


class HttpStream:
    """One ``generate_stream`` request. Connecting is bounded by ``connect_timeout_s``; reading is not
    (a model may take as long as it likes between responses). :meth:`abort` ends it from any thread.
    """

    def __init__(self, url: TritonUrl, path: str, body: bytes, headers: Dict[str, str], connect_timeout_s: float):
        self._aborted: Optional[PyTritonClientError] = None
        self._lock = threading.Lock()
        self._connection = http.client.HTTPConnection(url.host.strip("[]"), url.port, timeout=connect_timeout_s)
        self._path = path
        self._body = body
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **headers}

    def abort(self, error: PyTritonClientError) -> None:
        """Make the reading thread raise ``error``: the socket is shut down under it."""
        with self._lock:
            self._aborted = error
            sock = self._connection.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:  # already closed
                    pass

    def events(self) -> Iterator[Dict[str, Any]]:
        """The stream's events (JSON objects) until the server ends it; closes the connection after."""
        what = "Streaming inference over HTTP"
        try:
            try:
                self._connection.connect()
                assert self._connection.sock is not None
                self._connection.sock.settimeout(None)
                self._connection.request("POST", self._path, self._body, self._headers)
                response = self._connection.getresponse()
                if response.status != 200:
                    text = response.read().decode("utf-8", "replace")
                    try:
                        text = json.loads(text).get("error", text)
                    except ValueError:
                        pass
                    raise map_error(InferenceServerException(text, status=str(response.status)), what)
                yield from iter_events(iter(response.readline, b""))
            except (OSError, http.client.HTTPException) as exc:
                raise map_error(exc, what) from None
        except PyTritonClientError:
            if self._aborted is not None:
                raise self._aborted from None
            raise
        finally:
            self._connection.close()
        if self._aborted is not None:
            raise self._aborted
