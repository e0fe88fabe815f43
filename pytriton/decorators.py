"""Decorators that adapt ``List[Request]`` handlers to friendlier function shapes.

Every decorator is built with ``wrapt``, so decorated functions, methods and callable objects keep
their identity (name, docstring, signature) and ``Triton.bind`` can attach the model configuration
to them. Each decorator also works on ``async def`` functions (the result is awaited before it is
post-processed) and, where a single call is made, on generators and async generators used by
decoupled (streaming) models, where every yielded item is post-processed.

The usual stacks::

    @batch                      # List[Request] -> **inputs as batched arrays, outputs split back
    def infer(**inputs): ...

    @fill_optionals(b=np.array([0.0], np.float32))
    @group_by_keys
    @batch
    def infer(**inputs): ...

    @batch
    @group_by_values("temperature")
    def infer(**inputs): ...
"""

from __future__ import annotations

import bisect
import contextvars
import inspect
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
    cast,
)

import numpy as np
import numpy.typing as npt
import wrapt

from pytriton.exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonValidationError
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy import _tracing
from pytriton.proxy._context import CONTEXT_ATTRIBUTE as _CONTEXT_ATTRIBUTE
from pytriton.proxy._context import ModelConfigDict, TritonContext
from pytriton.proxy.types import InferenceRequest, InferenceRequests, InferenceResult, InferenceResults, Request

# wrapt's type stubs declare their whole module for Python 3.10 and later only, so a type check for
# the 3.9 target (CI runs mypy on each supported interpreter) would see no ``wrapt.decorator``.
# This alias gives it the one shape this module relies on, for every target.
_decorator: Callable[[Callable[..., Any]], Callable[..., Any]] = cast(Any, wrapt).decorator

# What wrapt hands a wrapper: the wrapped callable (opaque: it is only called), the positional
# arguments (the list of requests first, for a callable on requests) and the keyword arguments
# (the batched inputs below ``@batch``, and ``triton_context``).
# Casts below name types as strings or these module-level aliases: no typing subscription runs per call.
_Wrapped = Callable[..., object]
_Args = Tuple[object, ...]
_Kwargs = Dict[str, object]
_Arrays = Dict[str, npt.NDArray[np.generic]]

__all__ = [
    "ConstantPadder",
    "InferenceRequest",
    "InferenceRequests",
    "InferenceResult",
    "InferenceResults",
    "ModelConfigDict",
    "TritonContext",
    "batch",
    "batch_cancelled",
    "convert_output",
    "current_requests",
    "fill_optionals",
    "first_value",
    "get_inference_request_batch_size",
    "get_model_config",
    "get_triton_context",
    "group_by_keys",
    "group_by_values",
    "pad_batch",
    "sample",
    "triton_context",
]

TRITON_CONTEXT_FIELD_NAME = "triton_context"
_SPECIAL_KEYS = (_CONTEXT_ATTRIBUTE, TRITON_CONTEXT_FIELD_NAME)
_CURRENT_REQUESTS: contextvars.ContextVar[Optional[List[Request]]] = contextvars.ContextVar(
    "pytriton_current_requests", default=None
)


# -- the context Triton.bind attaches to callables (defined in pytriton/proxy/_context.py) -------------
def get_triton_context(wrapped: object, instance: object) -> TritonContext:
    """The ``TritonContext`` attached by ``Triton.bind`` to ``instance`` (methods) or ``wrapped``."""
    context = None
    for owner in (instance, wrapped, getattr(wrapped, "__self__", None)):
        if owner is not None:
            context = getattr(owner, _CONTEXT_ATTRIBUTE, None)
            if context is not None:
                break
    if context is None:
        raise PyTritonValidationError(
            f"{getattr(wrapped, '__name__', wrapped)!r} has no Triton context: bind it with Triton.bind() first "
            "(decorators that read the model config only work on bound callables)."
        )
    return context  # type: ignore[no-any-return]


