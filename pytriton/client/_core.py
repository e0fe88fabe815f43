"""The protocol- and I/O-independent core shared by every client.

Each client operation is written once, as a generator that *yields* the network calls it needs
(:class:`Call`) and receives their results; a driver runs it. :func:`run_sync` drives it with the
blocking ``tritonclient`` clients, :func:`run_async` with the asyncio ones (see ``_drivers``). The
sync, futures and asyncio clients therefore share request building, readiness checks, batch-axis
handling, response decoding and error mapping instead of copying them.

Unit test: tests/unit/test_client_core.py (every operation through both drivers, on a fake server).
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import enum
import logging
import re
import socket
import time
from typing import Any, Dict, Generator, List, Mapping, Optional, Protocol, Sequence, Tuple

import numpy as np
import numpy.typing as npt
from tritonclient.utils import np_to_triton_dtype

from pytriton.client._url import TritonUrl
from pytriton.client.auth import grpc_metadata
from pytriton.client.exceptions import (
    PyTritonClientError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientModelUnavailableError,
    PyTritonClientPermissionError,
    PyTritonClientRuntimeError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.exceptions import PyTritonError
from pytriton.model_config.generator import from_dict
from pytriton.model_config.triton_model_config import TritonModelConfig

DEFAULT_INIT_TIMEOUT_S = 300.0
DEFAULT_INFERENCE_TIMEOUT_S = 60.0
DEFAULT_NETWORK_TIMEOUT_S = 60.0
DEFAULT_SERVER_READY_TIMEOUT_S = 60.0
LATEST_MODEL_VERSION = "<latest>"

# Transport status codes (gRPC ``StatusCode`` names, HTTP status numbers) and their meaning.
_TIMEOUT_STATUSES = frozenset({"StatusCode.DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED", "408", "504"})
_UNAVAILABLE_STATUSES = frozenset({"StatusCode.UNAVAILABLE", "StatusCode.NOT_FOUND", "UNAVAILABLE", "404", "503"})
# Triton 2.51 refuses a restricted gRPC protocol with UNAVAILABLE, a code retry policies retry; only
# its message (server/security.py sets the restriction) tells it from a server that is really away.
_RESTRICTED_GRPC_MESSAGE = "This protocol is restricted"
_PARAMETER_TYPES = (str, int, float, bool)
_HEADER_TYPES = (str, int, bool)
_NOT_FOUND_STATUSES = frozenset({"StatusCode.NOT_FOUND", "NOT_FOUND", "404"})
_KNOWN_SHOWN = 20  # model names listed in the "no such model" error
# A wait that has been refused this long says so once (the wait itself goes on: NVIDIA PyTriton's
# clients wait for a server that is still starting, and so do these).
_SILENT_WAIT_S = 2.0

LOGGER = logging.getLogger("pytriton.client")
_UNKNOWN_ID_PREFIX = re.compile(r"\[request id: <id_unknown>\] ?")


class ModelState(enum.Enum):
    """A model version's state in the server's repository index."""

    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"
    READY = "READY"


@dataclasses.dataclass
class Call:
    """One network call an operation needs: ``method`` of the control or the inference client.

    ``method == "sleep"`` asks the driver to wait ``args[0]`` seconds.
    """

    method: str
    args: Tuple[Any, ...] = ()
    kwargs: Mapping[str, object] = dataclasses.field(default_factory=dict)
    infer: bool = False  # True: use the inference client and apply the inference timeout
    timeout_s: Optional[float] = None  # bound for drivers that time calls themselves (asyncio)


Operation = Generator[Call, Any, Any]


class InferResult(Protocol):
    """What :meth:`ClientCore.decode` reads of a tritonclient ``InferResult`` (HTTP or gRPC)."""

    def as_numpy(self, name: str) -> Optional[npt.NDArray[np.generic]]: ...


def _status(exc: BaseException) -> Optional[str]:
    """The transport status of ``exc``: tritonclient's ``status()``, or a gRPC error's ``code()``."""
    status = getattr(exc, "status", None)
    if callable(status):
        try:
            value = status()
        except Exception:  # a foreign exception whose status() needs arguments
            value = None
        if value is not None:
            return str(value)
    code = getattr(exc, "code", None)
    if callable(code):
        try:
            value = code()
        except Exception:
            value = None
        if value is not None:
            return str(value)
    return None


def is_timeout(exc: BaseException) -> bool:
    """True when ``exc`` is a transport timeout: by type (socket, asyncio, gevent) or by status (deadline)."""
    if isinstance(exc, (TimeoutError, socket.timeout, asyncio.TimeoutError)):
        return True
    kind = type(exc)
    if kind.__module__.split(".")[0] == "gevent" and kind.__name__ == "Timeout":
        return True
    return _status(exc) in _TIMEOUT_STATUSES


def _message(exc: BaseException) -> str:
    """The server's words in ``exc``, without Triton's ``[request id: <id_unknown>] `` prefix.

    Triton puts that prefix before the error of a request sent without an id: it names nothing the
    caller can use, so it is left out of the errors pytriton raises (a real id is kept).
    """
    text = exc.message() if hasattr(exc, "message") and callable(exc.message) else None
    if not text:
        details = getattr(exc, "details", None)  # a raw grpc.RpcError
        text = details() if callable(details) else None
    return _UNKNOWN_ID_PREFIX.sub("", str(text or exc))


def is_permission_denied(exc: BaseException) -> bool:
    """True when the server refused the call for want of a valid access token (never worth retrying).

    HTTP answers 403; Triton 2.51's gRPC endpoint answers ``UNAVAILABLE`` with "This protocol is
    restricted, expecting header ..." (``PERMISSION_DENIED`` is accepted too, should a later Triton use it).
    """
    if isinstance(exc, PyTritonClientPermissionError):
        return True
    status = _status(exc)
    if status in ("403", "StatusCode.PERMISSION_DENIED", "PERMISSION_DENIED"):
        return True
    return status in _UNAVAILABLE_STATUSES and _RESTRICTED_GRPC_MESSAGE in _message(exc)


def map_error(exc: BaseException, what: str) -> PyTritonClientError:
    """Translate a tritonclient/transport exception into the matching pytriton client error.

    Decided by exception type and transport status code (and, for Triton's gRPC refusal of a
    restricted endpoint, which comes as ``UNAVAILABLE``, by its message): a refused restricted call
    becomes ``PyTritonClientPermissionError``; timeouts ``PyTritonClientTimeoutError``; an
    unreachable server, an unknown model or an unavailable one (gRPC ``UNAVAILABLE``/``NOT_FOUND``,
    HTTP 404/503, refused connections) ``PyTritonClientModelUnavailableError``; anything else
    ``PyTritonClientInferenceServerError``.
    """
    if isinstance(exc, PyTritonClientError):
        return exc
    message = _message(exc)
    if is_permission_denied(exc):
        return PyTritonClientPermissionError(
            f"{what} was refused: the server restricts this endpoint and the call carried no valid access "
            f"token ({message}). Pass access_token= to the client (Triton.get_access_token() on the serving side)."
        )
    if is_timeout(exc):
        return PyTritonClientTimeoutError(f"{what} timed out: {message}")
    if isinstance(exc, ConnectionError) or _status(exc) in _UNAVAILABLE_STATUSES:
        return PyTritonClientModelUnavailableError(f"{what} failed: {message}")
    return PyTritonClientInferenceServerError(f"{what} failed: {message}")


def check_parameters(values: object, what: str) -> None:
    """``PyTritonClientValueError`` unless ``values`` is None or a dict of str to a carried scalar type.

    Request parameters may be ``str``, ``int``, ``float`` or ``bool``; headers ``str``, ``int`` or
    ``bool`` (sent as text).
    """
    if values is None:
        return
    allowed = _PARAMETER_TYPES if what == "parameters" else _HEADER_TYPES
    names = ", ".join(t.__name__ for t in allowed)
    if not isinstance(values, dict):
        raise PyTritonClientValueError(f"Request {what} must be a dict, got {type(values).__name__}.")
    for key, value in values.items():
        if not isinstance(key, str):
            raise PyTritonClientValueError(f"Request {what}: key {key!r} is not a string.")
        if not isinstance(value, allowed):
            raise PyTritonClientValueError(
                f"Request {what}: value of {key!r} has type {type(value).__name__}; allowed types are {names}."
            )


def control_call(method: str, grpc: bool, remaining_s: float, *args: object, **kwargs: object) -> Call:
    """A control-plane call bounded by ``remaining_s`` (gRPC per call, asyncio drivers by ``timeout_s``)."""
    bound = max(0.05, remaining_s)
    if grpc:
        kwargs["client_timeout"] = bound
    return Call(method, args, kwargs, timeout_s=bound)


def wait_for_server(timeout_s: float, grpc: bool, what: str = "the server") -> Operation:
    """Poll until the server reports ready; ``PyTritonClientTimeoutError`` after ``timeout_s``.

    A server that is still starting is waited for in silence; once the polls have failed for
    ``_SILENT_WAIT_S`` (a wrong port, a stopped server), one warning says what is refused and where,
    and how long the wait goes on.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    delay = 0.02
    last_error: Optional[BaseException] = None
    warned = False
    while True:
        try:
            if (yield control_call("is_server_ready", grpc, deadline - time.monotonic())):
                if warned:
                    LOGGER.warning("%s is ready after %.1f s", what[:1].upper() + what[1:], time.monotonic() - started)
                return None
        except Exception as exc:  # the server may still be starting
            if is_permission_denied(exc):  # a restricted health endpoint: waiting cannot help
                raise map_error(exc, f"Asking whether {what} is ready") from None
            last_error = exc
        if not warned and time.monotonic() - started >= _SILENT_WAIT_S:
            warned = True
            reason = _message(last_error) if last_error is not None else "it answers that it is not ready"
            LOGGER.warning(
                "Waiting for %s: %s. Still trying for up to %.0f s more (the client's init_timeout_s); "
                "check the URL and that the server is running.",
                what,
                reason,
                max(0.0, deadline - time.monotonic()),
            )
        if time.monotonic() + delay > deadline:
            detail = f" ({last_error})" if last_error else ""
            raise PyTritonClientTimeoutError(f"Waited {timeout_s:.1f} s: {what} is not ready{detail}.")
        yield Call("sleep", (delay,))
        delay = min(delay * 2, 0.5)


