"""``ModelClient``-shaped calls on an in-process model, for code written against pytriton's client.

``InProcessModelClient(server, "name").infer_sample(a, b)`` behaves like
``ModelClient(url, "name").infer_sample(a, b)`` without a network: positional inputs follow the
model's input order, ``infer_sample`` adds the batch axis for batching models and removes it from
the outputs, ``infer_batch`` passes the batch as is. Outputs are numpy arrays viewing the memory
Triton wrote (no copy); BYTES outputs are object arrays of ``bytes``. Errors are the in-process
API's exceptions (:class:`TritonError` subclasses), not the network client's.

Unit test: tests/unit/test_inprocess_client.py (on a fake server and model).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional, Union

import numpy as np

from pytriton.inprocess._enums import DataType, ModelTxnPropertyFlag
from pytriton.inprocess._errors import InvalidArgumentError, UnavailableError
from pytriton.inprocess._server import Model, Server
from pytriton.inprocess._tensor import Tensor


class InProcessModelClient:
    """Synchronous client of one model of an in-process :class:`Server` (no connection to open)."""

    def __init__(self, server: Server, model_name: str, model_version: Union[int, str, None] = None) -> None:
        self._model: Model = server.model(model_name, int(model_version) if model_version is not None else -1)
        self._config: Optional[Dict[str, object]] = None
        self._decoupled: Optional[bool] = None
        self._closed = False

    def __enter__(self) -> InProcessModelClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Mark the client closed (nothing to release). Idempotent."""
        self._closed = True

    @property
    def model(self) -> Model:
        return self._model

    @property
    def model_config(self) -> Dict[str, Any]:
        """The model configuration (read once; so is whether the model is decoupled)."""
        if self._config is None:
            self._config = self._model.config()
        return self._config

    def wait_for_model(self, timeout_s: float) -> None:
        """Block until the model is ready; :class:`UnavailableError` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self._model.ready():
            if time.monotonic() >= deadline:
                raise UnavailableError(f"Model {self._model.name!r} was not ready within {timeout_s} s")
            time.sleep(0.05)

    def infer_sample(
        self, *inputs: object, parameters: Optional[Mapping[str, object]] = None, **named: object
    ) -> Dict[str, Any]:
        """Infer one sample (the batch axis is added and removed for batching models)."""
        return self._infer(inputs, named, parameters, batch=False)

    def infer_batch(
        self, *inputs: object, parameters: Optional[Mapping[str, object]] = None, **named: object
    ) -> Dict[str, Any]:
        """Infer a batch (inputs carry the batch axis); only for batching models."""
        return self._infer(inputs, named, parameters, batch=True)

    def _infer(
        self, inputs: Any, named: Mapping[str, object], parameters: Optional[Mapping[str, object]], batch: bool
    ) -> Dict[str, object]:
        if self._closed:
            raise InvalidArgumentError("The client is closed")
        if inputs and named:
            raise InvalidArgumentError("Pass inputs either positionally or by name, not both")
        config = self.model_config
        batching = int(config.get("max_batch_size", 0)) > 0
        if batch and not batching:
            raise InvalidArgumentError(
                f"Model {self._model.name!r} does not batch (max_batch_size 0): use infer_sample"
            )
        if self._decoupled is None:  # read once, like the configuration (a call into Triton otherwise)
            self._decoupled = self._model.transaction_properties() == ModelTxnPropertyFlag.DECOUPLED
        if self._decoupled:
            raise InvalidArgumentError(f"Model {self._model.name!r} is decoupled: iterate Model.infer() instead")
        names: List[str] = [entry["name"] for entry in config.get("input", [])]
        if inputs:
            if len(inputs) > len(names):
                raise InvalidArgumentError(f"Model {self._model.name!r} takes {len(names)} inputs, got {len(inputs)}")
            named = dict(zip(names, inputs))
        tensors: Dict[str, object] = {}
        for name, value in named.items():
            array = np.asarray(value)
            if batching and not batch:
                array = array[np.newaxis, ...]
            tensors[name] = Tensor.from_bytes_array(array) if array.dtype.kind in ("O", "S", "U") else array
        (response,) = list(self._model.infer(inputs=tensors, parameters=dict(parameters or {})))
        outputs: Dict[str, object] = {}
        for name, tensor in response.outputs.items():
            value = tensor.to_bytes_array() if tensor.data_type == DataType.BYTES else np.from_dlpack(tensor)
            outputs[name] = value[0] if batching and not batch else value
        return outputs