def get_model_config(wrapped: object, instance: object) -> TritonModelConfig:
    """The ``TritonModelConfig`` of the model ``wrapped`` is bound as."""
    context = get_triton_context(wrapped, instance)
    try:
        return context.model_configs[cast(_Wrapped, wrapped)]
    except KeyError:
        bound = instance if instance is not None else wrapped
        return context.model_configs[cast(_Wrapped, bound)]  # a callable instance


def get_inference_request_batch_size(inference_request: Union[InferenceRequest, Dict[str, Any]]) -> int:
    """Batch size of a request: the leading dimension of its first input."""
    for name, value in inference_request.items():
        if name in _SPECIAL_KEYS:
            continue
        return int(value.shape[0])
    raise PyTritonValidationError("The request has no inputs, so it has no batch size.")


def current_requests() -> List[Request]:
    """The requests of the batch being processed, from inside a function wrapped by ``@batch``.

    ``@batch`` hands the wrapped function arrays only; this gives access to each request's
    ``parameters`` (and forwarded headers) and ``requested_output_names``, in batch order.
    """
    requests = _CURRENT_REQUESTS.get()
    if requests is None:
        raise PyTritonRuntimeError("current_requests() is only available inside a function wrapped by @batch.")
    return requests


def batch_cancelled() -> bool:
    """Inside a function wrapped by ``@batch``: True once no request of the batch is wanted any more.

    That is, every request's :meth:`~pytriton.proxy.types.Request.is_cancelled` is true (cancelled by
    its client, past its timeout, or past the model's execution timeout). A batched callable usually
    computes all rows at once, so it can only stop when nobody waits for any of them; for a per-row
    view use ``[r.is_cancelled() for r in current_requests()]``. docs/cancellation.md.
    """
    return all(request.is_cancelled() for request in current_requests())


# -- result post-processing shared by every decorator ---------------------------------------------
def _after(result: object, finish: Callable[[object], object], requests: Optional[List[Request]] = None) -> object:
    """Apply ``finish`` to a result, an awaited result, or every item a (async) generator yields.

    ``requests``, when given, is what :func:`current_requests` returns while the wrapped code runs
    lazily (coroutines and generators run after the decorator has returned).
    """
    kind = type(result)
    if kind is dict or kind is list or kind is tuple:
        # The usual result, first: inspect's three tests cost about 1.5 us per batch (isawaitable
        # asks an ABC), paid by every decorated callable on every batch.
        return finish(result)
    if inspect.isawaitable(result):

        async def finish_async() -> object:
            token = _CURRENT_REQUESTS.set(requests) if requests is not None else None
            try:
                return finish(await result)
            finally:
                if token is not None:
                    _CURRENT_REQUESTS.reset(token)

        return finish_async()
    if inspect.isgenerator(result):

        def finish_each() -> Iterator[object]:
            while True:
                token = _CURRENT_REQUESTS.set(requests) if requests is not None else None
                try:
                    item = next(result)
                except StopIteration:
                    return
                finally:
                    if token is not None:
                        _CURRENT_REQUESTS.reset(token)
                yield finish(item)

        return finish_each()
    if inspect.isasyncgen(result):

        async def finish_each_async() -> AsyncIterator[object]:
            while True:
                token = _CURRENT_REQUESTS.set(requests) if requests is not None else None
                try:
                    item = await result.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    if token is not None:
                        _CURRENT_REQUESTS.reset(token)
                yield finish(item)

        return finish_each_async()
    return finish(result)


def _gather(results: List[object], finish: Callable[[List[object]], object], what: str) -> object:
    """Combine the results of several calls (sync or async); streaming results cannot be combined."""
    if any(inspect.isgenerator(r) or inspect.isasyncgen(r) for r in results):
        raise PyTritonRuntimeError(f"{what} cannot split a streaming (generator) callable into groups.")
    if any(inspect.isawaitable(r) for r in results):

        async def gather_async() -> object:
            return finish([await r if inspect.isawaitable(r) else r for r in results])

        return gather_async()
    return finish(results)