def unknown_model_message(where: str, model_name: str, known: Optional[Sequence[str]]) -> str:
    """The error for a model name the server does not know: the near matches and the served models.

    ``known`` is None when the repository index could not be read (a pytriton server restricts it
    to holders of the access token): the message then says how to get the list.
    """
    if known is None:
        return (
            f"The server at {where} has no model {model_name!r}; check the model name (the list of its models "
            "needs the server's access token: pass access_token= to the client to see it)."
        )
    near = difflib.get_close_matches(model_name, list(known), n=3, cutoff=0.6)
    near += [name for name in known if name.lower() == model_name.lower() and name not in near]
    suggestion = f" Did you mean {' or '.join(repr(name) for name in near)}?" if near else ""
    shown = [repr(name) for name in known[:_KNOWN_SHOWN]] + (["..."] if len(known) > _KNOWN_SHOWN else [])
    return f"The server at {where} has no model {model_name!r}.{suggestion} Its models: {', '.join(shown) or 'none'}."


def _index_entries(index: Any) -> List[Mapping[str, object]]:
    """The entries of a repository index: HTTP answers a list, gRPC (as JSON) ``{"models": [...]}``."""
    entries = index.get("models", []) if isinstance(index, dict) else index
    return [entry for entry in entries or [] if isinstance(entry, dict)]


