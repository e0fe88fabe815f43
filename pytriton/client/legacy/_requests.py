"""Turning legacy ``run`` arguments into a v2 request and a v2 response into legacy results.

Pure functions over a :class:`ModelSpec` (read once from the model configuration), so the
argument mapping and the result shaping are tested without a server.

Legacy inputs are lists of per-sample arrays (one per batch entry); for a model with
``max_batch_size > 0`` they are stacked along a new leading batch dimension, for a model without
batching the single sample is sent as it is. Results come back the same way: one list element per
batch entry.

Unit test: tests/unit/test_legacy_client.py (request plans and result shaping).
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

import numpy as np
import numpy.typing as npt

from pytriton.client.legacy._errors import InferenceServerException
from pytriton.client.legacy._messages import as_int, wire_datatype
from pytriton.client.legacy.shared_memory import SharedMemoryHandle, get_contents_as_numpy


class ResultFormat(enum.IntEnum):
    """How an output is returned: ``RAW`` arrays, or ``(CLASS, k)`` top-k classification tuples."""

    RAW = 1
    CLASS = 2


class InferRequestHeader:
    """The legacy request header's flags, for ``run(..., flags=...)``."""

    class Flag(enum.IntEnum):
        FLAG_NONE = 0
        FLAG_SEQUENCE_START = 1
        FLAG_SEQUENCE_END = 2

    FLAG_NONE = Flag.FLAG_NONE
    FLAG_SEQUENCE_START = Flag.FLAG_SEQUENCE_START
    FLAG_SEQUENCE_END = Flag.FLAG_SEQUENCE_END


_KNOWN_FLAGS = int(InferRequestHeader.FLAG_SEQUENCE_START | InferRequestHeader.FLAG_SEQUENCE_END)


def serialize_string_tensor(input_tensor: object) -> npt.NDArray[np.generic]:
    """The BYTES wire layout of a string tensor: a flat ``uint8`` array of 4-byte little-endian
    lengths each followed by that many bytes, elements in C order. ``str`` elements are UTF-8
    encoded; other objects are written as ``str(obj)``."""
    try:
        array = np.asarray(input_tensor)
    except Exception as error:
        raise InferenceServerException(f"cannot serialize the string tensor: {error}") from error
    if array.dtype.kind not in ("O", "S", "U"):
        raise InferenceServerException(
            f"cannot serialize a {array.dtype} tensor as strings: pass bytes, str or object elements"
        )
    chunks: List[bytes] = []
    for item in array.flatten(order="C"):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        chunks.append(struct.pack("<I", len(data)))
        chunks.append(data)
    serialized: npt.NDArray[np.generic] = np.frombuffer(b"".join(chunks), dtype=np.uint8).copy()
    return serialized


