"""Checking what an inference callable returned, before anything is written to shared memory.

Every result is checked, with or without ``strict=True`` (docs/configuration.md, "Output checks"):

* the result is a list with one dict per request, whose keys are declared output names;
* every value is a ``numpy.ndarray`` (a numpy scalar is accepted as a 0-d array);
* its dtype is the declared one. A numeric array whose dtype numpy can convert to the declared one
  without loss (``np.can_cast(dtype, declared, "safe")``: ``int32`` to ``int64`` or ``float64``,
  ``float16`` to ``float32``, ``bool`` to any number, a byte-swapped ``>f4`` to ``float32``) is
  converted; anything else (``float64`` for ``float32``, ``int64`` for ``float32``, an object or
  string array for a numeric output, a numeric array for a BYTES output) is an error.
  A BYTES output takes ``bytes``, ``str`` and object arrays (their items are sent as UTF-8 bytes);
* its shape fits the declared one: same number of dimensions (plus the leading batch axis for a
  batching model) and equal sizes wherever the declaration is not ``-1``;
* every output the client asked for (all declared outputs when it named none) is present. A
  streamed chunk of a decoupled model may carry any subset of the outputs: token streams send
  different outputs at different steps, and a stream client reads an absent output as ``None``.

``strict=True`` applies no conversion: the dtype must be exactly the declared one.

The common case (a plain ``ndarray`` of exactly the declared dtype, fitting the declared number of
dimensions) costs a handful of attribute reads; everything else goes through the slow path, which
either converts the array or raises ``PyTritonRuntimeError`` with a message naming the model, the
output and the problem (the client receives that message).
"""

from __future__ import annotations

import itertools
from typing import Callable, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

from pytriton.exceptions import PyTritonRuntimeError
from pytriton.model_config.triton_model_config import TritonModelConfig

_TEXT_KINDS = frozenset("SUO")
_ALL = itertools.repeat(None)  # every request asked for every output (zip stops at the batch's end)


class _Declared:
    """One declared output, pre-digested for the fast path."""

    __slots__ = ("name", "dtype", "is_bytes", "ndim", "fixed", "shape", "offset", "any_size")

    def __init__(self, name: str, dtype: type, shape: Tuple[int, ...], batching: bool):
        self.name = name
        self.is_bytes = dtype is np.bytes_
        self.dtype: Optional[np.dtype[np.generic]] = None if self.is_bytes else np.dtype(dtype)
        offset = 1 if batching else 0
        self.ndim = len(shape) + offset
        self.shape = shape
        self.offset = offset
        # (axis, size) for every dimension the declaration fixes; an empty tuple for the usual all -1.
        self.fixed = tuple((axis + offset, size) for axis, size in enumerate(shape) if size != -1)
        self.any_size = not self.fixed

    def describe(self) -> str:
        return "bytes" if self.is_bytes else str(self.dtype)


