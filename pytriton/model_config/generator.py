"""Triton model configuration: generate it (JSON dict, ``config.pbtxt``) and parse it back.

Unit test: tests/unit/test_model_config.py (generated configs, dict and pbtxt round trips).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping

from pytriton.exceptions import PyTritonModelConfigError
from pytriton.model_config.common import (
    DeviceKind,
    DynamicBatcher,
    QueuePolicy,
    SequenceBatcher,
    SequenceStrategy,
    TimeoutAction,
)
from pytriton.model_config.dtypes import numpy_type, triton_type
from pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig

# Fields whose string values are protobuf enum names and must not be quoted in text format.
_ENUM_FIELDS = frozenset({"data_type", "kind", "timeout_action"})


def _queue_policy(policy: QueuePolicy) -> Mapping[str, object]:
    return {
        "timeout_action": policy.timeout_action.value,
        "default_timeout_microseconds": int(policy.default_timeout_microseconds),
        "allow_timeout_override": bool(policy.allow_timeout_override),
        "max_queue_size": int(policy.max_queue_size),
    }


def _batcher(batcher: DynamicBatcher) -> Mapping[str, object]:
    result: Dict[str, object] = {
        "max_queue_delay_microseconds": int(batcher.max_queue_delay_microseconds),
        "preserve_ordering": bool(batcher.preserve_ordering),
    }
    if batcher.preferred_batch_size:
        result["preferred_batch_size"] = [int(size) for size in batcher.preferred_batch_size]
    if batcher.priority_levels:
        result["priority_levels"] = int(batcher.priority_levels)
        result["default_priority_level"] = int(batcher.default_priority_level)
    if batcher.default_queue_policy is not None:
        result["default_queue_policy"] = _queue_policy(batcher.default_queue_policy)
    if batcher.priority_queue_policy:
        result["priority_queue_policy"] = {
            str(int(level)): _queue_policy(policy) for level, policy in batcher.priority_queue_policy.items()
        }
    return result


# The control inputs pytriton declares for a sequence model (``SequenceBatcher``). Triton feeds them to
# the stub as extra inputs of every request; the stub turns them into the request's sequence fields
# and never forwards them, so the names cannot clash with the user's (which are checked against them).
SEQUENCE_CONTROLS = {
    "start": "_PYTRITON_SEQUENCE_START",
    "end": "_PYTRITON_SEQUENCE_END",
    "ready": "_PYTRITON_SEQUENCE_READY",
    "corrid": "_PYTRITON_SEQUENCE_ID",
}
_FLAG_KINDS = {"start": "CONTROL_SEQUENCE_START", "end": "CONTROL_SEQUENCE_END", "ready": "CONTROL_SEQUENCE_READY"}


def _sequence_batcher(batcher: SequenceBatcher) -> Mapping[str, object]:
    controls: List[Mapping[str, object]] = [
        # INT32 rather than BOOL: the stub reads inputs through DLPack under numpy 2, which carries int32 for sure.
        {"name": SEQUENCE_CONTROLS[key], "control": [{"kind": kind, "int32_false_true": [0, 1]}]}
        for key, kind in _FLAG_KINDS.items()
    ]
    if not batcher.string_ids:
        # With a TYPE_STRING CORRID control, Triton 2.51 refuses batched requests ("unexpected number of
        # string elements 2 for inference input"): string ids go without the control, which Triton accepts.
        corrid = {"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}
        controls.append({"name": SEQUENCE_CONTROLS["corrid"], "control": [corrid]})
    result: Dict[str, object] = {}
    if batcher.max_sequence_idle_microseconds:
        result["max_sequence_idle_microseconds"] = int(batcher.max_sequence_idle_microseconds)
    result["control_input"] = controls
    if batcher.strategy is SequenceStrategy.OLDEST:
        oldest: Dict[str, object] = {}
        if batcher.max_candidate_sequences:
            oldest["max_candidate_sequences"] = int(batcher.max_candidate_sequences)
        if batcher.preferred_batch_size:
            oldest["preferred_batch_size"] = [int(size) for size in batcher.preferred_batch_size]
        if batcher.max_queue_delay_microseconds:
            oldest["max_queue_delay_microseconds"] = int(batcher.max_queue_delay_microseconds)
        result["oldest"] = oldest
    else:
        result["direct"] = {}
    return result


def _parse_sequence_batcher(raw: Mapping[str, Any]) -> SequenceBatcher:
    oldest = raw.get("oldest")
    corrid = [
        control
        for entry in raw.get("control_input", [])
        for control in entry.get("control", [])
        if control.get("kind") == "CONTROL_SEQUENCE_CORRID"
    ]
    return SequenceBatcher(
        strategy=SequenceStrategy.OLDEST if oldest is not None else SequenceStrategy.DIRECT,
        max_sequence_idle_microseconds=int(raw.get("max_sequence_idle_microseconds", 0)),
        string_ids=not any(control.get("data_type") == "TYPE_UINT64" for control in corrid),
        max_candidate_sequences=int((oldest or {}).get("max_candidate_sequences", 0)),
        max_queue_delay_microseconds=int((oldest or {}).get("max_queue_delay_microseconds", 0)),
        preferred_batch_size=[int(size) for size in (oldest or {}).get("preferred_batch_size", [])] or None,
    )


def _config_type(dtype: object) -> str:
    # The model-config protobuf calls BYTES "TYPE_STRING"; every other name matches.
    name = triton_type(dtype)
    return "TYPE_STRING" if name == "BYTES" else "TYPE_" + name


def _tensor(spec: TensorSpec, is_input: bool) -> Mapping[str, object]:
    entry: Dict[str, object] = {
        "name": spec.name,
        "data_type": _config_type(spec.dtype),
        "dims": list(spec.shape),
    }
    if is_input and spec.optional:
        entry["optional"] = True
    return entry


def to_dict(config: TritonModelConfig) -> Dict[str, Any]:
    """The complete Triton model config as a JSON-compatible dict (protobuf JSON field names)."""
    result: Dict[str, object] = {
        "name": config.model_name,
        "backend": config.backend,
        "max_batch_size": int(config.max_batch_size) if config.batching else 0,
        "input": [_tensor(spec, True) for spec in config.inputs],
        "output": [_tensor(spec, False) for spec in config.outputs],
        "instance_group": [
            {
                "kind": kind.value if kind is not DeviceKind.KIND_AUTO else DeviceKind.KIND_CPU.value,
                "count": count or 1,
            }
            for kind, count in (config.instance_group or {DeviceKind.KIND_CPU: 1}).items()
        ],
    }
    if config.versions:
        result["version_policy"] = {"specific": {"versions": [int(version) for version in config.versions]}}
    if config.sequence_batcher is not None:
        result["sequence_batching"] = _sequence_batcher(config.sequence_batcher)
    elif config.batching and config.batcher is not None:
        result["dynamic_batching"] = _batcher(config.batcher)
    if config.decoupled:
        result["model_transaction_policy"] = {"decoupled": True}
    if config.response_cache:
        result["response_cache"] = {"enable": True}
    if config.model_warmup:
        result["model_warmup"] = config.model_warmup
    if config.backend_parameters:
        result["parameters"] = {key: {"string_value": str(value)} for key, value in config.backend_parameters.items()}
    return result


def _pbtxt_scalar(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if key in _ENUM_FIELDS:
        return str(value)
    return json.dumps(str(value))


def _pbtxt_lines(message: Mapping[str, Any], indent: int) -> List[str]:
    pad = "  " * indent
    lines: List[str] = []
    for key, value in message.items():
        if key in ("parameters", "priority_queue_policy", "inputs"):  # protobuf maps: repeated key/value entries
            for map_key, map_value in value.items():
                key_text = str(int(map_key)) if key == "priority_queue_policy" else json.dumps(map_key)
                lines.append(f"{pad}{key} {{")
                lines.append(f"{pad}  key: {key_text}")
                lines.append(f"{pad}  value {{")
                lines.extend(_pbtxt_lines(map_value, indent + 2))
                lines.append(f"{pad}  }}")
                lines.append(f"{pad}}}")
        elif isinstance(value, Mapping):
            lines.append(f"{pad}{key} {{")
            lines.extend(_pbtxt_lines(value, indent + 1))
            lines.append(f"{pad}}}")
        elif isinstance(value, list) and value and isinstance(value[0], Mapping):
            for item in value:
                lines.append(f"{pad}{key} {{")
                lines.extend(_pbtxt_lines(item, indent + 1))
                lines.append(f"{pad}}}")
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [{', '.join(_pbtxt_scalar(key, item) for item in value)}]")
        else:
            lines.append(f"{pad}{key}: {_pbtxt_scalar(key, value)}")
    return lines


def to_pbtxt(config: TritonModelConfig) -> str:
    """The config in protobuf text format, as Triton reads it from ``config.pbtxt``."""
    return "\n".join(_pbtxt_lines(to_dict(config), 0)) + "\n"


def _parse_policy(raw: Mapping[str, Any]) -> QueuePolicy:
    return QueuePolicy(
        timeout_action=TimeoutAction(raw.get("timeout_action", "REJECT")),
        default_timeout_microseconds=int(raw.get("default_timeout_microseconds", 0)),
        allow_timeout_override=bool(raw.get("allow_timeout_override", False)),
        max_queue_size=int(raw.get("max_queue_size", 0)),
    )


def _parse_tensors(raw: List[Mapping[str, Any]]) -> List[TensorSpec]:
    return [
        TensorSpec(
            name=item["name"],
            shape=tuple(int(dim) for dim in item.get("dims", [])),
            dtype=numpy_type(item.get("data_type", "TYPE_BYTES")),
            optional=bool(item.get("optional", False)),
        )
        for item in raw
    ]


def from_dict(raw: Mapping[str, Any]) -> TritonModelConfig:
    """Parse a config as returned by Triton's model-config endpoint (HTTP JSON or gRPC as dict)."""
    try:
        max_batch_size = int(raw.get("max_batch_size", 0))
        batcher = None
        if "dynamic_batching" in raw:
            dyn = raw["dynamic_batching"]
            batcher = DynamicBatcher(
                max_queue_delay_microseconds=int(dyn.get("max_queue_delay_microseconds", 0)),
                preferred_batch_size=[int(size) for size in dyn.get("preferred_batch_size", [])] or None,
                preserve_ordering=bool(dyn.get("preserve_ordering", False)),
                priority_levels=int(dyn.get("priority_levels", 0)),
                default_priority_level=int(dyn.get("default_priority_level", 0)),
                default_queue_policy=_parse_policy(dyn["default_queue_policy"])
                if "default_queue_policy" in dyn
                else None,
                priority_queue_policy={
                    int(level): _parse_policy(policy) for level, policy in dyn.get("priority_queue_policy", {}).items()
                }
                or None,
            )
        instance_group = {
            DeviceKind(group.get("kind", "KIND_CPU")): int(group.get("count", 1))
            for group in raw.get("instance_group", [])
        }
        parameters = {key: value.get("string_value", "") for key, value in raw.get("parameters", {}).items()}
        return TritonModelConfig(
            model_name=raw["name"],
            max_batch_size=max_batch_size,
            batching=max_batch_size > 0,
            batcher=batcher,
            instance_group=instance_group,
            decoupled=bool(raw.get("model_transaction_policy", {}).get("decoupled", False)),
            backend_parameters=parameters,
            inputs=_parse_tensors(raw.get("input", [])),
            outputs=_parse_tensors(raw.get("output", [])),
            response_cache=bool(raw.get("response_cache", {}).get("enable", False)),
            sequence_batcher=_parse_sequence_batcher(raw["sequence_batching"]) if "sequence_batching" in raw else None,
            backend=raw.get("backend", "") or raw.get("platform", ""),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PyTritonModelConfigError(f"Cannot parse the model configuration: {exc!r}") from None