def numpy_dtype(datatype: str) -> Any:
    """The numpy type for a v2 datatype (``np.object_`` for BYTES)."""
    from tritonclient.utils import triton_to_np_dtype

    dtype = triton_to_np_dtype(datatype)
    if dtype is None:
        raise InferenceServerException(f"tensors of type {datatype} are not supported by the legacy client")
    return dtype


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # v2 name: FP32, INT32, BYTES, ...
    dims: Tuple[int, ...]  # without the batch dimension
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What a request needs to know about a model, from its v2 configuration."""

    name: str
    max_batch_size: int
    inputs: Dict[str, TensorSpec]
    outputs: Dict[str, TensorSpec]
    sequence: bool = False  # the model has a sequence batcher: every request needs a correlation id

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelSpec:
        def spec(entry: Mapping[str, Any]) -> TensorSpec:
            return TensorSpec(
                name=str(entry["name"]),
                datatype=wire_datatype(entry.get("data_type", "TYPE_INVALID")),
                dims=tuple(as_int(d) for d in entry.get("dims", [])),
                optional=bool(entry.get("optional", False)),
            )

        return cls(
            name=str(config.get("name", "")),
            max_batch_size=as_int(config.get("max_batch_size")),
            inputs={str(e["name"]): spec(e) for e in config.get("input", [])},
            outputs={str(e["name"]): spec(e) for e in config.get("output", [])},
            sequence=isinstance(config.get("sequence_batching"), Mapping),
        )


@dataclasses.dataclass
class InputPlan:
    name: str
    datatype: str
    shape: List[int]
    data: Optional[npt.NDArray[np.generic]] = None  # the batch, stacked
    shm: Optional[SharedMemoryHandle] = None
    shm_byte_size: int = 0


@dataclasses.dataclass
class OutputPlan:
    name: str
    fmt: ResultFormat
    class_count: int = 0
    shm: Optional[SharedMemoryHandle] = None


@dataclasses.dataclass
class RequestPlan:
    """One request, validated: what goes on the wire and how to shape what comes back."""

    batch_size: int
    batched: bool
    inputs: List[InputPlan]
    outputs: List[OutputPlan]
    sequence_id: int = 0
    sequence_start: bool = False
    sequence_end: bool = False


def _sample_array(model: ModelSpec, spec: TensorSpec, sample: object, index: int) -> npt.NDArray[np.generic]:
    where = f"input '{spec.name}' of model '{model.name}', batch entry {index}"
    if spec.datatype == "BYTES":
        array = np.asarray(sample)
        if array.dtype.kind not in ("O", "S", "U"):
            raise InferenceServerException(f"{where}: expected strings (bytes, str or object), got {array.dtype}")
        array = array.astype(np.object_)
    else:
        target = np.dtype(numpy_dtype(spec.datatype))
        array = np.asarray(sample)
        if array.dtype != target:
            if not np.can_cast(array.dtype, target, casting="safe"):
                raise InferenceServerException(f"{where}: expected {spec.datatype} ({target}), got {array.dtype}")
            array = array.astype(target)
    if all(dim >= 0 for dim in spec.dims):
        expected = int(np.prod(spec.dims, dtype=np.int64))
        if array.size != expected:
            raise InferenceServerException(
                f"{where}: expected {expected} elements (shape {list(spec.dims)}), got {array.size} (shape {list(array.shape)})"
            )
        array = array.reshape(spec.dims)
    return array


def _input_plan(model: ModelSpec, spec: TensorSpec, value: object, batch_size: int, batched: bool) -> InputPlan:
    if isinstance(value, SharedMemoryHandle):
        if any(dim < 0 for dim in spec.dims):
            raise InferenceServerException(
                f"input '{spec.name}' of model '{model.name}' has a variable shape {list(spec.dims)}: "
                "its size cannot be known from a shared memory region, pass arrays instead"
            )
        shape = ([batch_size] if batched else []) + list(spec.dims)
        if spec.datatype == "BYTES":
            byte_size = value.byte_size
        else:
            byte_size = int(np.prod(shape, dtype=np.int64)) * np.dtype(numpy_dtype(spec.datatype)).itemsize
            if byte_size > value.byte_size:
                raise InferenceServerException(
                    f"input '{spec.name}' of model '{model.name}' needs {byte_size} bytes for batch size "
                    f"{batch_size}; shared memory region '{value.triton_shm_name}' has {value.byte_size}"
                )
        return InputPlan(spec.name, spec.datatype, shape, shm=value, shm_byte_size=byte_size)
    if isinstance(value, np.ndarray) or not isinstance(value, (list, tuple)):
        raise InferenceServerException(
            f"input '{spec.name}': pass a list of {batch_size} per-sample numpy array(s) "
            f"(one per batch entry), not a {type(value).__name__}"
        )
    if len(value) != batch_size:
        raise InferenceServerException(
            f"input '{spec.name}' of model '{model.name}': {len(value)} value(s) for batch size {batch_size}"
        )
    samples = [_sample_array(model, spec, sample, index) for index, sample in enumerate(value)]
    if any(sample.shape != samples[0].shape for sample in samples):
        raise InferenceServerException(
            f"input '{spec.name}' of model '{model.name}': all batch entries must have the same shape, got "
            f"{sorted({tuple(sample.shape) for sample in samples})}"
        )
    data = np.stack(samples) if batched else samples[0]
    return InputPlan(spec.name, spec.datatype, list(data.shape), data=data)


def _output_plan(model: ModelSpec, name: str, fmt: object) -> OutputPlan:
    if name not in model.outputs:
        raise InferenceServerException(
            f"unknown output '{name}' for model '{model.name}': it has {sorted(model.outputs)}"
        )
    if isinstance(fmt, tuple) and len(fmt) == 2 and fmt[0] == ResultFormat.CLASS:
        count = fmt[1]
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise InferenceServerException(
                f"output '{name}': (ResultFormat.CLASS, k) needs a positive integer k, got {count!r}"
            )
        return OutputPlan(name, ResultFormat.CLASS, class_count=int(count))
    if isinstance(fmt, tuple) and len(fmt) == 2 and fmt[0] == ResultFormat.RAW:
        if not isinstance(fmt[1], SharedMemoryHandle):
            raise InferenceServerException(
                f"output '{name}': (ResultFormat.RAW, x) needs a shared memory handle as x, got {type(fmt[1]).__name__}"
            )
        return OutputPlan(name, ResultFormat.RAW, shm=fmt[1])
    if not isinstance(fmt, tuple) and fmt == ResultFormat.RAW:
        return OutputPlan(name, ResultFormat.RAW)
    raise InferenceServerException(
        f"output '{name}': the format must be ResultFormat.RAW, (ResultFormat.RAW, shm_handle) or "
        f"(ResultFormat.CLASS, k), got {fmt!r}"
    )


def plan_request(
    model: ModelSpec, inputs: object, outputs: object, batch_size: int, flags: int, correlation_id: int
) -> RequestPlan:
    """Validate ``run`` arguments against the model; every problem is an InferenceServerException."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise InferenceServerException(f"batch_size must be a positive integer, got {batch_size!r}")
    batch_size = int(batch_size)
    batched = model.max_batch_size > 0
    if not batched and batch_size != 1:
        raise InferenceServerException(
            f"model '{model.name}' does not support batching: batch_size must be 1, got {batch_size}"
        )
    if batched and batch_size > model.max_batch_size:
        raise InferenceServerException(
            f"batch_size {batch_size} exceeds the max_batch_size {model.max_batch_size} of model '{model.name}'"
        )
    if not isinstance(inputs, Mapping):
        raise InferenceServerException(f"inputs must be a dict from input name to values, got {type(inputs).__name__}")
    if not isinstance(outputs, Mapping):
        raise InferenceServerException(
            f"outputs must be a dict from output name to format, got {type(outputs).__name__}"
        )
    unknown = sorted(set(inputs) - set(model.inputs))
    if unknown:
        raise InferenceServerException(
            f"unknown input(s) {unknown} for model '{model.name}': it has {sorted(model.inputs)}"
        )
    missing: Set[str] = {name for name, spec in model.inputs.items() if not spec.optional} - set(inputs)
    if missing:
        raise InferenceServerException(
            f"model '{model.name}' expects {len(model.inputs)} input(s), got {len(inputs)}: missing {sorted(missing)}"
        )
    flags = int(flags or 0)
    if flags & ~_KNOWN_FLAGS:
        raise InferenceServerException(
            f"unknown flag bits {flags & ~_KNOWN_FLAGS:#x}: use InferRequestHeader.FLAG_* values"
        )
    start = bool(flags & InferRequestHeader.FLAG_SEQUENCE_START)
    end = bool(flags & InferRequestHeader.FLAG_SEQUENCE_END)
    if (start or end) and not correlation_id:
        raise InferenceServerException("sequence start/end flags need a non-zero correlation id")
    if model.sequence and not correlation_id:
        # Checked here rather than left to the server: over a gRPC stream, Triton 2.51 keeps a stream
        # whose request it refused for this reason open at shutdown, delaying exit by its exit timeout.
        raise InferenceServerException(
            f"model '{model.name}' is a sequence model: its requests need a non-zero correlation id "
            "(InferContext(correlation_id=...) or run(..., corr_id=...))"
        )
    return RequestPlan(
        batch_size=batch_size,
        batched=batched,
        inputs=[_input_plan(model, model.inputs[name], value, batch_size, batched) for name, value in inputs.items()],
        outputs=[_output_plan(model, name, fmt) for name, fmt in outputs.items()],
        sequence_id=int(correlation_id or 0),
        sequence_start=start,
        sequence_end=end,
    )


