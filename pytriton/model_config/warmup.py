"""Checking ``ModelConfig.model_warmup`` against a model's inputs and turning it into Triton's config.

Triton runs the warmup itself while it loads the model (its ``model_warmup`` config section): each
instance gets the requests through the proxy like any other batch, so the bound callable, with its
decorators, runs them before the model reports ready. A warmup that fails makes the load fail.

Two kinds of warmup that NVIDIA PyTriton 0.7 accepts cannot be written as Triton's section: data for
only some of the inputs (Triton refuses a request without every required input), and a ``.npy``
file holding a whole batch (Triton gives every request of the batch the same sample). A model with
such a warmup gets its warmups as ready-made batches instead (:attr:`ResolvedWarmup.direct`), which
pytriton hands to each bound callable itself just before Triton loads the model, as the reference
does; they reach the callables, not Triton's instances. A failure still fails the load.

Unit tests: tests/unit/test_api_drift.py (generated warmup sections, refused warmups),
tests/unit/test_binding.py (warmup data files).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config.common import ModelWarmup, WarmupInput
from pytriton.model_config.dtypes import normalize_dtype, triton_type
from pytriton.model_config.triton_model_config import TensorSpec

# Triton reads a warmup's input_data_file from this directory of the model's repository folder.
WARMUP_DIR = "warmup"


@dataclasses.dataclass
class ResolvedWarmup:
    """Either Triton's ``model_warmup`` section with its data files, or batches pytriton sends itself.

    ``entries`` (protobuf JSON form) and ``files`` are empty when ``direct`` holds the warmup:
    ``(warmup name, {input name: batch})`` per request, ``count`` times each, in order.
    """

    entries: List[Dict[str, object]]
    files: Dict[str, bytes]  # file name under <model>/warmup/ -> content
    direct: List[Tuple[str, Dict[str, npt.NDArray[np.generic]]]] = dataclasses.field(default_factory=list)


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PyTritonBadParameterError(f"{what} must be an int >= 1, got {value!r}.")
    return int(value)


def _load_npy(
    file: pathlib.Path, dtype: type, shape: Sequence[int], batch_size: int, what: str
) -> npt.NDArray[np.generic]:
    """A ``.npy`` file's samples as ``(n, *shape)``: n is 1 (one sample) or ``batch_size`` (a whole batch)."""
    try:
        array = np.load(file, allow_pickle=False)
    except ValueError as exc:
        raise PyTritonBadParameterError(f"{what}: cannot read {str(file)!r} as a .npy file: {exc}") from None
    sample = math.prod(shape)
    if array.size == sample:
        samples = 1
    elif array.size == sample * batch_size:
        samples = batch_size
    else:
        raise PyTritonBadParameterError(
            f"{what}: {str(file)!r} holds {array.size} elements; one sample of shape {tuple(shape)} needs "
            f"{sample}, a batch of {batch_size} needs {sample * batch_size}."
        )
    if dtype is np.bytes_:
        items = [item if isinstance(item, bytes) else str(item).encode() for item in array.reshape(-1).tolist()]
        return np.array(items, dtype=object).reshape((samples, *shape))
    if not np.can_cast(array.dtype, dtype, "same_kind"):
        raise PyTritonBadParameterError(f"{what}: {str(file)!r} holds {array.dtype}, the input is {np.dtype(dtype)}.")
    return np.ascontiguousarray(array, dtype=dtype).reshape((samples, *shape))


def _triton_bytes(sample: npt.NDArray[np.generic], dtype: type) -> bytes:
    """One sample in the layout Triton reads a warmup file in (little-endian; BYTES length-prefixed)."""
    if dtype is np.bytes_:
        return b"".join(len(item).to_bytes(4, "little") + item for item in sample.reshape(-1).tolist())
    return np.ascontiguousarray(sample.reshape(-1), dtype=np.dtype(dtype).newbyteorder("<")).tobytes()


def _generated(warmup_input: WarmupInput, dtype: type, shape: Sequence[int], rows: int) -> npt.NDArray[np.generic]:
    """``zero_data`` or ``random_data`` as ``(rows, *shape)``, for a warmup pytriton sends itself."""
    full = (rows, *shape)
    if dtype is np.bytes_:
        if warmup_input.zero_data:
            return np.full(full, b"", dtype=object)
        rng = np.random.default_rng()
        letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)
        items = [bytes(rng.choice(letters, size=int(rng.integers(8, 33)))) for _ in range(math.prod(full))]
        return np.array(items, dtype=object).reshape(full)
    if warmup_input.zero_data:
        return np.zeros(full, dtype=dtype)
    rng = np.random.default_rng()
    kind = np.dtype(dtype).kind
    if kind == "b":
        return rng.integers(0, 2, size=full).astype(bool)
    if kind in "iu":
        return rng.integers(0, min(100, int(np.iinfo(dtype).max)), size=full, dtype=dtype, endpoint=True)
    return rng.random(size=full).astype(dtype)