class OutputChecker:
    """Validates (and where lossless, converts) a callable's outputs for one model.

    Not thread-safe by design: each worker owns one. Holds no resources.
    """

    def __init__(self, config: TritonModelConfig, strict: bool):
        self._model = config.model_name
        self._batching = config.batching
        self._declared: Dict[str, _Declared] = {
            spec.name: _Declared(spec.name, spec.dtype, tuple(spec.shape), config.batching) for spec in config.outputs
        }
        self._all = len(self._declared)
        self._streamed = config.decoupled
        self._strict = strict

    def check(
        self, result: object, n_requests: int, requested: Optional[Sequence[Optional[List[str]]]] = None
    ) -> List[List[Tuple[str, npt.NDArray[np.generic]]]]:
        """Return the outputs as ``[(name, array), ...]`` per request or raise ``PyTritonRuntimeError``.

        ``requested``: per request, the output names the client asked for (``None``: all). Only
        used for non-streamed results, where every requested output must be present; ``None``
        for the whole argument means every request asked for all outputs.
        """
        model = self._model
        if not isinstance(result, (list, tuple)):
            hint = ""
            if isinstance(result, dict):  # the shape of a @batch callable's result: the decorator is missing
                hint = (
                    " A dict of batched arrays is what a callable decorated with @batch returns: if the function "
                    "takes inputs by name (def infer(x, y)) and returns one dict for the whole batch, add @batch "
                    "(from pytriton.decorators import batch) above it."
                )
            raise PyTritonRuntimeError(
                f"Model {model!r}: the inference callable returned {type(result).__name__}; it must return a list "
                f"with one dict of output arrays per request ({n_requests} here).{hint}"
            )
        if len(result) != n_requests:
            raise PyTritonRuntimeError(
                f"Model {model!r}: the inference callable returned {len(result)} results for {n_requests} requests; "
                "return exactly one dict of outputs per request, in request order."
            )
        groups = []
        declared = self._declared
        strict = self._strict
        complete = self._all if not self._streamed else -1  # a streamed chunk may hold any subset
        for index, outputs in enumerate(result):
            if type(outputs) is not dict and not isinstance(outputs, dict):
                raise PyTritonRuntimeError(
                    f"Model {model!r}: result {index} is {type(outputs).__name__}, expected a dict of output arrays."
                )
            group = []
            for name, value in outputs.items():
                spec = declared.get(name)
                # Fast path: a plain ndarray of exactly the declared dtype (numpy's built-in dtypes
                # are singletons, so ``is`` holds for them) with the declared number of dimensions.
                if (
                    spec is not None
                    and type(value) is np.ndarray
                    and value.dtype is spec.dtype
                    and value.ndim == spec.ndim
                    # all -1, or fully fixed and equal (a mix of both takes the slow path)
                    and (spec.any_size or value.shape[spec.offset :] == spec.shape)
                ):
                    group.append((name, value))
                else:
                    group.append((name, self._check_array(index, name, spec, value, strict)))
            if len(group) != complete and complete >= 0:
                self._check_present(index, outputs, None if requested is None else requested[index])
            groups.append(group)
        return groups

    def single(self) -> Optional[Tuple[str, object, int, int, Tuple[int, ...], bool]]:
        """For a model with exactly one declared output, and a numeric one: ``(name, dtype, ndim,
        offset, shape, any_size)``, what :meth:`check`'s fast path tests; else ``None``.

        The backend kind's short path (``stubside/_inline.py``) runs that test inline on each
        result, and hands anything that fails it to :meth:`check`.
        """
        if len(self._declared) != 1:
            return None
        spec = next(iter(self._declared.values()))
        if spec.is_bytes:
            return None
        return (spec.name, spec.dtype, spec.ndim, spec.offset, spec.shape, spec.any_size)

    def responses(
        self,
        tensor: Callable[[str, npt.NDArray[np.generic]], object],
        response: Callable[[List[object]], object],
        result: object,
        n_requests: int,
        requested: Optional[Sequence[Optional[Collection[str]]]],
    ) -> Optional[List[object]]:
        """:meth:`check` and the building of the responses in one pass, for the common case only.

        Returns ``[response([tensor(name, array), ...]), ...]``, one per request, with the outputs
        each request asked for (``requested[i]``, ``None`` meaning all; ``requested=None``: every
        request asked for all), when ``result`` is a list of one dict per request holding every
        declared output, each an ``ndarray`` that passes :meth:`check`'s fast path. Returns
        ``None`` for anything else; the caller then takes :meth:`check`, which converts or names
        the problem. Raises what ``tensor`` and ``response`` raise.

        Why a second way: the backend kind's stub runs this per batch with cold caches, where each
        Python call and intermediate list costs far more than in a warm loop (``stubside/_inline.py``).
        """
        if type(result) is not list or len(result) != n_requests:
            return None
        declared = self._declared
        complete = self._all
        built = []
        for outputs, names in zip(result, requested) if requested is not None else zip(result, _ALL):
            if type(outputs) is not dict or len(outputs) != complete:
                return None
            tensors = []
            for name, value in outputs.items():
                spec = declared.get(name)
                # check()'s fast path, the same test
                if (
                    spec is None
                    or type(value) is not np.ndarray
                    or value.dtype is not spec.dtype
                    or value.ndim != spec.ndim
                    or not (spec.any_size or value.shape[spec.offset :] == spec.shape)
                ):
                    return None  # what was built is dropped: a Triton tensor holds no resource before it is sent
                if names is None or name in names:
                    tensors.append(tensor(name, value))  # Triton's Tensor makes a C-ordered copy where needed
            built.append(response(tensors))
        return built

    def _check_present(self, index: int, outputs: Mapping[str, object], requested: Optional[List[str]]) -> None:
        wanted = self._declared if requested is None else requested
        missing = [name for name in wanted if name not in outputs]
        if missing:
            asked = "the client asked for" if requested is not None else "declared"
            raise PyTritonRuntimeError(
                f"Model {self._model!r}: result {index} lacks output(s) {missing} ({asked}: {sorted(wanted)}); "
                "return every output the request asks for (Request.requested_output_names, None meaning all)."
            )

    def _check_array(
        self, index: int, name: object, spec: Optional[_Declared], value: object, strict: bool
    ) -> npt.NDArray[np.generic]:
        where = f"Model {self._model!r}: output {name!r} of result {index}"
        if spec is None:
            raise PyTritonRuntimeError(
                f"Model {self._model!r}: result {index} has output {name!r}, which is not among the declared outputs "
                f"{sorted(self._declared)}."
            )
        if isinstance(value, np.generic):
            value = np.asarray(value)
        if not isinstance(value, np.ndarray):
            raise PyTritonRuntimeError(f"{where} is {type(value).__name__}, expected numpy.ndarray.")
        converted = self._convert(where, spec, value, strict)
        shape = converted.shape
        if converted.ndim != spec.ndim or any(shape[axis] != size for axis, size in spec.fixed):
            axis = " after the batch axis" if self._batching else ""
            declared = "(" + ", ".join(str(size) for size in spec.shape) + ("," if len(spec.shape) == 1 else "") + ")"
            raise PyTritonRuntimeError(f"{where} has shape {shape}, declared {declared}{axis} (-1: any size).")
        return converted

    @staticmethod
    def _convert(where: str, spec: _Declared, value: npt.NDArray[np.generic], strict: bool) -> npt.NDArray[np.generic]:
        """``value`` with the declared dtype, converted only where no information can be lost."""
        kind = value.dtype.kind
        if spec.is_bytes:
            if kind in _TEXT_KINDS:
                return value
            raise PyTritonRuntimeError(
                f"{where} has dtype {value.dtype}, declared bytes; return a bytes, str or object array of strings."
            )
        target = spec.dtype
        assert target is not None
        if value.dtype == target:
            return value
        if np.can_cast(value.dtype, target, "equiv"):  # the same type in the other byte order
            return value.astype(target)
        if kind not in "biuf":
            raise PyTritonRuntimeError(f"{where} has dtype {value.dtype}, declared {target}; it cannot be converted.")
        if not strict and np.can_cast(value.dtype, target, "safe"):
            return value.astype(target)
        hint = "" if strict else " only lossless conversions (numpy 'safe' casting) are applied;"
        raise PyTritonRuntimeError(
            f"{where} has dtype {value.dtype}, declared {target};{hint} convert it with .astype(np.{target.name})."
        )