def tritonclient_objects(plan: RequestPlan, grpc: bool) -> Tuple[List[Any], List[Any]]:
    """The tritonclient ``InferInput`` and ``InferRequestedOutput`` objects of a plan."""
    if grpc:
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module  # type: ignore[no-redef]
    infer_inputs = []
    for entry in plan.inputs:
        infer_input = module.InferInput(entry.name, entry.shape, entry.datatype)
        if entry.shm is not None:
            infer_input.set_shared_memory(entry.shm.triton_shm_name, entry.shm_byte_size)
        else:
            infer_input.set_data_from_numpy(entry.data)
        infer_inputs.append(infer_input)
    requested = []
    for out in plan.outputs:
        requested_output = module.InferRequestedOutput(out.name, class_count=out.class_count)
        if out.shm is not None:
            requested_output.set_shared_memory(out.shm.triton_shm_name, out.shm.byte_size)
        requested.append(requested_output)
    return infer_inputs, requested


def parse_class_entry(entry: object) -> Tuple[int, float, str]:
    """``b"value:index[:label]"`` from the classification extension as ``(index, value, label)``."""
    text = entry.decode("utf-8") if isinstance(entry, bytes) else str(entry)
    parts = text.split(":", 2)
    if len(parts) < 2:
        raise InferenceServerException(f"unexpected classification result {text!r}")
    return int(parts[1]), float(parts[0]), parts[2] if len(parts) == 3 else ""


def _output_meta(result: Any, name: str, grpc: bool) -> Tuple[str, List[int]]:
    meta = result.get_output(name)
    if meta is None:
        raise InferenceServerException(f"the response has no output '{name}'")
    if grpc:  # a protobuf message (tritonclient's as_json=True returns None for outputs)
        return str(meta.datatype), [int(dim) for dim in meta.shape]
    return str(meta["datatype"]), [as_int(dim) for dim in meta.get("shape", [])]


def shape_results(plan: RequestPlan, result: Any, grpc: bool) -> Dict[str, List[Any]]:
    """Per-sample results: ``{output: [one value per batch entry]}``."""
    shaped: Dict[str, List[object]] = {}
    for out in plan.outputs:
        if out.shm is not None:
            datatype, shape = _output_meta(result, out.name, grpc)
            array = get_contents_as_numpy(out.shm, numpy_dtype(datatype), shape)
        else:
            array = result.as_numpy(out.name)
            if array is None:
                raise InferenceServerException(f"the response has no output '{out.name}'")
        samples = list(array) if plan.batched else [array]
        if len(samples) != plan.batch_size:
            raise InferenceServerException(
                f"output '{out.name}' has {len(samples)} batch entries, expected {plan.batch_size}"
            )
        if out.fmt is ResultFormat.CLASS:
            shaped[out.name] = [[parse_class_entry(entry) for entry in np.ravel(sample)] for sample in samples]
        else:
            shaped[out.name] = samples
    return shaped
