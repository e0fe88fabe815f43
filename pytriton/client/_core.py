"""The protocol- and I/O-independent core shared by every client.

Each client operation is written once, as a generator that *yields* the network calls it needs
(:class:`Call`) and receives their results; a driver runs it. :func:`run_sync` drives it with the
blocking ``tritonclient`` clients, :func:`run_async` with the asyncio ones (see ``_drivers``). The
sync, futures and asyncio clients therefore share request building, readiness checks, batch-axis
handling, response decoding and error mapping instead of copying them.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, Generator, List, Optional, Sequence, Tuple

import numpy as np
from tritonclient.utils import np_to_triton_dtype

from pytriton.client._url import TritonUrl
from pytriton.client.exceptions import (
    PyTritonClientError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientModelUnavailableError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.model_config.generator import from_dict
from pytriton.model_config.triton_model_config import TritonModelConfig

DEFAULT_INIT_TIMEOUT_S = 300.0
DEFAULT_INFERENCE_TIMEOUT_S = 60.0
_UNAVAILABLE_MARKERS = ("unknown model", "is not found", "unavailable", "not ready", "no version")


@dataclasses.dataclass
class Call:
    """One network call an operation needs: ``method`` of the control or the inference client.

    ``method == "sleep"`` asks the driver to wait ``args[0]`` seconds.
    """

    method: str
    args: Tuple[Any, ...] = ()
    kwargs: Dict[str, Any] = dataclasses.field(default_factory=dict)
    infer: bool = False  # True: use the inference client and apply the inference timeout
    timeout_s: Optional[float] = None  # bound for drivers that time calls themselves (asyncio)


Operation = Generator[Call, Any, Any]


def is_timeout(exc: BaseException) -> bool:
    """True for the many ways a transport reports a timeout (socket, gevent, gRPC deadline, asyncio)."""
    if isinstance(exc, TimeoutError):
        return True
    name = type(exc).__name__.lower()
    text = str(exc).lower()
    return "timeout" in name or "deadline" in text or "timed out" in text


def map_error(exc: BaseException, what: str) -> PyTritonClientError:
    """Translate a tritonclient/transport exception into the matching pytriton client error."""
    if isinstance(exc, PyTritonClientError):
        return exc
    if is_timeout(exc):
        return PyTritonClientTimeoutError(f"{what} timed out: {exc}")
    message = exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)
    if any(marker in (message or "").lower() for marker in _UNAVAILABLE_MARKERS):
        return PyTritonClientModelUnavailableError(f"{what} failed: {message}")
    return PyTritonClientInferenceServerError(f"{what} failed: {message}")


class ClientCore:
    """State and operations of one client bound to one model.

    Lifetime: created by a client; holds no sockets itself (the driver's ``tritonclient`` objects
    do). The model config is fetched once and cached, so after initialisation an inference costs
    exactly one server round trip.
    """

    def __init__(
        self,
        url: TritonUrl,
        model_name: str,
        model_version: Optional[str],
        init_timeout_s: Optional[float],
        inference_timeout_s: Optional[float],
    ):
        if not isinstance(model_name, str) or not model_name:
            raise PyTritonClientValueError(f"model_name must be a non-empty string, got {model_name!r}.")
        self.url = url
        self.model_name = model_name
        self.model_version = "" if model_version is None else str(model_version)
        self.init_timeout_s = DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else float(init_timeout_s)
        self.inference_timeout_s = (
            DEFAULT_INFERENCE_TIMEOUT_S if inference_timeout_s is None else float(inference_timeout_s)
        )
        self.config: Optional[TritonModelConfig] = None
        self.grpc = url.protocol == "grpc"
        self._outputs: Dict[int, List[Any]] = {}  # requested-output objects, built once per lib

    # -- operations (generators) ----------------------------------------------------------------
    def wait_for_model(self, timeout_s: float) -> Operation:
        """Wait until the server and the model are ready; ``PyTritonClientTimeoutError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        server_ready = False
        last_error: Optional[BaseException] = None
        while True:
            remaining = deadline - time.monotonic()
            try:
                server_ready = bool((yield self._control("is_server_ready", remaining)))
                if server_ready and (
                    yield self._control("is_model_ready", remaining, self.model_name, self.model_version)
                ):
                    return None
            except Exception as exc:  # the server may still be starting
                last_error = exc
            if time.monotonic() + delay > deadline:
                state = (
                    f"the server is up but model {self.model_name!r}"
                    f"{' version ' + self.model_version if self.model_version else ''} is not ready"
                    if server_ready
                    else f"the server at {self.url} is not ready" + (f" ({last_error})" if last_error else "")
                )
                raise PyTritonClientTimeoutError(f"Waited {timeout_s:.1f} s: {state}.")
            yield Call("sleep", (delay,))
            delay = min(delay * 2, 0.5)

    def ensure_config(self) -> Operation:
        """The model's config, fetched (after waiting for readiness) on first use."""
        if self.config is None:
            yield from self.wait_for_model(self.init_timeout_s)
            try:
                raw = yield self._control("get_model_config", self.init_timeout_s, self.model_name, self.model_version)
            except Exception as exc:
                raise map_error(exc, f"Reading the config of model {self.model_name!r}") from None
            if self.grpc:
                raw = raw.get("config", raw)
            self.config = from_dict(raw)
        return self.config

    def infer(
        self,
        inputs: Sequence[Any],
        named_inputs: Dict[str, Any],
        parameters: Optional[Dict[str, Any]],
        headers: Optional[Dict[str, str]],
        batch: bool,
        lib: Any,
    ) -> Operation:
        """One inference: ``infer_batch`` (``batch=True``) or ``infer_sample``."""
        config = yield from self.ensure_config()
        arrays, add_axis = self.prepare_inputs(inputs, named_inputs, batch, config)
        request = self.build_request(arrays, config, parameters, headers, lib)
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
    def _control(self, method: str, remaining_s: float, *args: Any) -> Call:
        kwargs: Dict[str, Any] = {}
        if self.grpc:
            kwargs["client_timeout"] = max(0.05, remaining_s)
            if method == "get_model_config":
                kwargs["as_json"] = True
        return Call(method, args, kwargs, timeout_s=max(0.05, remaining_s))

    def prepare_inputs(
        self, inputs: Sequence[Any], named_inputs: Dict[str, Any], batch: bool, config: TritonModelConfig
    ) -> Tuple[Dict[str, np.ndarray], bool]:
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
        inputs: Sequence[Any], named_inputs: Dict[str, Any], config: TritonModelConfig
    ) -> Dict[str, np.ndarray]:
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
        arrays: Dict[str, np.ndarray],
        config: TritonModelConfig,
        parameters: Optional[Dict[str, Any]],
        headers: Optional[Dict[str, str]],
        lib: Any,
    ) -> Dict[str, Any]:
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
        request: Dict[str, Any] = {"inputs": infer_inputs, "model_version": self.model_version, "outputs": outputs}
        if parameters:
            request["parameters"] = parameters
        if headers:
            request["headers"] = headers
        if self.grpc:
            request["client_timeout"] = self.inference_timeout_s
        return request

    @staticmethod
    def decode(result: Any, config: TritonModelConfig, remove_axis: bool) -> Dict[str, np.ndarray]:
        """Output arrays by name (without the batch axis for ``infer_sample`` on batching models)."""
        outputs = {}
        for spec in config.outputs:
            array = result.as_numpy(spec.name)
            if array is None:
                continue
            outputs[spec.name] = array[0] if remove_axis and array.ndim else array
        return outputs