def known_models(grpc: bool, timeout_s: float) -> Operation:
    """The model names the server's repository index lists, or None when the index cannot be read.

    The index lists every model the server knows, loaded or not (Triton's explicit model control
    mode lists each folder of the repository). It is a management call: a pytriton server restricts
    it to callers with the access token, and refuses it otherwise (then None).
    """
    kwargs = {"as_json": True} if grpc else {}
    try:
        index = yield control_call("get_model_repository_index", grpc, timeout_s, **kwargs)
    except Exception:  # restricted, or the server going away: no conclusion
        return None
    return sorted({str(entry.get("name")) for entry in _index_entries(index)})


def is_unknown_model(grpc: bool, timeout_s: float, model_name: str) -> Operation:
    """``(unknown, known_names)``: whether the server does not know ``model_name`` at all.

    The repository index decides when this client may read it (``known_names`` is then its list).
    Otherwise the model's metadata does: Triton answers "not found" (HTTP 404, gRPC ``NOT_FOUND``)
    both for a name it does not know ("... 'name' is not found") and for a model it is still loading
    ("... 'name' has no available versions"); only the first is unknown, and the message is the one
    place the two differ. Anything else (metadata returned, another error) counts as known.
    """
    known = yield from known_models(grpc, timeout_s)
    if known is not None:
        return model_name not in known, known
    try:
        yield control_call("get_model_metadata", grpc, timeout_s, model_name)
    except Exception as exc:  # noqa: BLE001 - only the "not found" answer below is a conclusion
        message = exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)
        unknown = _status(exc) in _NOT_FOUND_STATUSES and f"'{model_name}' is not found" in str(message)
        return unknown, None
    return False, None


