"""Pipelines: call another bound model from inside an inference callable (docs/pipelines.md).

``pytriton.pipeline.model("Name")`` returns a :class:`ModelHandle` to a model bound to a running
``Triton`` of this process. The handle takes the most direct path there is:

* an embedded ``Triton`` (``Triton(embedded=True)``): Triton's in-process API, no network at all;
* otherwise gRPC on loopback, with one kept connection per calling thread (measured in
  ``python -m bench.pipeline``; docs/pipelines.md compares it with a direct client call);
* ``url=`` names any server explicitly (for a process instance, which has no ``Triton`` of its own,
  or a model served elsewhere).

Called while a callable runs, the inner request inherits the outer batch (``CURRENT_BATCH``): it is
cancelled when every outer request is (a cancelled gRPC call), it gets the outer requests' remaining
timeout as its gRPC deadline and Triton request timeout, and, when Triton traces the outer request,
its ``traceparent``, so that the inner model's spans nest under the outer ones. An error of the
inner model is raised as ``PyTritonClientInferenceServerError`` carrying the inner model's message.

Cycles (issue 42 item 6): a model that calls itself, directly or through others (A → A, A → B → A),
waits for a request queued behind its own call, forever when every instance of it is busy waiting
(one instance each: always). So every inner request carries the chain of models that wait for it
(the request parameter :data:`CHAIN_PARAMETER`: the outer requests' chains plus the calling model,
which the worker sets per thread, ``proxy.types.CURRENT_MODEL``), and a call to a model already on
that chain, or past :data:`MAX_HOPS` models, raises :class:`PipelineCycleError` at once, before
anything is sent: the outer request fails with that message and the model serves on. Backend
instances (``instance_kind="backend"``) neither set the calling model nor pass the outer batch on,
so a chain through one of them is cut there.

Unit test: tests/unit/test_pipeline.py; end to end: tests/e2e/test_pipeline.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

from pytriton._serving import running as _running
from pytriton.client._core import map_error
from pytriton.client.exceptions import PyTritonClientError, PyTritonClientValueError
from pytriton.exceptions import PyTritonInvalidOperationError
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy.types import CURRENT_BATCH, CURRENT_MODEL, Request

__all__ = ["CHAIN_PARAMETER", "MAX_HOPS", "ModelHandle", "PipelineCancelledError", "PipelineCycleError", "model"]

CHAIN_PARAMETER = "pytriton_pipeline"
"""The request parameter naming the models that wait for this request, outermost first, joined by ``/``
(a model name never contains one). Visible to the inner callable in ``Request.parameters``."""
MAX_HOPS = 16
"""The most models a pipeline chain may hold, the calling one included, before a call is refused."""

_POLL_S = 0.002  # how often a waiting inner call checks whether the outer requests were cancelled
_handles: Dict[Tuple[int, str, Optional[int], Optional[str]], ModelHandle] = {}
_lock = threading.Lock()


class PipelineCancelledError(PyTritonClientError):
    """The inner call was cancelled because every request of the calling batch was cancelled."""


class PipelineCycleError(PyTritonClientError):
    """The call would wait for a model already waiting on the calling chain (a deadlock), or the chain is too deep.

    Raised at once, before anything is sent; the message names the chain.
    """


def register(triton: object) -> None:
    """Make ``triton``'s models reachable through :func:`model` (``Triton.run()`` does it)."""
    _running.register(triton)


def unregister(triton: object) -> None:
    """The reverse of :func:`register` (``Triton.stop()`` does it); handles to its models are dropped."""
    _running.unregister(triton)


def _forget(triton: object) -> None:
    """Drop (and close) the handles to ``triton``'s models: it stopped."""
    with _lock:
        stale = [key for key in _handles if key[0] == id(triton)]
        handles = [_handles.pop(key) for key in stale]
    for handle in handles:
        handle.close()


_running.on_unregister.append(_forget)