def convert_output(
    outputs: object,
    wrapped: object = None,
    instance: object = None,
    model_config: Optional[TritonModelConfig] = None,
) -> Dict[str, Any]:
    """Turn a list/tuple of outputs into a dict keyed by the config's output names (in order).

    ``outputs`` is what an inference callable returned: a dict (returned as is) or a list/tuple of
    arrays; anything else raises ``PyTritonValidationError``.
    """
    if isinstance(outputs, dict):
        return outputs
    if isinstance(outputs, (list, tuple)):
        config = model_config if model_config is not None else get_model_config(wrapped, instance)
        names = [spec.name for spec in config.outputs]
        if len(outputs) != len(names):
            raise PyTritonValidationError(
                f"The function returned {len(outputs)} outputs but the model declares {len(names)} ({names}); "
                "return a dict, or a list/tuple with one array per declared output, in order."
            )
        return dict(zip(names, outputs))
    raise PyTritonValidationError(
        f"Unsupported output type {type(outputs).__name__}: return a dict of arrays, or a list/tuple of arrays."
    )


# -- @batch and @sample ---------------------------------------------------------------------------
def _stack_inputs(requests: Sequence[Request]) -> Dict[str, npt.NDArray[np.generic]]:
    if len(requests) == 1:
        return dict(requests[0].items())
    names = requests[0].keys()
    for index, request in enumerate(requests[1:], start=1):
        if request.keys() != names:
            raise PyTritonValidationError(
                f"Cannot batch requests with different sets of inputs: request 0 has {sorted(names)}, request {index} "
                f"has {sorted(request.keys())}. Put @group_by_keys above @batch (or fill them with @fill_optionals)."
            )
    return {name: np.concatenate([request[name] for request in requests]) for name in names}


def _split_outputs(outputs: Dict[str, Any], sizes: List[int]) -> InferenceResults:
    total = sum(sizes)
    exact = True
    for name, array in outputs.items():
        rows = getattr(array, "shape", (None,))[0] if getattr(array, "ndim", 0) else None
        if rows is None or rows < total:
            raise PyTritonValidationError(
                f"Output {name!r} has {rows if rows is not None else 'no'} rows along the batch axis, but the batch "
                f"holds {total} samples ({sizes} per request); return one row per input sample."
            )
        exact = exact and rows == total
    if exact and len(sizes) == 1:
        # One request with every row its own (sequential traffic): the arrays as they are, no views.
        return [dict(outputs)]
    results = []
    start = 0
    for size in sizes:
        results.append({name: array[start : start + size] for name, array in outputs.items()})
        start += size
    return results


@_decorator
def batch(wrapped: _Wrapped, instance: object, args: _Args, kwargs: _Kwargs) -> object:
    """Stack the requests' inputs into one batch per input and split the outputs back per request.

    The wrapped function receives every input as a keyword argument holding the concatenation of
    that input across requests, and returns a dict (or a list/tuple in the config's output order)
    of arrays whose first axis is the batch. Each request gets the rows matching its own batch
    size, in order. All requests must carry the same inputs (see ``@group_by_keys``). Generators
    stream: every yielded batch is split the same way. Request parameters stay reachable through
    :func:`current_requests`. When Triton traces requests, a ``batch`` child span of each traced
    request's span covers the call (docs/tracing.md).
    """
    given = args[0]
    if type(given) is list and len(given) == 1 and not _tracing.State.seen:
        return _batch_of_one(wrapped, instance, args, kwargs, given)
    requests: List[Request] = list(cast("Iterable[Request]", given))
    inputs = _stack_inputs(requests)
    sizes = [get_inference_request_batch_size(request) for request in requests]
    call_kwargs = dict(kwargs)
    call_kwargs.update(inputs)
    # A "batch" child span of each traced request's span covers the call (None: nothing is traced,
    # and State.seen keeps even the look for spans off the path until a traced batch has arrived).
    spans = _tracing.open_batch_spans(requests) if _tracing.State.seen else None
    token = _CURRENT_REQUESTS.set(requests)
    try:
        if spans is None:
            result = wrapped(*args[1:], **call_kwargs)
        else:
            result = _tracing.call_in_spans(spans, wrapped, args[1:], call_kwargs)
    finally:
        _CURRENT_REQUESTS.reset(token)

    def finish(outputs: object) -> InferenceResults:
        return _split_outputs(convert_output(outputs, wrapped, instance), sizes)

    if spans is None:
        return _after(result, finish, requests)
    return _tracing.finish_in_spans(spans, lambda: _after(result, finish, requests))