@dataclasses.dataclass
class _CheckedInput:
    """One warmup input, checked: its dtype and shape, and the file's samples if it names a ``.npy`` file."""

    source: WarmupInput
    dtype: type
    shape: Tuple[int, ...]
    samples: Optional[npt.NDArray[np.generic]] = None  # (1 or batch_size, *shape), from a .npy file
    raw: Optional[bytes] = None  # a raw file, passed to Triton as it is

    @property
    def whole_batch(self) -> bool:
        """True for a file holding more than one sample: only pytriton can send it (module docstring)."""
        return self.samples is not None and len(self.samples) > 1


def _check_input(warmup_input: object, spec: TensorSpec, batch_size: int, what: str) -> _CheckedInput:
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
    checked = _CheckedInput(warmup_input, dtype, shape)
    if warmup_input.input_data_file is not None:
        file = pathlib.Path(warmup_input.input_data_file).expanduser()
        if not file.is_file():
            raise PyTritonBadParameterError(f"{what}: input_data_file {str(file)!r} does not exist.")
        if file.suffix.lower() == ".npy":
            checked.samples = _load_npy(file, dtype, shape, batch_size, what)
        else:
            checked.raw = file.read_bytes()
    return checked


def _triton_entry(checked: _CheckedInput, file_name: str, files: Dict[str, bytes]) -> Mapping[str, object]:
    """The input's entry of Triton's ``model_warmup`` section (its data file added to ``files``)."""
    data_type = "TYPE_STRING" if checked.dtype is np.bytes_ else "TYPE_" + triton_type(checked.dtype)
    entry: Dict[str, object] = {"data_type": data_type, "dims": list(checked.shape)}
    if checked.source.zero_data:
        entry["zero_data"] = True
    elif checked.source.random_data:
        entry["random_data"] = True
    else:
        samples = checked.samples
        files[file_name] = _triton_bytes(samples[0], checked.dtype) if samples is not None else checked.raw or b""
        entry["input_data_file"] = file_name
    return entry


def _direct_batch(checked: _CheckedInput, batch_size: int, batching: bool, what: str) -> npt.NDArray[np.generic]:
    """The input's batch for a warmup pytriton sends itself (no batch axis for a model without batching)."""
    if checked.raw is not None:
        raise PyTritonBadParameterError(
            f"{what}: this warmup cannot run inside Triton (it has data for only some inputs, or a file with "
            "a whole batch), and then its files must be .npy files: save the data with numpy.save."
        )
    if checked.samples is not None:
        batch = checked.samples if len(checked.samples) == batch_size else np.repeat(checked.samples, batch_size, 0)
    else:
        batch = _generated(checked.source, checked.dtype, checked.shape, batch_size)
    return batch if batching else batch[0]


def resolve_warmup(
    warmups: Optional[Sequence[ModelWarmup]], inputs: Sequence[TensorSpec], max_batch_size: int, model: str
) -> Optional[ResolvedWarmup]:
    """Check ``warmups`` against the model's inputs; None when there is no warmup.

    ``max_batch_size``: 0 for a model without batching. Raises ``PyTritonBadParameterError``
    naming the warmup and the input for anything that cannot run. When every warmup has data for
    every required input and one-sample files, Triton runs them (``entries``); otherwise all of the
    model's warmups, in order, become ``direct`` batches (module docstring).
    """
    if not warmups:
        return None
    if not isinstance(warmups, (list, tuple)):
        raise PyTritonBadParameterError(f"Model {model!r}: model_warmup must be a list of ModelWarmup.")
    specs = {spec.name: spec for spec in inputs}
    parsed: List[Tuple[str, int, int, Dict[str, _CheckedInput], bool]] = []  # name, batch, count, inputs, partial
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
        checked = {
            name: _check_input(warmup_input, specs[name], batch_size, f"{label}, input {name!r}")
            for name, warmup_input in warmup.inputs.items()
        }
        missing = [name for name, spec in specs.items() if not spec.optional and name not in checked]
        if not checked:
            raise PyTritonBadParameterError(f"{label}: inputs is empty; give data for at least one input.")
        parsed.append((warmup.name, batch_size, count, checked, bool(missing)))
    if not any(partial or any(c.whole_batch for c in warmup_inputs.values()) for *_, warmup_inputs, partial in parsed):
        entries: List[Dict[str, object]] = []
        files: Dict[str, bytes] = {}
        for index, (name, batch_size, count, warmup_inputs, _) in enumerate(parsed):
            input_entries = {
                input_name: _triton_entry(checked_input, f"w{index}-i{position}.bin", files)
                for position, (input_name, checked_input) in enumerate(warmup_inputs.items())
            }
            entries.append({"name": name, "batch_size": batch_size, "count": count, "inputs": input_entries})
        return ResolvedWarmup(entries=entries, files=files)
    direct: List[Tuple[str, Dict[str, npt.NDArray[np.generic]]]] = []
    for name, batch_size, count, warmup_inputs, _ in parsed:
        for _ in range(count):  # random data differs between the repetitions, as in Triton's warmup
            batch = {
                input_name: _direct_batch(
                    checked_input, batch_size, max_batch_size > 0, f"Model {model!r}: warmup {name!r}"
                )
                for input_name, checked_input in warmup_inputs.items()
            }
            direct.append((name, batch))
    return ResolvedWarmup(entries=[], files={}, direct=direct)