def wait_for_model(
    timeout_s: float, grpc: bool, model_name: str, model_version: str, where: str, fail_unknown: bool = True
) -> Operation:
    """Poll until the server and the model are ready; ``PyTritonClientTimeoutError`` after ``timeout_s``.

    With ``fail_unknown``, a model the server does not know at all (a misspelt name; see
    :func:`is_unknown_model`) raises ``PyTritonClientModelUnavailableError`` at once; a model it
    knows but has not loaded yet (loading, unloaded, a version still missing) is waited for.
    """
    deadline = time.monotonic() + timeout_s
    yield from wait_for_server(timeout_s, grpc, f"the server at {where}")
    delay = 0.02
    while True:
        try:
            if (yield control_call("is_model_ready", grpc, deadline - time.monotonic(), model_name, model_version)):
                return None
        except Exception as exc:  # a model still loading can make readiness calls fail
            if is_permission_denied(exc):  # a restricted health endpoint: waiting cannot help
                raise map_error(exc, f"Asking whether model {model_name!r} is ready") from None
        unknown, known = (False, None)
        if fail_unknown:
            unknown, known = yield from is_unknown_model(grpc, deadline - time.monotonic(), model_name)
        if unknown:
            raise PyTritonClientModelUnavailableError(unknown_model_message(where, model_name, known))
        if time.monotonic() + delay > deadline:
            version = f" version {model_version}" if model_version else ""
            raise PyTritonClientTimeoutError(
                f"Waited {timeout_s:.1f} s: the server is up but model {model_name!r}{version} is not ready."
            )
        yield Call("sleep", (delay,))
        delay = min(delay * 2, 0.5)


def read_config(timeout_s: float, grpc: bool, model_name: str, model_version: str) -> Operation:
    """The model's config as a typed ``TritonModelConfig`` (one call, no readiness wait).

    A config the client cannot use (e.g. a tensor type numpy has no dtype for) raises
    ``PyTritonClientRuntimeError``: a client error, not the parser's serving-side one.
    """
    kwargs = {"as_json": True} if grpc else {}
    try:
        raw = yield control_call("get_model_config", grpc, timeout_s, model_name, model_version, **kwargs)
    except Exception as exc:
        raise map_error(exc, f"Reading the config of model {model_name!r}") from None
    if grpc:
        raw = raw.get("config", raw)
    try:
        return from_dict(raw)
    except PyTritonError as exc:
        raise PyTritonClientRuntimeError(f"Cannot use the config of model {model_name!r}: {exc.message}") from None


def model_state(grpc: bool, timeout_s: float, model_name: str, model_version: Optional[str]) -> Operation:
    """The state of ``model_name`` (its highest version when ``model_version`` is None) in the repository index."""
    kwargs = {"as_json": True} if grpc else {}
    try:
        index = yield control_call("get_model_repository_index", grpc, timeout_s, **kwargs)
    except Exception as exc:
        raise map_error(exc, "Reading the model repository index") from None
    states: Dict[str, ModelState] = {}
    for entry in _index_entries(index):
        if entry.get("name") != model_name or not entry.get("version"):
            continue
        state = entry.get("state")
        states[str(entry["version"])] = ModelState(state) if state in ModelState.__members__ else ModelState.LOADING
    if model_version is not None and model_version not in ("", LATEST_MODEL_VERSION):
        return states.get(str(model_version), ModelState.UNAVAILABLE)
    numeric = [version for version in states if version.isdigit()]
    if not numeric:
        return ModelState.UNAVAILABLE
    return states[max(numeric, key=int)]