def _batch_of_one(wrapped: _Wrapped, instance: object, args: _Args, kwargs: _Kwargs, requests: List[Request]) -> object:
    """``@batch`` for a batch of one request (sequential traffic) when nothing is traced: the same
    call and result, with fewer steps. The callable gets the request's own arrays.

    Why a second path: the decorator runs on every batch with caches the server and the client
    evicted since the last one, where each call and intermediate list counts. In a backend
    instance's stub, ``@batch`` around an identity took 29-41 us per single-request batch before
    this path and 15-21 us with it (bench/history.md)."""
    request = requests[0]
    call_kwargs = dict(kwargs)
    call_kwargs.update(request.items())
    sizes = [get_inference_request_batch_size(request)]
    token = _CURRENT_REQUESTS.set(requests)
    try:
        result = wrapped(*args[1:], **call_kwargs)
    finally:
        _CURRENT_REQUESTS.reset(token)
    if type(result) is dict:
        return _split_outputs(result, sizes)
    return _after(result, lambda outputs: _split_outputs(convert_output(outputs, wrapped, instance), sizes), requests)


@_decorator
def sample(wrapped: _Wrapped, instance: object, args: _Args, kwargs: _Kwargs) -> object:
    """Call the wrapped function with the inputs of the (single) request as keyword arguments.

    For non-batching models, which receive one request at a time. Returns ``[outputs]``.
    """
    requests = cast("List[Request]", args[0])
    if len(requests) != 1:
        raise PyTritonRuntimeError(
            f"@sample expects exactly one request per call, got {len(requests)}; use @batch for batching models."
        )
    call_kwargs = dict(kwargs)
    call_kwargs.update(requests[0].items())
    result = wrapped(*args[1:], **call_kwargs)
    return _after(result, lambda outputs: [convert_output(outputs, wrapped, instance)])


# -- grouping ---------------------------------------------------------------------------------------
@_decorator
def group_by_keys(wrapped: _Wrapped, instance: object, args: _Args, kwargs: _Kwargs) -> object:
    """Call the wrapped function once per group of requests that carry the same set of inputs.

    Results are put back in the original request order. Handy above ``@batch`` when some
    requests omit optional inputs.
    """
    requests = list(cast("Iterable[Request]", args[0]))
    groups: Dict[Tuple[str, ...], List[int]] = {}
    for index, request in enumerate(requests):
        groups.setdefault(tuple(sorted(request.keys())), []).append(index)
    if len(groups) == 1:
        return wrapped(*args, **kwargs)
    order = list(groups.values())
    results = [wrapped([requests[i] for i in indices], *args[1:], **kwargs) for indices in order]

    def merge(group_results: List[object]) -> InferenceResults:
        merged: List[Optional[InferenceResult]] = [None] * len(requests)
        for indices, outputs in zip(order, cast("List[InferenceResults]", group_results)):
            if len(outputs) != len(indices):
                raise PyTritonRuntimeError(
                    f"A group of {len(indices)} requests returned {len(outputs)} results; return one per request."
                )
            for index, output in zip(indices, outputs):
                merged[index] = output
        return cast(InferenceResults, merged)  # every index is in one group: no None is left

    return _gather(results, merge, "@group_by_keys")


