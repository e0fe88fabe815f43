"""Checking ``ModelConfig.model_warmup`` against a model's inputs and turning it into Triton's config.

Triton runs the warmup itself while it loads the model (its ``model_warmup`` config section): each
instance gets the requests through the proxy like any other batch, so the bound callable, with its
decorators, runs them before the model reports ready. A warmup that fails makes the load fail.

Unit tests: tests/unit/test_api_drift.py (generated warmup sections, refused warmups),
tests/unit/test_binding.py (warmup data files).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config.common import ModelWarmup, WarmupInput
from pytriton.model_config.dtypes import normalize_dtype, triton_type
from pytriton.model_config.triton_model_config import TensorSpec

# Triton reads a warmup's input_data_file from this directory of the model's repository folder.
WARMUP_DIR = "warmup"


@dataclasses.dataclass
class ResolvedWarmup:
    """The ``model_warmup`` config section (protobuf JSON form) and the data files it names."""

    entries: List[Dict[str, Any]]
    files: Dict[str, bytes]  # file name under <model>/warmup/ -> content


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PyTritonBadParameterError(f"{what} must be an int >= 1, got {value!r}.")
    return int(value)


def _file_content(path: Any, dtype: type, shape: Sequence[int], what: str) -> bytes:
    """The bytes Triton expects for one sample, from a ``.npy`` file or a raw file."""
    file = pathlib.Path(path).expanduser()
    if not file.is_file():
        raise PyTritonBadParameterError(f"{what}: input_data_file {str(file)!r} does not exist.")
    if file.suffix.lower() != ".npy":
        return file.read_bytes()
    try:
        array = np.load(file, allow_pickle=False)
    except ValueError as exc:
        raise PyTritonBadParameterError(f"{what}: cannot read {str(file)!r} as a .npy file: {exc}") from None
    if array.size != math.prod(shape):
        raise PyTritonBadParameterError(
            f"{what}: {str(file)!r} holds {array.size} elements, one sample of shape {tuple(shape)} needs "
            f"{math.prod(shape)}."
        )
    if dtype is np.bytes_:
        items = [item if isinstance(item, bytes) else str(item).encode() for item in array.reshape(-1).tolist()]
        return b"".join(len(item).to_bytes(4, "little") + item for item in items)
    if not np.can_cast(array.dtype, dtype, "same_kind"):
        raise PyTritonBadParameterError(f"{what}: {str(file)!r} holds {array.dtype}, the input is {np.dtype(dtype)}.")
    return np.ascontiguousarray(array.reshape(-1), dtype=np.dtype(dtype).newbyteorder("<")).tobytes()


def _input_entry(
    warmup_input: Any, spec: TensorSpec, what: str, file_name: str, files: Dict[str, bytes]
) -> Dict[str, Any]:
    if not isinstance(warmup_input, WarmupInput):
        raise PyTritonBadParameterError(f"{what}: expected a WarmupInput, got {type(warmup_input).__name__}.")
    dtype = normalize_dtype(warmup_input.dtype, what=what)
    if dtype is not spec.dtype:
        declared = "bytes" if spec.dtype is np.bytes_ else str(np.dtype(spec.dtype))
        given = "bytes" if dtype is np.bytes_ else str(np.dtype(dtype))
        raise PyTritonBadParameterError(f"{what}: dtype {given} differs from the input's declared {declared}.")
    try:
        shape = tuple(int(dim) for dim in warmup_input.shape)
    except (TypeError, ValueError):
        raise PyTritonBadParameterError(f"{what}: shape {warmup_input.shape!r} must be a sequence of ints.") from None
    if (
        len(shape) != len(spec.shape)
        or any(dim < 1 for dim in shape)
        or any(want not in (-1, got) for want, got in zip(spec.shape, shape))
    ):
        raise PyTritonBadParameterError(
            f"{what}: shape {shape} does not fit the input's declared shape {spec.shape} "
            "(one sample, without the batch axis; concrete sizes >= 1)."
        )
    sources = [bool(warmup_input.zero_data), bool(warmup_input.random_data), warmup_input.input_data_file is not None]
    if sum(sources) != 1:
        raise PyTritonBadParameterError(
            f"{what}: set exactly one of zero_data=True, random_data=True or input_data_file=..."
        )
    data_type = "TYPE_STRING" if dtype is np.bytes_ else "TYPE_" + triton_type(dtype)
    entry: Dict[str, Any] = {"data_type": data_type, "dims": list(shape)}
    if warmup_input.zero_data:
        entry["zero_data"] = True
    elif warmup_input.random_data:
        entry["random_data"] = True
    else:
        files[file_name] = _file_content(warmup_input.input_data_file, dtype, shape, what)
        entry["input_data_file"] = file_name
    return entry


def resolve_warmup(
    warmups: Optional[Sequence[ModelWarmup]], inputs: Sequence[TensorSpec], max_batch_size: int, model: str
) -> Optional[ResolvedWarmup]:
    """Check ``warmups`` against the model's inputs; None when there is no warmup.

    ``max_batch_size``: 0 for a model without batching. Raises ``PyTritonBadParameterError``
    naming the warmup and the input for anything Triton would refuse or run wrongly.
    """
    if not warmups:
        return None
    if not isinstance(warmups, (list, tuple)):
        raise PyTritonBadParameterError(f"Model {model!r}: model_warmup must be a list of ModelWarmup.")
    specs = {spec.name: spec for spec in inputs}
    entries: List[Dict[str, Any]] = []
    files: Dict[str, bytes] = {}
    for index, warmup in enumerate(warmups):
        if not isinstance(warmup, ModelWarmup):
            raise PyTritonBadParameterError(
                f"Model {model!r}: model_warmup[{index}] must be a ModelWarmup, got {type(warmup).__name__}."
            )
        label = f"Model {model!r}: warmup {warmup.name!r}"
        if not isinstance(warmup.name, str) or not warmup.name:
            raise PyTritonBadParameterError(f"Model {model!r}: model_warmup[{index}] needs a non-empty name.")
        batch_size = _positive_int(warmup.batch_size, f"{label}: batch_size")
        if batch_size > max(1, max_batch_size):
            raise PyTritonBadParameterError(
                f"{label}: batch_size {batch_size} exceeds the model's max_batch_size {max(1, max_batch_size)}."
            )
        count = _positive_int(warmup.count, f"{label}: count")
        if not isinstance(warmup.inputs, dict):
            raise PyTritonBadParameterError(f"{label}: inputs must be a dict from input name to WarmupInput.")
        unknown = sorted(set(warmup.inputs) - set(specs), key=str)
        if unknown:
            raise PyTritonBadParameterError(f"{label}: {unknown} are not inputs of the model ({sorted(specs)}).")
        missing = sorted(name for name, spec in specs.items() if not spec.optional and name not in warmup.inputs)
        if missing:
            raise PyTritonBadParameterError(f"{label}: no data for the required input(s) {missing}.")
        input_entries = {}
        for position, (name, warmup_input) in enumerate(warmup.inputs.items()):
            file_name = f"w{index}-i{position}.bin"
            input_entries[name] = _input_entry(warmup_input, specs[name], f"{label}, input {name!r}", file_name, files)
        entries.append({"name": warmup.name, "batch_size": batch_size, "count": count, "inputs": input_entries})
    return ResolvedWarmup(entries=entries, files=files)
