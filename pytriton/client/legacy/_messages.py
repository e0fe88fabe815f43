"""Plain objects with the field names of the legacy status, config and shared-memory messages.

The legacy client returned protobuf messages of Triton's v1 protocol (``ServerStatus``,
``ModelConfig``, ``ModelRepositoryIndex``, ``SharedMemoryStatus``). Those messages no longer
exist on any server, so these dataclasses carry the same structure and field names, filled from
the KServe v2 answers (JSON over HTTP, or gRPC answers turned into JSON, where 64-bit integers
arrive as strings and zero fields are left out: every reader here tolerates both).

Unit test: tests/unit/test_legacy_client.py (status messages, ``ModelConfig``).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar, Dict, List, Mapping, Optional, Union


class DataType(enum.IntEnum):
    """Tensor data types of the model configuration (v1 numbering)."""

    TYPE_INVALID = 0
    TYPE_BOOL = 1
    TYPE_UINT8 = 2
    TYPE_UINT16 = 3
    TYPE_UINT32 = 4
    TYPE_UINT64 = 5
    TYPE_INT8 = 6
    TYPE_INT16 = 7
    TYPE_INT32 = 8
    TYPE_INT64 = 9
    TYPE_FP16 = 10
    TYPE_FP32 = 11
    TYPE_FP64 = 12
    TYPE_STRING = 13
    TYPE_BF16 = 14


class ServerReadyState(enum.IntEnum):
    SERVER_INVALID = 0
    SERVER_INITIALIZING = 1
    SERVER_READY = 2
    SERVER_EXITING = 3
    SERVER_FAILED_TO_INITIALIZE = 10


class ModelReadyState(enum.IntEnum):
    MODEL_UNKNOWN = 0
    MODEL_READY = 1
    MODEL_UNAVAILABLE = 2
    MODEL_LOADING = 3
    MODEL_UNLOADING = 4


_V2_STATES = {
    "READY": ModelReadyState.MODEL_READY,
    "UNAVAILABLE": ModelReadyState.MODEL_UNAVAILABLE,
    "LOADING": ModelReadyState.MODEL_LOADING,
    "UNLOADING": ModelReadyState.MODEL_UNLOADING,
}


def model_ready_state(v2_state: Optional[str]) -> ModelReadyState:
    """A v2 repository-index state string as the legacy enum (unknown strings are MODEL_UNKNOWN)."""
    return _V2_STATES.get((v2_state or "").upper(), ModelReadyState.MODEL_UNKNOWN)


def as_int(value: Union[str, int, float, None], default: int = 0) -> int:
    """An integer from JSON that may carry it as a number or (gRPC int64) as a string."""
    if value is None or value == "":
        return default
    return int(value)


def data_type(value: object) -> DataType:
    """``"TYPE_FP32"`` (or an enum number) as :class:`DataType`; unknown names are TYPE_INVALID."""
    if isinstance(value, int):
        return DataType(value)
    try:
        return DataType[str(value)]
    except KeyError:
        return DataType.TYPE_INVALID


def wire_datatype(config_type: object) -> str:
    """The v2 tensor datatype (``"FP32"``, ``"BYTES"``) of a model-config data type."""
    name = data_type(config_type).name
    return "BYTES" if name == "TYPE_STRING" else name[len("TYPE_") :]


class Message:
    """A read-only attribute view of a JSON object (nested objects and lists are converted too)."""

    def __init__(self, fields: Mapping[str, object]) -> None:
        for key, value in fields.items():
            object.__setattr__(self, key, _wrap(value))

    def __repr__(self) -> str:
        body = ", ".join(f"{key}={value!r}" for key, value in vars(self).items())
        return f"Message({body})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and vars(self) == vars(other)

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("status messages are read-only")


def _wrap(value: object) -> Any:
    if isinstance(value, Mapping):
        return Message(value)
    if isinstance(value, list):
        return [_wrap(item) for item in value]
    return value


def _optional_message(config: Mapping[str, object], key: str) -> Optional[Message]:
    value = config.get(key)
    return Message(value) if isinstance(value, Mapping) else None


@dataclasses.dataclass
class ModelInput:
    FORMAT_NONE: ClassVar[int] = 0
    FORMAT_NHWC: ClassVar[int] = 1
    FORMAT_NCHW: ClassVar[int] = 2

    name: str
    data_type: DataType
    format: int = 0
    dims: List[int] = dataclasses.field(default_factory=list)
    reshape: Optional[Message] = None
    is_shape_tensor: bool = False
    optional: bool = False

    @classmethod
    def from_v2(cls, entry: Mapping[str, Any]) -> ModelInput:
        formats = {"FORMAT_NONE": 0, "FORMAT_NHWC": 1, "FORMAT_NCHW": 2}
        fmt = entry.get("format", "FORMAT_NONE")
        return cls(
            name=str(entry.get("name", "")),
            data_type=data_type(entry.get("data_type", "TYPE_INVALID")),
            format=fmt if isinstance(fmt, int) else formats.get(str(fmt), 0),
            dims=[as_int(d) for d in entry.get("dims", [])],
            reshape=_optional_message(entry, "reshape"),
            is_shape_tensor=bool(entry.get("is_shape_tensor", False)),
            optional=bool(entry.get("optional", False)),
        )


@dataclasses.dataclass
class ModelOutput:
    name: str
    data_type: DataType
    dims: List[int] = dataclasses.field(default_factory=list)
    label_filename: str = ""
    reshape: Optional[Message] = None
    is_shape_tensor: bool = False

    @classmethod
    def from_v2(cls, entry: Mapping[str, Any]) -> ModelOutput:
        return cls(
            name=str(entry.get("name", "")),
            data_type=data_type(entry.get("data_type", "TYPE_INVALID")),
            dims=[as_int(d) for d in entry.get("dims", [])],
            label_filename=str(entry.get("label_filename", "")),
            reshape=_optional_message(entry, "reshape"),
            is_shape_tensor=bool(entry.get("is_shape_tensor", False)),
        )


@dataclasses.dataclass
class ModelConfig:
    """The model configuration, with the v1 field names; sections v1 had as sub-messages are
    :class:`Message` objects (None when the model has no such section)."""

    name: str = ""
    platform: str = ""
    backend: str = ""
    max_batch_size: int = 0
    input: List[ModelInput] = dataclasses.field(default_factory=list)
    output: List[ModelOutput] = dataclasses.field(default_factory=list)
    version_policy: Optional[Message] = None
    instance_group: List[Message] = dataclasses.field(default_factory=list)
    default_model_filename: str = ""
    dynamic_batching: Optional[Message] = None
    sequence_batching: Optional[Message] = None
    parameters: Mapping[str, object] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_v2(cls, config: Mapping[str, Any]) -> ModelConfig:
        parameters = config.get("parameters") or {}
        return cls(
            name=str(config.get("name", "")),
            platform=str(config.get("platform", "")),
            backend=str(config.get("backend", "")),
            max_batch_size=as_int(config.get("max_batch_size")),
            input=[ModelInput.from_v2(entry) for entry in config.get("input", [])],
            output=[ModelOutput.from_v2(entry) for entry in config.get("output", [])],
            version_policy=_optional_message(config, "version_policy"),
            instance_group=[Message(group) for group in config.get("instance_group", [])],
            default_model_filename=str(config.get("default_model_filename", "")),
            dynamic_batching=_optional_message(config, "dynamic_batching"),
            sequence_batching=_optional_message(config, "sequence_batching"),
            parameters={key: _wrap(value) for key, value in parameters.items()},
        )


@dataclasses.dataclass
class StatDuration:
    count: int = 0
    total_time_ns: int = 0


@dataclasses.dataclass
class InferRequestStats:
    success: StatDuration = dataclasses.field(default_factory=StatDuration)
    failed: StatDuration = dataclasses.field(default_factory=StatDuration)
    compute: StatDuration = dataclasses.field(default_factory=StatDuration)
    queue: StatDuration = dataclasses.field(default_factory=StatDuration)


@dataclasses.dataclass
class ModelVersionStatus:
    ready_state: ModelReadyState = ModelReadyState.MODEL_UNKNOWN
    infer_stats: Dict[int, InferRequestStats] = dataclasses.field(default_factory=dict)
    model_execution_count: int = 0
    model_inference_count: int = 0
    last_inference_timestamp_milliseconds: int = 0


@dataclasses.dataclass
class ModelStatus:
    config: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    version_status: Dict[int, ModelVersionStatus] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ServerStatus:
    id: str = ""
    version: str = ""
    ready_state: ServerReadyState = ServerReadyState.SERVER_INVALID
    uptime_ns: int = 0
    model_status: Dict[str, ModelStatus] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ModelEntry:
    name: str


@dataclasses.dataclass
class ModelRepositoryIndex:
    models: List[ModelEntry] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SystemSharedMemory:
    shared_memory_key: str = ""
    offset: int = 0


@dataclasses.dataclass
class SharedMemoryRegion:
    name: str = ""
    system_shared_memory: SystemSharedMemory = dataclasses.field(default_factory=SystemSharedMemory)
    byte_size: int = 0


@dataclasses.dataclass
class SharedMemoryStatus:
    shared_memory_region: List[SharedMemoryRegion] = dataclasses.field(default_factory=list)


def _duration(stats: Mapping[str, Any], *keys: str) -> StatDuration:
    parts = [stats.get(key) or {} for key in keys]
    count = max((as_int(part.get("count")) for part in parts), default=0)
    return StatDuration(count=count, total_time_ns=sum(as_int(part.get("ns")) for part in parts))


def version_status(ready: ModelReadyState, stats: Optional[Mapping[str, Any]]) -> ModelVersionStatus:
    """One version's legacy status from its v2 statistics entry (None: the model is not loaded).

    v1 kept request statistics per batch size; v2 keeps compute time per batch size and success,
    failure and queue time only per model. So each ``infer_stats[batch_size]`` gets the v2 compute
    count and time as ``success`` and ``compute``, and ``failed``/``queue`` stay zero there.
    """
    status = ModelVersionStatus(ready_state=ready)
    if not stats:
        return status
    status.model_execution_count = as_int(stats.get("execution_count"))
    status.model_inference_count = as_int(stats.get("inference_count"))
    status.last_inference_timestamp_milliseconds = as_int(stats.get("last_inference"))
    for batch in stats.get("batch_stats", []):
        compute = _duration(batch, "compute_input", "compute_infer", "compute_output")
        status.infer_stats[as_int(batch.get("batch_size"))] = InferRequestStats(
            success=dataclasses.replace(compute), compute=dataclasses.replace(compute)
        )
    return status