def _sample_key(value: npt.NDArray[np.generic]) -> object:
    if value.dtype.kind == "O":
        return tuple(item if isinstance(item, bytes) else str(item).encode() for item in value.reshape(-1).tolist())
    return (value.dtype.str, value.shape, value.tobytes())


class ConstantPadder:
    """Pads group results to a common shape so they can be merged back into one batch.

    Every array is padded at the end of each non-batch axis up to the largest size among the
    groups, with ``pad_value`` (empty bytes for string/bytes arrays, whose width is also unified).
    Arrays of one output with different dtype kinds raise ``PyTritonRuntimeError``.
    """

    def __init__(self, pad_value: Union[int, float, bool] = 0):
        self.pad_value = pad_value

    def __call__(self, batches_list: InferenceResults) -> InferenceResults:
        names = list(dict.fromkeys(name for batch_ in batches_list for name in batch_))
        padded: List[Dict[str, npt.NDArray[np.generic]]] = [dict() for _ in batches_list]
        for name in names:
            arrays = [(index, batch_[name]) for index, batch_ in enumerate(batches_list) if name in batch_]
            dtype = self._common_dtype(name, [array.dtype for _, array in arrays])
            ndims = {array.ndim for _, array in arrays}
            if len(ndims) != 1:
                raise PyTritonRuntimeError(
                    f"Output {name!r} has arrays of different ranks {sorted(ndims)}; cannot pad."
                )
            target = tuple(max(sizes) for sizes in zip(*(array.shape[1:] for _, array in arrays)))
            fill = b"" if dtype.kind in "SUO" else self.pad_value
            for index, array in arrays:
                widths = [(0, 0)] + [(0, want - have) for have, want in zip(array.shape[1:], target)]
                if any(after for _, after in widths):
                    array = np.pad(array, widths, mode="constant", constant_values=fill)
                padded[index][name] = array.astype(dtype, copy=False)
        return padded

    @staticmethod
    def _common_dtype(name: str, dtypes: List[np.dtype[np.generic]]) -> np.dtype[np.generic]:
        kinds = {dtype.kind for dtype in dtypes}
        if len(kinds) != 1:
            raise PyTritonRuntimeError(
                f"Output {name!r} has arrays of different dtype kinds ({', '.join(str(d) for d in dtypes)}); "
                "all groups must return the same dtype."
            )
        kind = kinds.pop()
        if kind in "SU":
            return np.dtype(f"{kind}{max(dtype.itemsize // (4 if kind == 'U' else 1) for dtype in dtypes)}")
        if len(set(dtypes)) != 1:
            raise PyTritonRuntimeError(
                f"Output {name!r} has arrays of different dtypes ({', '.join(str(d) for d in dtypes)})."
            )
        return dtypes[0]