def model(name: str, version: Optional[int] = None, *, url: Optional[str] = None) -> ModelHandle:
    """A handle to the bound model ``name`` (``version``: None for the highest), cached per model.

    Without ``url`` the model must be bound to a running ``Triton`` of this process; with it, the
    handle talks gRPC to that server (``grpc://host:port`` or ``host:port``).

    Raises:
        PyTritonInvalidOperationError: no running ``Triton`` of this process binds ``name``.
    """
    triton = None
    if url is None:
        owners = _running.owners(name)
        if not owners:
            raise PyTritonInvalidOperationError(
                f"No running Triton in this process has bound model {name!r}; bind it and call run() first, "
                "or pass url='grpc://host:port' (e.g. from a process instance, which has no Triton of its own)."
            )
        triton = owners[-1]
    key = (id(triton), name, version, url)
    with _lock:
        handle = _handles.get(key)
        if handle is None:
            handle = _handles[key] = ModelHandle(name, version, triton=triton, url=url)
        return handle


class _Outer:
    """What the inner call inherits from the calling batch (``CURRENT_BATCH``)."""

    def __init__(self, requests: Optional[List[Request]]):
        self.requests = requests or []
        # The models waiting for this call: every outer request's chain (a batch may mix callers), then
        # the calling model.
        chain: List[str] = []
        for request in self.requests:
            raw = request.parameters.get(CHAIN_PARAMETER) if request.parameters else None
            if isinstance(raw, str) and raw:
                chain.extend(name for name in raw.split("/") if name not in chain)
        caller = CURRENT_MODEL.get()
        if caller is not None and caller not in chain:
            chain.append(caller)
        self.chain = chain
        timeouts = [r._deadline for r in self.requests]
        # The inner call is wanted as long as one outer request waits: the latest deadline counts.
        self.deadline = max(timeouts) if timeouts and all(d is not None for d in timeouts) else None  # type: ignore[type-var]
        self.headers: Dict[str, str] = {}
        for request in self.requests:
            if request.span is not None:
                self.headers = _trace_headers(request.span)
                break

    def cancelled(self) -> bool:
        return bool(self.requests) and all(request.is_cancelled() for request in self.requests)

    def known_cancelled(self) -> bool:
        """:meth:`cancelled` from what is known without asking the stub (deadlines, earlier answers):
        asking costs a round trip to it, a process wake-up (0.3-0.5 ms per hop on a busy host)."""
        return bool(self.requests) and all(request._known_cancelled() for request in self.requests)

    def remaining_s(self) -> Optional[float]:
        return None if self.deadline is None else max(0.001, self.deadline - time.monotonic())

    def check(self, target: str) -> None:
        """Raise :class:`PipelineCycleError` if calling ``target`` could wait for itself, or goes too deep."""
        if target in self.chain:
            path = " -> ".join([*self.chain, target])
            raise PipelineCycleError(
                f"Pipeline call to model {target!r} refused: it would wait for a model that is already waiting on "
                f"this call ({path}). A model that calls itself, directly or through other models, waits for a "
                "request queued behind its own call, forever once every instance of it is busy. Compute the "
                "result without re-entering the model (or bind a separate model for the inner step)."
            )
        if len(self.chain) >= MAX_HOPS:
            raise PipelineCycleError(
                f"Pipeline call to model {target!r} refused: the calling chain already holds {len(self.chain)} models "
                f"({' -> '.join(self.chain)}), pytriton.pipeline.MAX_HOPS = {MAX_HOPS}."
            )

    def parameters(self) -> Optional[Dict[str, str]]:
        """The inner request's parameters: the chain it extends (None outside a callable)."""
        return {CHAIN_PARAMETER: "/".join(self.chain)} if self.chain else None


def _trace_headers(span: Any) -> Dict[str, str]:  # an OpenTelemetry span (an optional extra)
    """``traceparent`` of ``span`` (W3C), for Triton to parent the inner request's spans on it."""
    try:
        from opentelemetry import propagate, trace  # type: ignore[import-not-found]  # optional extra
    except ImportError:
        return {}
    carrier: Dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))  # type: ignore[attr-defined,unused-ignore]
    return carrier


