"""One Ray Serve replica: an embedded pytriton ``Triton`` with the user's bound models.

:class:`PyTritonReplica` is a plain class (Ray Serve wraps it with ``serve.deployment``, see
:func:`pytriton.ray.build_app`), so this module does not import Ray. Per replica process:

- ``__init__`` makes ``Triton(embedded=True)``, calls the user's ``bind_models(triton)`` and starts
  it (``run()``): every bound model is loaded before the replica reports itself started. The
  server library runs inside the replica process; nothing listens on a port.
- :meth:`infer` is the ``DeploymentHandle`` path (numpy arrays in, numpy arrays out, no HTTP);
  ``__call__`` is the HTTP ingress (Ray's proxy hands it a Starlette request): KServe v2 JSON
  inference, model metadata, and health routes.
- :meth:`check_health` is Ray Serve's health probe; :meth:`record_autoscaling_stats` reports the
  queue time Triton measured since the previous report (:class:`pytriton.ray.QueueTimePolicy`).
- ``__del__`` (Ray Serve calls it when it stops the replica) stops the server: stubs, shared-memory
  regions and the workspace are released. A replica process that is killed leaves them to
  pytriton's watchdog, as any killed embedded ``Triton`` does (docs/inprocess.md).
"""

# Unit tests: tests/unit/test_ray_parts.py (no Ray); on a two-node Ray cluster: tests/e2e/test_ray.py.

from __future__ import annotations

import json
import os
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import numpy.typing as npt

from pytriton import inprocess
from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config import dtypes
from pytriton.triton import Triton, TritonConfig

# A Starlette request handed over by Ray's HTTP proxy, and the response returned to it: untyped
# here, since Ray (and its Starlette) is an optional dependency the type checker does not see.
HttpObject = Any
# KServe v2 JSON: parsed and produced as plain Python values.
Json = Any

BindModels = Callable[[Triton], None]