def group_by_values(*keys: str, pad_fn: Optional[Callable[[InferenceResults], InferenceResults]] = None) -> Any:
    """Split a batch into sub-batches whose samples share the values of ``keys``.

    Place it *below* ``@batch``: the wrapped function is called once per group with the same
    keyword inputs restricted to that group's samples, and the outputs are reassembled in the
    original sample order. Groups are processed in the order their first sample appears. If the
    groups return outputs of different shapes, pass ``pad_fn`` (e.g. ``ConstantPadder(0)``) to
    pad them to a common shape before merging.
    """
    if not keys:
        raise PyTritonBadParameterError("@group_by_values needs at least one input name to group by.")

    @_decorator
    def wrapper(wrapped: _Wrapped, instance: object, args: _Args, kwargs: _Kwargs) -> object:
        if args and isinstance(args[0], (list, tuple)):
            raise PyTritonRuntimeError(
                "@group_by_values received a list of requests: it must be placed below @batch "
                "(@batch first, then @group_by_values), so that it receives batched keyword inputs."
            )
        inputs = {name: value for name, value in cast(_Arrays, kwargs).items() if name not in _SPECIAL_KEYS}
        extra = {name: value for name, value in kwargs.items() if name in _SPECIAL_KEYS}
        missing = [key for key in keys if key not in inputs]
        if missing:
            raise PyTritonRuntimeError(f"@group_by_values: inputs {missing} are not present in the batch.")
        batch_size = get_inference_request_batch_size(inputs)
        groups: Dict[object, List[int]] = {}
        for index in range(batch_size):
            groups.setdefault(tuple(_sample_key(inputs[key][index]) for key in keys), []).append(index)
        order = [np.asarray(indices) for indices in groups.values()]
        if len(order) == 1:
            return wrapped(*args, **kwargs)
        results = [
            wrapped(*args, **{name: value[indices] for name, value in inputs.items()}, **extra) for indices in order
        ]

        def merge(group_outputs: List[object]) -> _Arrays:
            converted = [convert_output(outputs, wrapped, instance) for outputs in group_outputs]
            if pad_fn is not None:
                converted = list(pad_fn(converted))
            merged: Dict[str, npt.NDArray[np.generic]] = {}
            for name in converted[0]:
                parts = [outputs[name] for outputs in converted]
                tails = {part.shape[1:] for part in parts}
                if len(tails) != 1:
                    raise PyTritonRuntimeError(
                        f"@group_by_values: output {name!r} has different shapes across groups {sorted(tails)}; "
                        "pass pad_fn=ConstantPadder(...) to pad them to a common shape."
                    )
                kinds = {part.dtype.kind for part in parts}
                dtype = parts[0].dtype if len(kinds) == 1 else None
                if dtype is None:
                    raise PyTritonRuntimeError(f"@group_by_values: output {name!r} has different dtypes across groups.")
                if dtype.kind in "SU":
                    dtype = np.result_type(*[part.dtype for part in parts])
                result = np.empty((batch_size, *parts[0].shape[1:]), dtype=dtype)
                for indices, part in zip(order, parts):
                    result[indices] = part
                merged[name] = result
            return merged

        return _gather(results, merge, "@group_by_values")

    return wrapper


# -- inputs ------------------------------------------------------------------------------------------
def fill_optionals(**defaults: npt.NDArray[np.generic]) -> Any:
    """Fill inputs a request omitted with default values (arrays *without* the batch axis).

    Put it at the top of the stack, so that ``@group_by_keys`` and ``@batch`` below see complete
    requests. Defaults are checked against the model config (name, dtype, shape) on first call;
    a mismatch raises ``PyTritonBadParameterError`` naming the input.
    """
    not_arrays = sorted(name for name, value in defaults.items() if not isinstance(value, np.ndarray))
    if not_arrays:
        raise PyTritonBadParameterError(
            f"@fill_optionals defaults must be numpy arrays; {', '.join(not_arrays)} is not."
        )
    checked: Dict[int, bool] = {}

    def verify(config: TritonModelConfig) -> None:
        specs = {spec.name: spec for spec in config.inputs}
        for name, value in defaults.items():
            spec = specs.get(name)
            if spec is None:
                raise PyTritonBadParameterError(
                    f"@fill_optionals: {name!r} is not an input of model {config.model_name!r} ({sorted(specs)})."
                )
            problem = spec.mismatch(value, batch_axis=False)
            if problem:
                raise PyTritonBadParameterError(f"@fill_optionals: the default for input {name!r} {problem}.")

    @_decorator
    def wrapper(wrapped: _Wrapped, instance: object, args: _Args, kwargs: _Kwargs) -> object:
        config = get_model_config(wrapped, instance)
        if not checked.get(id(config)):
            verify(config)
            checked[id(config)] = True
        for request in cast("List[Request]", args[0]):
            for name, value in defaults.items():
                if name in request:
                    continue
                if config.batching:
                    size = get_inference_request_batch_size(request)
                    request[name] = np.broadcast_to(value, (size, *value.shape)).copy()
                else:
                    request[name] = value.copy()
        return wrapped(*args, **kwargs)

    return wrapper