class ModelHandle:
    """Calls one bound model from a callable; ``ModelClient``-shaped, thread-safe, nothing to close.

    ``infer_sample``/``infer_batch`` (and ``async_infer_sample``/``async_infer_batch`` for
    ``async def`` callables) take inputs positionally (in the model's input order) or by name and
    return the outputs by name; ``infer_sample`` adds and removes the batch axis of a batching model.
    """

    def __init__(self, name: str, version: Optional[int], *, triton: Any = None, url: Optional[str] = None):
        self.name = name
        self._version = version
        self._embedded = None
        self._config: Optional[TritonModelConfig] = None
        if triton is not None and getattr(triton, "embedded", False):
            self._embedded = triton.client(name, version)
        elif triton is not None:
            url = triton.grpc_url
            versions = triton._versions(name)
            bound = [m for m in versions if version is None or m.version == version]
            self._config = bound[-1].config if bound else None
        assert url is not None or self._embedded is not None
        self._address = (url or "").split("://", 1)[-1]
        self._local = threading.local()
        self._clients: weakref.WeakSet[Any] = weakref.WeakSet()
        # asyncio clients, one per event loop (a worker's loop lives as long as its connection)
        self._aio: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        self._outputs: Optional[List[str]] = None

    @property
    def path(self) -> str:
        """``"inprocess"`` or ``"grpc"``: how this handle reaches its model."""
        return "inprocess" if self._embedded is not None else "grpc"

    # -- public calls --------------------------------------------------------------------------
    def infer_sample(self, *inputs: object, **named: object) -> Dict[str, npt.NDArray[np.generic]]:
        """One sample (the batch axis is added and removed for batching models)."""
        return self._infer(inputs, named, batch=False)

    def infer_batch(self, *inputs: object, **named: object) -> Dict[str, npt.NDArray[np.generic]]:
        """A batch (inputs carry the batch axis)."""
        return self._infer(inputs, named, batch=True)

    async def async_infer_sample(self, *inputs: object, **named: object) -> Dict[str, npt.NDArray[np.generic]]:
        """:meth:`infer_sample` for ``async def`` callables."""
        return await self._async_infer(inputs, named, batch=False)

    async def async_infer_batch(self, *inputs: object, **named: object) -> Dict[str, npt.NDArray[np.generic]]:
        """:meth:`infer_batch` for ``async def`` callables."""
        return await self._async_infer(inputs, named, batch=True)

    def close(self) -> None:
        """Close the kept connections of blocking calls (done by ``Triton.stop()``); the asyncio ones
        belong to their event loops and go with them."""
        for client in list(self._clients):
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass

    # -- internals ---------------------------------------------------------------------------
    def _infer(
        self, inputs: Sequence[object], named: Mapping[str, object], batch: bool
    ) -> Dict[str, npt.NDArray[np.generic]]:
        outer = _Outer(CURRENT_BATCH.get())
        outer.check(self.name)
        if self._embedded is not None:
            # In-process calls cannot be cancelled midway by pytriton; a cancelled outer batch skips them.
            if outer.known_cancelled():
                raise PipelineCancelledError(f"Call to model {self.name!r} skipped: the calling request was cancelled.")
            try:
                call = self._embedded.infer_batch if batch else self._embedded.infer_sample
                parameters = outer.parameters()
                outputs: Dict[str, npt.NDArray[np.generic]] = (
                    call(*inputs, **named) if parameters is None else call(*inputs, parameters=parameters, **named)
                )
                return outputs
            except Exception as exc:  # noqa: BLE001 - an inprocess error: keep its message
                raise map_error(exc, f"Inference on model {self.name!r}") from None
        import tritonclient.grpc as grpcclient

        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = grpcclient.InferenceServerClient(self._address)
            self._clients.add(client)
        arrays, add_axis = self._arrays(inputs, named, batch, client)
        request = self._request(grpcclient, arrays, outer)
        done = threading.Event()
        box: List[Any] = [None, None]

        def finished(result: object, error: object) -> None:
            box[0], box[1] = result, error
            done.set()

        call = client.async_infer(self.name, request.pop("inputs"), callback=finished, **request)
        while not done.wait(_POLL_S):
            if outer.cancelled():
                call.cancel()
                done.wait(1.0)
                raise PipelineCancelledError(
                    f"Call to model {self.name!r} cancelled: the calling request was cancelled."
                )
        if box[1] is not None:
            raise map_error(box[1], f"Inference on model {self.name!r}") from None
        return self._decode(box[0], add_axis)

    async def _async_infer(
        self, inputs: Sequence[object], named: Dict[str, object], batch: bool
    ) -> Dict[str, npt.NDArray[np.generic]]:
        if self._embedded is not None:
            outer = _Outer(CURRENT_BATCH.get())
            outer.check(self.name)
            if outer.known_cancelled():
                raise PipelineCancelledError(f"Call to model {self.name!r} skipped: the calling request was cancelled.")
            loop = asyncio.get_running_loop()
            context = contextvars.copy_context()  # the executor's thread sees the outer batch and the chain too
            return await loop.run_in_executor(None, lambda: context.run(self._infer, inputs, named, batch))
        import tritonclient.grpc.aio as aioclient

        outer = _Outer(CURRENT_BATCH.get())
        outer.check(self.name)
        loop = asyncio.get_running_loop()
        client = self._aio.get(loop)
        if client is None:  # closed with its loop: its channel cannot be closed from another thread
            client = self._aio[loop] = aioclient.InferenceServerClient(self._address)
        arrays, add_axis = self._arrays(inputs, named, batch, None)
        request = self._request(aioclient, arrays, outer)
        task = asyncio.ensure_future(client.infer(self.name, request.pop("inputs"), **request))
        while True:
            finished, _ = await asyncio.wait({task}, timeout=_POLL_S)
            if finished:
                break
            if outer.cancelled():
                task.cancel()
                raise PipelineCancelledError(
                    f"Call to model {self.name!r} cancelled: the calling request was cancelled."
                )
        try:
            result = task.result()
        except Exception as exc:  # noqa: BLE001
            raise map_error(exc, f"Inference on model {self.name!r}") from None
        return self._decode(result, add_axis)

    def _model_config(self, client: Any) -> TritonModelConfig:
        if self._config is None:
            from pytriton.model_config.generator import from_dict

            if client is None:
                import tritonclient.grpc as grpcclient

                with grpcclient.InferenceServerClient(self._address) as reader:
                    raw = reader.get_model_config(self.name, as_json=True)
            else:
                raw = client.get_model_config(self.name, as_json=True)
            self._config = from_dict(raw["config"])
        return self._config

    def _arrays(
        self, inputs: Sequence[object], named: Mapping[str, object], batch: bool, client: object
    ) -> Tuple[Dict[str, npt.NDArray[np.generic]], bool]:
        config = self._model_config(client)
        if inputs and named:
            raise PyTritonClientValueError("Pass inputs either positionally or by name, not both.")
        if inputs:
            names = [spec.name for spec in config.inputs]
            if len(inputs) > len(names):
                raise PyTritonClientValueError(f"Model {self.name!r} takes {len(names)} inputs, got {len(inputs)}.")
            named = dict(zip(names, inputs))
        if batch and not config.batching:
            raise PyTritonClientValueError(f"Model {self.name!r} does not batch (max_batch_size 0); use infer_sample.")
        add_axis = not batch and config.batching
        arrays = {}
        for key, value in named.items():
            array = np.asarray(value)
            if array.dtype.kind == "U":
                array = np.char.encode(array, "utf-8")
            arrays[key] = array[np.newaxis, ...] if add_axis else array
        if self._outputs is None:
            self._outputs = [spec.name for spec in config.outputs]
        return arrays, add_axis

    def _request(self, lib: Any, arrays: Dict[str, npt.NDArray[np.generic]], outer: _Outer) -> Dict[str, object]:
        from tritonclient.utils import np_to_triton_dtype

        tensors = []
        for key, array in arrays.items():
            datatype = "BYTES" if array.dtype.kind in "SO" else np_to_triton_dtype(array.dtype)
            tensor = lib.InferInput(key, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        request: Dict[str, object] = {"inputs": tensors}
        if self._version is not None:
            request["model_version"] = str(self._version)
        remaining = outer.remaining_s()
        if remaining is not None:  # the inner call is not wanted past the outer requests' deadline
            request["client_timeout"] = remaining
            request["timeout"] = max(1, int(remaining * 1e6))
        if outer.headers:
            request["headers"] = dict(outer.headers)
        parameters = outer.parameters()
        if parameters is not None:
            request["parameters"] = parameters
        return request

    def _decode(self, result: Any, remove_axis: bool) -> Dict[str, npt.NDArray[np.generic]]:
        outputs = {}
        for key in self._outputs or []:
            array = result.as_numpy(key)
            if array is not None:
                outputs[key] = array[0] if remove_axis and array.ndim else array
        return outputs