class ClientCore:
    """State and operations of one client bound to one model.

    Lifetime: created by a client; holds no sockets itself (the driver's ``tritonclient`` objects
    do). The model config is fetched once and cached, so after initialisation an inference costs
    exactly one server round trip. A config given up front (``model_config=``) is used as is; with
    ``ensure_model_is_ready=True`` the first call still waits for the model to be ready.
    """

    def __init__(
        self,
        url: TritonUrl,
        model_name: str,
        model_version: Optional[str],
        init_timeout_s: Optional[float],
        inference_timeout_s: Optional[float],
        model_config: Optional[TritonModelConfig] = None,
        ensure_model_is_ready: bool = True,
    ):
        if not isinstance(model_name, str) or not model_name:
            raise PyTritonClientValueError(f"model_name must be a non-empty string, got {model_name!r}.")
        if model_config is not None and not isinstance(model_config, TritonModelConfig):
            raise PyTritonClientValueError(
                f"model_config must be a TritonModelConfig (e.g. another client's model_config), "
                f"got {type(model_config).__name__}."
            )
        self.url = url
        self.model_name = model_name
        self.model_version = "" if model_version is None else str(model_version)
        self.init_timeout_s = DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else float(init_timeout_s)
        self.inference_timeout_s = (
            DEFAULT_INFERENCE_TIMEOUT_S if inference_timeout_s is None else float(inference_timeout_s)
        )
        self.config: Optional[TritonModelConfig] = model_config
        self.ready = model_config is not None and not ensure_model_is_ready
        self.grpc = url.protocol == "grpc"
        self._outputs: Dict[int, Sequence[object]] = {}  # requested-output objects, built once per lib

    # -- operations (generators) ----------------------------------------------------------------
    def wait_for_model(self, timeout_s: float) -> Operation:
        """Wait until the server and the model are ready; ``PyTritonClientTimeoutError`` after ``timeout_s``."""
        yield from wait_for_model(timeout_s, self.grpc, self.model_name, self.model_version, str(self.url))
        self.ready = True

    def wait_for_server(self, timeout_s: float) -> Operation:
        """Wait until the server is ready; ``PyTritonClientTimeoutError`` after ``timeout_s``."""
        yield from wait_for_server(timeout_s, self.grpc, f"the server at {self.url}")

    def ensure_config(self) -> Operation:
        """The model's config: waits for readiness (once, within ``init_timeout_s``) and reads it on first use."""
        if not self.ready:
            yield from self.wait_for_model(self.init_timeout_s)
        if self.config is None:
            self.config = yield from read_config(self.init_timeout_s, self.grpc, self.model_name, self.model_version)
        return self.config

    def load_model(self, config: Optional[str], files: Optional[Dict[str, bytes]]) -> Operation:
        """Ask the server to (re)load the model; the cached config is dropped and read again on next use."""
        kwargs: Dict[str, object] = {}
        if config is not None:
            kwargs["config"] = config if isinstance(config, str) else str(config)
        if files is not None:
            kwargs["files"] = files
        try:
            yield control_call("load_model", self.grpc, self.init_timeout_s, self.model_name, **kwargs)
        except Exception as exc:
            raise map_error(exc, f"Loading model {self.model_name!r}") from None
        self.forget()

    def unload_model(self) -> Operation:
        """Ask the server to unload the model; the cached config is dropped."""
        try:
            yield control_call("unload_model", self.grpc, self.init_timeout_s, self.model_name)
        except Exception as exc:
            raise map_error(exc, f"Unloading model {self.model_name!r}") from None
        self.forget()

    def forget(self) -> None:
        """Drop the cached config and readiness, so that the next call reads them again."""
        self.config = None
        self.ready = False
        self._outputs = {}

    def infer(
        self,
        inputs: Sequence[object],
        named_inputs: Mapping[str, object],
        parameters: Optional[Mapping[str, object]],
        headers: Optional[Mapping[str, object]],
        batch: bool,
        lib: object,
        sequence: Optional[Tuple[object, bool, bool]] = None,
    ) -> Operation:
        """One inference: ``infer_batch`` (``batch=True``) or ``infer_sample``.

        ``sequence``: ``(sequence_id, start, end)`` for a request of a sequence model (docs/sequences.md).
        """
        check_parameters(parameters, "parameters")
        check_parameters(headers, "headers")
        config = yield from self.ensure_config()
        if config.decoupled:
            raise PyTritonClientInferenceServerError(
                f"Model {self.model_name!r} is decoupled (it streams its responses); "
                "use DecoupledModelClient / AsyncioDecoupledModelClient for it."
            )
        arrays, add_axis = self.prepare_inputs(inputs, named_inputs, batch, config)
        request = self.build_request(arrays, config, parameters, headers, lib)
        if sequence is not None:
            request["sequence_id"], request["sequence_start"], request["sequence_end"] = sequence
        # Triton's request timeout, which the callable sees as Request.timeout_s / is_cancelled(); not
        # for streams (build_request is shared with them), whose length inference_timeout_s does not bound.
        request["timeout"] = max(1, int(self.inference_timeout_s * 1e6))
        try:
            result = yield Call(
                "infer",
                (self.model_name, request.pop("inputs")),
                request,
                infer=True,
                timeout_s=self.inference_timeout_s,
            )
        except Exception as exc:
            raise map_error(exc, f"Inference on model {self.model_name!r}") from None
        return self.decode(result, config, add_axis)

    # -- pure helpers ------------------------------------------------------------------------------
    def prepare_inputs(
        self, inputs: Sequence[object], named_inputs: Mapping[str, object], batch: bool, config: TritonModelConfig
    ) -> Tuple[Dict[str, npt.NDArray[np.generic]], bool]:
        """Input arrays ready to send, and whether a batch axis was added (``infer_sample``)."""
        arrays = self.collect_inputs(inputs, named_inputs, config)
        if batch and not config.batching:
            raise PyTritonClientModelDoesntSupportBatchingError(
                f"Model {self.model_name!r} does not support batching (max_batch_size=0); use infer_sample()."
            )
        add_axis = not batch and config.batching
        if add_axis:
            arrays = {name: value[np.newaxis, ...] for name, value in arrays.items()}
        return arrays, add_axis

    @staticmethod
    def collect_inputs(
        inputs: Sequence[object], named_inputs: Mapping[str, object], config: TritonModelConfig
    ) -> Dict[str, npt.NDArray[np.generic]]:
        """Positional inputs map onto the config's inputs in order; named ones by name; never both."""
        if inputs and named_inputs:
            raise PyTritonClientValueError("Pass inputs either positionally or by name, not both.")
        if inputs:
            names = [spec.name for spec in config.inputs]
            if len(inputs) > len(names):
                raise PyTritonClientValueError(
                    f"Got {len(inputs)} positional inputs but model {config.model_name!r} has {len(names)}: {names}."
                )
            named_inputs = dict(zip(names, inputs))
        if not named_inputs:
            raise PyTritonClientValueError("No inputs given.")
        arrays = {}
        for name, value in named_inputs.items():
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
            if array.dtype.kind == "U":  # strings travel as UTF-8 bytes
                array = np.char.encode(array, "utf-8")
            arrays[name] = array
        return arrays

    def build_request(
        self,
        arrays: Dict[str, npt.NDArray[np.generic]],
        config: TritonModelConfig,
        parameters: Optional[Mapping[str, object]],
        headers: Optional[Mapping[str, object]],
        lib: Any,
    ) -> Dict[str, object]:
        """Keyword arguments of ``lib.InferenceServerClient.infer`` (plus ``inputs``)."""
        infer_inputs = []
        for name, array in arrays.items():
            datatype = "BYTES" if array.dtype.kind in "SO" else np_to_triton_dtype(array.dtype)
            if datatype is None:
                raise PyTritonClientValueError(f"Input {name!r} has dtype {array.dtype}, which Triton cannot carry.")
            tensor = lib.InferInput(name, list(array.shape), datatype)
            if self.grpc:
                tensor.set_data_from_numpy(array)
            else:
                tensor.set_data_from_numpy(array, binary_data=True)
            infer_inputs.append(tensor)
        outputs = self._outputs.get(id(lib))
        if outputs is None:  # the objects are read-only descriptions: build them once
            if self.grpc:
                outputs = [lib.InferRequestedOutput(spec.name) for spec in config.outputs]
            else:
                outputs = [lib.InferRequestedOutput(spec.name, binary_data=True) for spec in config.outputs]
            self._outputs[id(lib)] = outputs
        request: Dict[str, object] = {"inputs": infer_inputs, "model_version": self.model_version, "outputs": outputs}
        if parameters:
            request["parameters"] = parameters
        if headers:
            text = {key: str(value) for key, value in headers.items()}
            request["headers"] = grpc_metadata(text) if self.grpc else text
        if self.grpc:  # a gRPC deadline: past it, Triton sees the request cancelled (docs/cancellation.md)
            request["client_timeout"] = self.inference_timeout_s
        return request

    @staticmethod
    def decode(result: InferResult, config: TritonModelConfig, remove_axis: bool) -> Dict[str, npt.NDArray[np.generic]]:
        """Output arrays by name (without the batch axis for ``infer_sample`` on batching models)."""
        outputs = {}
        for spec in config.outputs:
            array = result.as_numpy(spec.name)
            if array is None:
                continue
            outputs[spec.name] = array[0] if remove_axis and array.ndim else array
        return outputs