class PyTritonRequestError(ValueError):
    """A request this replica refuses (an unknown model, a malformed KServe v2 body); HTTP 400/404."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _to_v2_output(name: str, array: npt.NDArray[np.generic]) -> Dict[str, Json]:
    if array.dtype.kind in ("O", "S", "U"):
        data = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
        datatype = "BYTES"
    else:
        try:
            datatype = dtypes.triton_type(array.dtype)
        except PyTritonBadParameterError:
            raise PyTritonRequestError(
                f"Output {name!r} has dtype {array.dtype}, which KServe v2 JSON cannot carry"
            ) from None
        data = array.reshape(-1).tolist()
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": data}


def parse_v2_inputs(body: Mapping[str, Json]) -> Dict[str, npt.NDArray[np.generic]]:
    """The numpy inputs of a KServe v2 JSON inference body; :class:`PyTritonRequestError` if malformed."""
    entries = body.get("inputs")
    if not isinstance(entries, list) or not entries:
        raise PyTritonRequestError('The body needs "inputs": a list of {"name", "shape", "datatype", "data"}')
    inputs: Dict[str, npt.NDArray[np.generic]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not {"name", "shape", "datatype", "data"} <= entry.keys():
            raise PyTritonRequestError('Each input needs "name", "shape", "datatype" and "data"')
        try:
            dtype = dtypes.numpy_type(str(entry["datatype"]))
        except PyTritonBadParameterError:
            raise PyTritonRequestError(f"Input {entry['name']!r}: unknown datatype {entry['datatype']!r}") from None
        try:
            if dtype is np.bytes_:
                flat = np.array([str(v).encode("utf-8") for v in np.asarray(entry["data"]).reshape(-1)], dtype=object)
                array = flat.reshape([int(d) for d in entry["shape"]])
            else:
                array = np.asarray(entry["data"], dtype=dtype).reshape([int(d) for d in entry["shape"]])
        except (TypeError, ValueError) as error:
            raise PyTritonRequestError(
                f"Input {entry['name']!r}: data does not fit shape {entry['shape']}: {error}"
            ) from None
        inputs[str(entry["name"])] = array
    return inputs


class PyTritonReplica:
    """A Ray Serve replica serving the models ``bind_models`` binds on an embedded ``Triton``.

    Args:
        bind_models: called once per replica with the replica's ``Triton`` (not started yet); it
            binds models with ``triton.bind(...)`` as in a plain pytriton app. It runs in the
            replica process, so it must be importable or picklable there (a module-level function).
        triton_config: the replica's ``TritonConfig`` (log settings, shared-memory sizes, exit
            timeout). Network settings have no effect: the embedded server has no ports.
    """

    def __init__(self, bind_models: BindModels, triton_config: Optional[TritonConfig] = None) -> None:
        self._triton = Triton(embedded=True, config=triton_config)
        try:
            bind_models(self._triton)
            self._triton.run()
            self._models = {name: self._triton.model(name) for name in self._triton_model_names()}
        except BaseException:
            self._triton.stop()
            raise
        if not self._models:
            self._triton.stop()
            raise ValueError("bind_models bound no model: call triton.bind(...) in it")
        # Queue-time counters at the previous autoscaling report: (count, ns) per model.
        self._queue_seen: Dict[str, Tuple[int, int]] = {}
        self._stats_lock = threading.Lock()

    def _triton_model_names(self) -> List[str]:
        names: List[str] = self._triton._model_names()
        return names

    def _model(self, model_name: Optional[str]) -> inprocess.Model:
        if model_name is None:
            if len(self._models) != 1:
                raise PyTritonRequestError(f"Several models are bound ({sorted(self._models)}): name one", 400)
            return next(iter(self._models.values()))
        model = self._models.get(model_name)
        if model is None:
            raise PyTritonRequestError(f"No model {model_name!r} here; bound: {sorted(self._models)}", 404)
        return model

    async def infer(
        self,
        inputs: Mapping[str, object],
        model_name: Optional[str] = None,
        parameters: Optional[Mapping[str, object]] = None,
    ) -> Dict[str, npt.NDArray[np.generic]]:
        """Infer with ``inputs`` (name to array, batch axis included for batching models).

        ``model_name`` may be left out when one model is bound. Returns name to array; the arrays
        are copies that stay valid after the call (they travel back through Ray's object store).
        Errors are :mod:`pytriton.inprocess` exceptions (``InvalidArgumentError`` for a wrong input
        name, dtype or shape; ``InternalError`` for a callable that raised) or
        :class:`PyTritonRequestError` for an unknown model.
        """
        from pytriton.inprocess import DataType
        from pytriton.inprocess import Tensor as InprocessTensor

        model = self._model(model_name)
        tensors: Dict[str, object] = {}
        for name, value in inputs.items():
            array = np.asarray(value)
            tensors[name] = InprocessTensor.from_bytes_array(array) if array.dtype.kind in ("O", "S", "U") else array
        outputs: Dict[str, npt.NDArray[np.generic]] = {}
        async for response in model.async_infer(inputs=tensors, parameters=dict(parameters or {})):
            for name, tensor in response.outputs.items():
                if tensor.data_type == DataType.BYTES:
                    outputs[name] = tensor.to_bytes_array()
                else:  # a copy: the view points into memory that is released with the response
                    outputs[name] = np.array(np.from_dlpack(tensor), copy=True)
        return outputs

    def where(self) -> Dict[str, object]:
        """Where this replica runs: Ray node id, process id, shared-memory prefix, bound models."""
        node_id = ""
        try:
            import ray

            node_id = ray.get_runtime_context().get_node_id()
        except Exception:  # outside Ray (a unit test constructing the class directly)
            pass
        return {
            "node_id": node_id,
            "pid": os.getpid(),
            "shm_prefix": self._triton.inprocess_server.shm_region_prefix,
            "models": sorted(self._models),
        }

    def queue_time_ms(self) -> float:
        """Mean time a request waited in Triton's queue since the previous call, over all models (ms).

        0.0 when no request finished since then. Reads Triton's statistics (``inference_stats.queue``).
        """
        from pytriton.inprocess import TritonError

        with self._stats_lock:
            count_delta = ns_delta = 0
            for name, model in self._models.items():
                try:
                    stats = model.statistics().get("model_stats", [])
                except TritonError:  # stopped (Ray asks once more while the replica shuts down): no queue
                    return 0.0
                count = ns = 0
                for entry in stats:
                    queue = entry.get("inference_stats", {}).get("queue", {})
                    count += int(queue.get("count", 0))
                    ns += int(queue.get("ns", 0))
                seen_count, seen_ns = self._queue_seen.get(name, (0, 0))
                self._queue_seen[name] = (count, ns)
                count_delta += max(0, count - seen_count)
                ns_delta += max(0, ns - seen_ns)
        return ns_delta / count_delta / 1e6 if count_delta else 0.0

    def record_autoscaling_stats(self) -> Dict[str, float]:
        """Ray Serve's custom-metrics hook: ``{"pytriton_queue_ms": ...}`` for :class:`QueueTimePolicy`."""
        return {"pytriton_queue_ms": self.queue_time_ms()}

    def check_health(self) -> None:
        """Ray Serve's health probe: raises (the replica is replaced) once the server cannot serve."""
        if not self._triton.is_alive():
            raise RuntimeError("pytriton: the embedded server or a model's stub is not serving")

    async def __call__(self, request: HttpObject) -> HttpObject:
        """HTTP ingress (a Starlette request from Ray's proxy): KServe v2 JSON.

        Routes (after the application's route prefix): ``POST /v2/models/<m>/infer``,
        ``GET /v2/models/<m>`` (metadata), ``GET /v2/models/<m>/ready``, ``GET /v2/health/ready``
        and ``/v2/health/live``. Errors answer ``{"error": message}`` with 400 (bad request), 404
        (unknown model or route) or 500 (the model failed); no traceback reaches the client.
        """
        from starlette.responses import JSONResponse

        from pytriton.inprocess import InvalidArgumentError, NotFoundError, TritonError

        path = str(request.url.path)
        root = str(request.scope.get("root_path", ""))  # the application's route prefix, set by Ray's proxy
        if root and path.startswith(root):
            path = path[len(root) :]
        parts = [p for p in path.split("/") if p]
        try:
            if parts[:2] == ["v2", "health"] and len(parts) == 3 and parts[2] in ("live", "ready"):
                alive = self._triton.is_alive()
                return JSONResponse(
                    {"ready" if parts[2] == "ready" else "live": alive}, status_code=200 if alive else 503
                )
            if len(parts) < 3 or parts[:2] != ["v2", "models"]:
                raise PyTritonRequestError(f"No route {request.url.path!r}; use /v2/models/<model>/infer", 404)
            model_name, rest = parts[2], parts[3:]
            if rest and rest[0] == "versions" and len(rest) >= 2:
                rest = rest[2:]
            model = self._model(model_name)
            if not rest and request.method == "GET":
                return JSONResponse(model.metadata())
            if rest == ["ready"]:
                ready = bool(model.ready())
                return JSONResponse({"ready": ready}, status_code=200 if ready else 503)
            if rest != ["infer"] or request.method != "POST":
                raise PyTritonRequestError(f"No route {request.method} {request.url.path!r}", 404)
            try:
                body = json.loads(await request.body())
            except ValueError as error:
                raise PyTritonRequestError(f"The body is not JSON: {error}") from None
            if not isinstance(body, dict):
                raise PyTritonRequestError("The body must be a JSON object")
            outputs = await self.infer(parse_v2_inputs(body), model_name, body.get("parameters"))
            wanted = [o.get("name") for o in body.get("outputs") or [] if isinstance(o, dict)]
            names = [n for n in wanted if n in outputs] or list(outputs)
            answer = {
                "model_name": model_name,
                "outputs": [_to_v2_output(n, outputs[n]) for n in names],
            }
            if int(model.version) >= 0:  # -1: Triton picks the version; the response does not name one
                answer["model_version"] = str(model.version)
            if body.get("id") is not None:
                answer["id"] = body["id"]
            return JSONResponse(answer)
        except PyTritonRequestError as error:
            return JSONResponse({"error": str(error)}, status_code=error.status)
        except InvalidArgumentError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        except NotFoundError as error:
            return JSONResponse({"error": str(error)}, status_code=404)
        except TritonError as error:
            return JSONResponse({"error": str(error)}, status_code=500)

    def __del__(self) -> None:
        triton = getattr(self, "_triton", None)
        if triton is not None:
            triton.stop()