def first_value(*keys: str, squeeze_single_values: bool = True, strict: bool = True) -> Any:
    """Replace the selected inputs by their first sample (e.g. a per-batch ``temperature``).

    Use it below ``@batch`` (inputs as keyword arguments) or directly on a ``List[Request]``
    function. With ``strict`` every sample must hold the same value (else ``PyTritonRuntimeError``);
    with ``squeeze_single_values`` a one-element value becomes a numpy scalar. Batching models only.
    """
    reserved = [key for key in keys if key in _SPECIAL_KEYS]
    if reserved:
        raise PyTritonBadParameterError(
            f"@first_value cannot take the reserved name(s) {', '.join(reserved)}; reserved: {', '.join(_SPECIAL_KEYS)}."
        )

    def replace(values: Union[_Kwargs, Request]) -> None:
        for name in keys:
            if name not in values:
                continue
            array = cast("npt.NDArray[np.generic]", values[name])
            if strict and len(array) > 1:
                first_row = array[0]
                equal = all(np.array_equal(first_row, row) for row in array[1:])
                if not equal:
                    raise PyTritonRuntimeError(
                        f"@first_value: the samples of input {name!r} differ ({array!r}); send one value per batch "
                        "or disable strict mode."
                    )
            first = array[0]
            if squeeze_single_values and isinstance(first, np.ndarray) and first.size == 1:
                first = first.reshape(())[()]
            values[name] = first

    @_decorator
    def wrapper(wrapped: _Wrapped, instance: object, args: _Args, kwargs: _Kwargs) -> object:
        config = get_model_config(wrapped, instance)
        if not config.batching:
            raise PyTritonRuntimeError("@first_value can only be used with models that support batching.")
        if any(name not in _SPECIAL_KEYS for name in kwargs):
            call_kwargs = dict(kwargs)
            replace(call_kwargs)
            return wrapped(*args, **call_kwargs)
        for request in cast("List[Request]", args[0]):
            replace(request)
        return wrapped(*args, **kwargs)

    return wrapper


@_decorator
def pad_batch(wrapped: _Wrapped, instance: object, args: _Args, kwargs: _Kwargs) -> object:
    """Pad the batch up to the nearest preferred batch size (or ``max_batch_size``) by repeating the last sample.

    Use it below ``@batch``; ``@batch`` discards the extra output rows.
    """
    inputs = {name: value for name, value in cast(_Arrays, kwargs).items() if name not in _SPECIAL_KEYS}
    config = get_model_config(wrapped, instance)
    size = get_inference_request_batch_size(inputs)
    targets = sorted(
        set((config.batcher.preferred_batch_size or []) if config.batcher else []) | {config.max_batch_size}
    )
    position = bisect.bisect_left(targets, size)
    target = targets[position] if position < len(targets) else size
    if target > size:
        repeats = np.ones(size, dtype=np.int64)
        repeats[-1] += target - size
        kwargs = {**kwargs, **{name: np.repeat(value, repeats, axis=0) for name, value in inputs.items()}}
    return wrapped(*args, **kwargs)


@_decorator
def triton_context(wrapped: _Wrapped, instance: object, args: _Args, kwargs: _Kwargs) -> object:
    """Pass the ``TritonContext`` as the ``triton_context`` keyword argument.

    ``triton_context.model_configs[infer_fn]`` is the model's ``TritonModelConfig``.
    """
    call_kwargs = dict(kwargs)
    call_kwargs[TRITON_CONTEXT_FIELD_NAME] = get_triton_context(wrapped, instance)
    return wrapped(*args, **call_kwargs)
