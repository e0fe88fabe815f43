"""Inference requests, responses and response iterators on the C API's asynchronous inference.

Lifetimes and ownership (each Triton object is deleted exactly once):

* ``TRITONSERVER_InferenceRequest``: created by :func:`submit` (or taken from the server's pool of
  released requests, see :mod:`pytriton.inprocess._pool`); if ``ServerInferAsync`` fails it is
  deleted there, otherwise Triton owns it until the release callback, which drops the input tensors
  kept alive for it (inputs are handed to Triton without a copy) and deletes it, or, for a plain
  request (inputs only), hands it to the pool once its final response is in too.
* ``TRITONSERVER_InferenceResponse``: read in the response callback (on a Triton thread), turned into
  an :class:`InferenceResponse` and deleted at once. Output memory comes from a Python allocator, so
  the output :class:`Tensor` objects keep that memory alive after the delete (no copy).
* The response allocator is created once per process and lives as long as the loaded library.

A request's bookkeeping entry is dropped when it is both released and has seen its final response.

Cost (see docs/performance.md "In-process calls"): a call makes four ctypes calls on the caller's
thread when it reuses a released request (``RemoveAllInputs``, ``AddInput``, ``AppendInputData``,
``ServerInferAsync``; a new request adds ``InferenceRequestNew`` and the two callback setters) and
three Python callbacks on Triton's thread (output allocation, response complete with the buffer
release nested in it, request release). The callbacks keep their Python thread state between calls
(:data:`pytriton.inprocess._lib.keep_thread_state`), read the response with per-thread, pre-built
ctypes out-parameters and look enums up in dicts; the caller hands a contiguous numpy input over
without building a :class:`Tensor`.

Unit test: tests/unit/test_inprocess_request.py (iterators, cancel and parameters without the
library); requests against the library: tests/e2e/test_inprocess_server.py.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import itertools
import logging
import queue
import threading
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple, Union

import numpy as np

from pytriton.inprocess import _lib, _pool
from pytriton.inprocess._enums import (
    DataType,
    ErrorCode,
    MemoryType,
    ParameterType,
    RequestReleaseFlag,
    ResponseCompleteFlag,
)
from pytriton.inprocess._errors import InvalidArgumentError, TritonError, UnavailableError, error_from_code
from pytriton.inprocess._tensor import (
    MemoryAllocator,
    MemoryBuffer,
    Tensor,
    array_address,
    fast_data_type,
    parse_device,
)


class ServerSide(Protocol):
    """What a request needs of the server its model belongs to.

    Defined here, below :mod:`pytriton.inprocess._server` (whose ``Server`` implements it), so that this module never
    imports the server: the server creates requests and iterators, requests only talk back through this seam.
    The members keep the server's internal names because ``Server`` mirrors tritonserver's public in-process API,
    which has no such methods to make public.
    """

    @property
    def _handle(self) -> Optional[int]: ...  # the running server's handle; None when stopped

    @property
    def _requests(self) -> _pool.RequestPool: ...  # released plain requests kept for reuse

    def _library(self) -> _lib.Library: ...

    def _running(self) -> bool: ...

    def _handle_or_raise(self) -> int: ...


class Model(Protocol):
    """A model a request is sent to (implemented by :class:`pytriton.inprocess._server.Model`)."""

    name: str
    version: int

    @property
    def _server(self) -> ServerSide: ...


LOGGER = logging.getLogger(__name__)
_WAIT_SLICE_S = 0.5


@dataclasses.dataclass
class InferenceRequest:
    """What to send to a model; build it with ``Model.create_request`` or pass the fields to ``infer``."""

    model: Model
    request_id: Optional[str] = None
    flags: int = 0
    correlation_id: Optional[Union[int, str]] = None
    priority: int = 0
    timeout: int = 0
    inputs: Dict[str, Any] = dataclasses.field(default_factory=dict)
    parameters: Dict[str, Union[str, int, bool, float]] = dataclasses.field(default_factory=dict)
    output_memory_type: object = None
    output_memory_allocator: Optional[MemoryAllocator] = None
    response_queue: Optional[Any] = None


@dataclasses.dataclass
class InferenceResponse:
    """One response of a request; ``final`` is True on the last one."""

    model: Model
    request_id: Optional[str] = None
    parameters: Dict[str, Union[str, int, bool, float]] = dataclasses.field(default_factory=dict)
    outputs: Dict[str, Tensor] = dataclasses.field(default_factory=dict)
    error: Optional[TritonError] = None
    classification_label: Optional[str] = None
    final: bool = False


class _RequestState:
    """Bookkeeping of one in-flight request, shared by the Triton callbacks and the iterator.

    ``allocator`` None means the default (a numpy array per output, as :class:`NumpyAllocator`).
    ``inputs`` holds what Triton reads the input data from until the request is released.
    """

    __slots__ = (
        "model",
        "allocator",
        "deliver",
        "request_id",
        "handle",
        "inputs",
        "released",
        "finished",
        "lock",
        "pool",
        "pool_entry",
        "model_key",
    )

    def __init__(
        self,
        model: Model,
        allocator: Optional[MemoryAllocator],
        deliver: Callable[[InferenceResponse], None],
        request_id: Optional[str] = None,
    ):
        self.model = model
        self.allocator = allocator
        self.deliver = deliver
        self.request_id = request_id
        self.handle: Optional[int] = None
        self.inputs: Optional[Sequence[object]] = []
        self.released = False
        self.finished = False
        self.lock = threading.Lock()
        # A plain request's pool, and (handle, key, generation) to pool once released and finished.
        self.pool: Optional[_pool.RequestPool] = None
        self.pool_entry: Optional[_pool.Entry] = None
        self.model_key: _pool.ModelKey = (b"", -1)


# Triton's callbacks and the callers touch these registries with single dict operations, which the
# GIL makes atomic: no lock on the per-request path. _REGISTRY_LOCK guards creating the allocator.
_REGISTRY_LOCK = threading.Lock()
_KEYS = itertools.count(1)
_INFLIGHT: Dict[int, _RequestState] = {}
_BUFFERS: Dict[int, MemoryBuffer] = {}
# Enum members by value: a dict lookup costs a twentieth of calling the enum class.
_MEMORY_TYPES: Dict[int, MemoryType] = {int(member): member for member in MemoryType}
_DATA_TYPES: Dict[int, DataType] = {int(member): member for member in DataType}
_FINAL = int(ResponseCompleteFlag.FINAL)
_RELEASE_ALL = int(RequestReleaseFlag.ALL)
_CPU = MemoryType.CPU
_GPU = MemoryType.GPU
_CACHE_LIMIT = 1024


def inflight_count() -> int:
    """Requests not yet both released and finished (for tests and diagnostics)."""
    return len(_INFLIGHT)


def _forget_if_done(key: int, state: _RequestState) -> None:
    """Drop the entry of a request released and finished; pool (or delete) a plain one's handle.

    Each of the two callbacks sets its own flag, then calls this: one of them sees both set, and the
    atomic ``pop`` lets exactly one of them go on (the key is reused only once the handle is pooled).
    """
    if state.released and state.finished and _INFLIGHT.pop(key, None) is not None:
        entry, state.pool_entry = state.pool_entry, None
        if entry is not None and state.pool is not None and not state.pool.put(state.model_key, entry):
            _pool.delete_request(_lib.library(), entry[0])


class _OutParams:
    """ctypes out-parameters for reading responses, with their ``byref`` forms, built once per thread.

    Never shared between threads (two of Triton's threads may read responses at once); the
    callbacks keep their thread state (``keep_thread_state``), so one set serves a thread for life.
    """

    def __init__(self) -> None:
        self.name = ctypes.c_char_p()
        self.kind = ctypes.c_int32()
        self.value = ctypes.c_void_p()
        self.count = ctypes.c_uint32()
        self.data_type = ctypes.c_int32()
        self.shape = ctypes.POINTER(ctypes.c_int64)()
        self.dims = ctypes.c_uint64()
        self.base = ctypes.c_void_p()
        self.size = ctypes.c_size_t()
        self.memory_type = ctypes.c_int32()
        self.memory_id = ctypes.c_int64()
        self.userp = ctypes.c_void_p()
        byref = ctypes.byref
        self.name_ref, self.kind_ref, self.value_ref = byref(self.name), byref(self.kind), byref(self.value)
        self.count_ref, self.data_type_ref, self.shape_ref = byref(self.count), byref(self.data_type), byref(self.shape)
        self.dims_ref, self.base_ref, self.size_ref = byref(self.dims), byref(self.base), byref(self.size)
        self.memory_type_ref, self.memory_id_ref = byref(self.memory_type), byref(self.memory_id)
        self.userp_ref = byref(self.userp)


_THREAD = threading.local()


def _out_params() -> _OutParams:
    try:
        out: _OutParams = _THREAD.out
    except AttributeError:
        out = _THREAD.out = _OutParams()
    return out


# -- callbacks (run on Triton threads; never let an exception escape) -----------------------------
def _alloc(
    allocator: object,
    tensor_name: object,
    byte_size: int,
    memory_type: int,
    memory_type_id: int,
    userp: Optional[int],
    buffer: ctypes._Pointer[ctypes.c_void_p],  # the out-parameters of _lib.ALLOC_FN
    buffer_userp: ctypes._Pointer[ctypes.c_void_p],
    actual_type: ctypes._Pointer[ctypes.c_int32],
    actual_id: ctypes._Pointer[ctypes.c_int64],
) -> Optional[int]:
    _lib.keep_thread_state()
    try:
        state = _INFLIGHT.get(userp or 0)
        chosen = state.allocator if state is not None else None
        if chosen is None:  # the default: what NumpyAllocator does, without the calls
            array = np.empty(max(byte_size, 1), dtype=np.uint8)
            memory = MemoryBuffer(array_address(array), _CPU, 0, byte_size, array)
        else:
            requested = _MEMORY_TYPES.get(memory_type) or MemoryType(memory_type)
            memory = chosen.allocate(int(byte_size), requested, int(memory_type_id))
            if memory.memory_type == _GPU:
                return _lib.library().new_error(
                    ErrorCode.UNSUPPORTED, "GPU output memory is not supported in-process here"
                )
            if memory.size < byte_size:
                return _lib.library().new_error(
                    ErrorCode.INTERNAL, f"allocator returned {memory.size} bytes, {byte_size} needed"
                )
        key = next(_KEYS)
        _BUFFERS[key] = memory
        buffer[0] = memory.data_ptr
        buffer_userp[0] = key
        actual_type[0] = int(memory.memory_type)
        actual_id[0] = int(memory.memory_type_id)
        return None
    except BaseException as exc:  # noqa: BLE001  (reported to Triton as the allocation's error)
        return _lib.library().new_error(ErrorCode.INTERNAL, f"output allocation failed: {exc!r}")


def _release(
    allocator: object,
    buffer: object,
    buffer_userp: Optional[int],
    byte_size: int,
    memory_type: int,
    memory_type_id: int,
) -> Optional[int]:
    _lib.keep_thread_state()
    _BUFFERS.pop(buffer_userp or 0, None)
    return None


def _start(allocator: object, userp: object) -> Optional[int]:
    return None


def _request_released(request: Optional[int], flags: int, userp: Optional[int]) -> None:
    if not flags & _RELEASE_ALL:
        return
    _lib.keep_thread_state()
    lib = _lib.library()
    key = userp or 0
    try:
        state = _INFLIGHT.get(key)
        if state is not None:
            with state.lock:
                state.released = True
                state.handle = None
                state.inputs = None  # Triton no longer reads the input buffers
            if state.pool_entry is not None:  # a plain request: pooled once its final response is in
                _forget_if_done(key, state)
                return
        _pool.delete_request(lib, request or 0)
        if state is not None:
            _forget_if_done(key, state)
    except BaseException:  # noqa: BLE001
        LOGGER.exception("request release callback failed")


def _read_response(lib: _lib.Library, state: _RequestState, response: int, final: bool) -> InferenceResponse:
    out = _out_params()
    result = InferenceResponse(model=state.model, final=final)
    error = lib.TRITONSERVER_InferenceResponseError(response)  # owned by the response: not deleted here
    if error:
        result.error = error_from_code(lib.TRITONSERVER_ErrorCode(error), lib.error_message(error))
    # A response's id is its request's: without one there is nothing to read.
    if state.request_id and not lib.TRITONSERVER_InferenceResponseId(response, out.name_ref) and out.name.value:
        result.request_id = out.name.value.decode()
    error = lib.TRITONSERVER_InferenceResponseParameterCount(response, out.count_ref)
    if error:
        lib.check(error)
    for index in range(out.count.value):
        error = lib.TRITONSERVER_InferenceResponseParameter(response, index, out.name_ref, out.kind_ref, out.value_ref)
        if error:
            lib.check(error)
        result.parameters[(out.name.value or b"").decode()] = _parameter_value(out.kind.value, out.value.value)
    error = lib.TRITONSERVER_InferenceResponseOutputCount(response, out.count_ref)
    if error:
        lib.check(error)
    for index in range(out.count.value):
        error = lib.TRITONSERVER_InferenceResponseOutput(
            response,
            index,
            out.name_ref,
            out.data_type_ref,
            out.shape_ref,
            out.dims_ref,
            out.base_ref,
            out.size_ref,
            out.memory_type_ref,
            out.memory_id_ref,
            out.userp_ref,
        )
        if error:
            lib.check(error)
        size = out.size.value
        base = out.base.value
        owner = _BUFFERS.get(out.userp.value or 0)
        if owner is None:  # not from our allocator (should not happen): copy while the response lives
            raw = ctypes.string_at(base or 0, size) if size else b""
            copied = np.frombuffer(raw, dtype=np.uint8).copy()
            owner = MemoryBuffer(int(copied.ctypes.data), _CPU, 0, size, copied)
        memory_type = out.memory_type.value
        buffer = MemoryBuffer(
            base or owner.data_ptr,
            _MEMORY_TYPES.get(memory_type) or MemoryType(memory_type),
            out.memory_id.value,
            size,
            owner.owner,
        )
        data_type = out.data_type.value
        result.outputs[(out.name.value or b"").decode()] = Tensor(
            _DATA_TYPES.get(data_type) or DataType(data_type), out.shape[: out.dims.value], buffer
        )
    return result


def _parameter_value(kind: int, pointer: Optional[int]) -> Any:
    if not pointer:
        return None
    if kind == ParameterType.STRING:
        return (ctypes.cast(pointer, ctypes.c_char_p).value or b"").decode()
    if kind == ParameterType.INT:
        return ctypes.cast(pointer, ctypes.POINTER(ctypes.c_int64))[0]
    if kind == ParameterType.BOOL:
        return bool(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_bool))[0])
    if kind == ParameterType.DOUBLE:
        return ctypes.cast(pointer, ctypes.POINTER(ctypes.c_double))[0]
    return None


def _response_complete(response: Optional[int], flags: int, userp: Optional[int]) -> None:
    _lib.keep_thread_state()
    key = userp or 0
    final = bool(flags & _FINAL)
    try:
        lib = _lib.library()
        state = _INFLIGHT.get(key)
        if state is None:
            if response:
                lib.check(lib.TRITONSERVER_InferenceResponseDelete(response))
            return
        result: Optional[InferenceResponse] = None
        if response:
            try:
                result = _read_response(lib, state, response, final)
            except TritonError as exc:
                result = InferenceResponse(model=state.model, error=exc, final=final)
            finally:
                error = lib.TRITONSERVER_InferenceResponseDelete(response)
                if error:
                    lib.check(error)
        elif final:
            result = InferenceResponse(model=state.model, final=True)
        if final:
            state.finished = True
            _forget_if_done(key, state)
        if result is not None:
            # Last: the woken caller wants the GIL this callback holds until it returns.
            state.deliver(result)
    except BaseException:  # noqa: BLE001
        LOGGER.exception("response callback failed")


_ALLOC_CB = _lib.ALLOC_FN(_alloc)
_RELEASE_CB = _lib.RELEASE_FN(_release)
_START_CB = _lib.START_FN(_start)
_REQUEST_RELEASE_CB = _lib.REQUEST_RELEASE_FN(_request_released)
_RESPONSE_COMPLETE_CB = _lib.RESPONSE_COMPLETE_FN(_response_complete)
_ALLOCATOR: Optional[int] = None


def _response_allocator(lib: _lib.Library) -> int:
    global _ALLOCATOR
    with _REGISTRY_LOCK:
        if _ALLOCATOR is None:
            handle = ctypes.c_void_p()
            lib.check(lib.TRITONSERVER_ResponseAllocatorNew(ctypes.byref(handle), _ALLOC_CB, _RELEASE_CB, _START_CB))
            _ALLOCATOR = int(handle.value or 0)
        return _ALLOCATOR


# -- building and submitting ----------------------------------------------------------------------
_NAMES: Dict[object, bytes] = {}
_SHAPES: Dict[Tuple[int, ...], object] = {}


def _encoded(name: object) -> bytes:
    """``str(name)`` as UTF-8, cached (model and input names repeat on every call)."""
    encoded = _NAMES.get(name)
    if encoded is None:
        encoded = str(name).encode()
        if len(_NAMES) >= _CACHE_LIMIT:  # bounded: names that do not repeat do not pile up
            _NAMES.clear()
        _NAMES[name] = encoded
    return encoded


def _shape_array(shape: Tuple[int, ...]) -> object:
    """``shape`` as a C ``int64_t`` array, cached; Triton copies it in ``AddInput`` and never writes it."""
    array = _SHAPES.get(shape)
    if array is None:
        array = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        if len(_SHAPES) >= _CACHE_LIMIT:
            _SHAPES.clear()
        _SHAPES[shape] = array
    return array


def _fill(lib: _lib.Library, handle: int, request: InferenceRequest, keep: List[object]) -> None:
    if request.request_id is not None:
        lib.check(lib.TRITONSERVER_InferenceRequestSetId(handle, str(request.request_id).encode()))
    if request.flags:
        lib.check(lib.TRITONSERVER_InferenceRequestSetFlags(handle, int(request.flags)))
    if isinstance(request.correlation_id, str):
        lib.check(lib.TRITONSERVER_InferenceRequestSetCorrelationIdString(handle, request.correlation_id.encode()))
    elif request.correlation_id is not None:
        lib.check(lib.TRITONSERVER_InferenceRequestSetCorrelationId(handle, int(request.correlation_id)))
    if request.priority:
        lib.check(lib.TRITONSERVER_InferenceRequestSetPriorityUInt64(handle, int(request.priority)))
    if request.timeout:
        lib.check(lib.TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(handle, int(request.timeout)))
    for key, value in request.parameters.items():
        name = str(key).encode()
        if isinstance(value, bool):
            lib.check(lib.TRITONSERVER_InferenceRequestSetBoolParameter(handle, name, value))
        elif isinstance(value, int):
            lib.check(lib.TRITONSERVER_InferenceRequestSetIntParameter(handle, name, value))
        elif isinstance(value, float):
            lib.check(lib.TRITONSERVER_InferenceRequestSetDoubleParameter(handle, name, value))
        elif isinstance(value, str):
            lib.check(lib.TRITONSERVER_InferenceRequestSetStringParameter(handle, name, value.encode()))
        else:
            raise InvalidArgumentError(f"Parameter {key!r} must be str, int, bool or float, not {type(value).__name__}")
    add_input = lib.TRITONSERVER_InferenceRequestAddInput
    append_data = lib.TRITONSERVER_InferenceRequestAppendInputData
    for input_name, value in request.inputs.items():
        data_type = fast_data_type(value)
        if data_type is not None:  # a contiguous numpy array of a numeric dtype: no Tensor needed
            keep.append(value)
            shape = value.shape
            data_ptr, size, memory_type, memory_type_id = array_address(value), value.nbytes, 0, 0
        else:
            tensor = Tensor._from_object(value)
            if tensor.memory_type == MemoryType.GPU:
                raise InvalidArgumentError(f"Input {input_name!r} is in GPU memory, which this build cannot read")
            keep.append(tensor)
            data_type = tensor.data_type
            shape = tuple(int(dim) for dim in tensor.shape)
            data_ptr, size = tensor.data_ptr, tensor.size
            memory_type, memory_type_id = int(tensor.memory_type), tensor.memory_type_id
        name = _encoded(input_name)
        error = add_input(handle, name, int(data_type), _shape_array(shape), len(shape))
        if error:
            lib.check(error)
        error = append_data(handle, name, data_ptr, size, memory_type, memory_type_id)
        if error:
            lib.check(error)


def submit(
    lib: _lib.Library, server_handle: int, request: InferenceRequest, deliver: Callable[[InferenceResponse], None]
) -> _RequestState:
    """Create, fill and send one request; responses go to ``deliver`` on Triton's threads.

    Raises the mapped :class:`TritonError` (for example :class:`InvalidArgumentError` for a wrong
    input name, dtype or shape) if Triton refuses the request; nothing is left allocated then.
    """
    if request.output_memory_type is not None:
        memory_type, _ = parse_device(request.output_memory_type)
        if memory_type == MemoryType.GPU and request.output_memory_allocator is None:
            from pytriton.inprocess._errors import UnsupportedError

            raise UnsupportedError("GPU output memory is not supported in-process here: use MemoryType.CPU")
    model = request.model
    request_id = None if request.request_id is None else str(request.request_id)
    # No allocator: _alloc does what NumpyAllocator does, inline.
    state = _RequestState(model, request.output_memory_allocator, deliver, request_id)
    allocator = _ALLOCATOR or _response_allocator(lib)
    model_key = (_encoded(model.name), int(model.version))
    server = model._server
    # (a request built for another server's model goes out on this one: never pooled there)
    plain = _is_plain(request) and server._handle == server_handle
    pool: Optional[_pool.RequestPool] = server._requests if plain else None
    entry = pool.take(model_key) if pool is not None else None
    if entry is not None:  # a released request of this model: clear its inputs, keep its callbacks
        handle, key, generation = entry
        error = lib.TRITONSERVER_InferenceRequestRemoveAllInputs(handle)
        if error:
            _pool.delete_request(lib, handle)
            lib.check(error)
    else:
        generation = pool.generation if pool is not None else 0  # read before New (see _pool)
        out = ctypes.c_void_p()
        error = lib.TRITONSERVER_InferenceRequestNew(ctypes.byref(out), server_handle, *model_key)
        if error:
            lib.check(error)
        handle, key = out.value or 0, next(_KEYS)
    keep: List[object] = []
    try:
        _fill(lib, handle, request, keep)
        state.inputs = keep
        state.handle = handle
        if entry is None:
            error = lib.TRITONSERVER_InferenceRequestSetReleaseCallback(handle, _REQUEST_RELEASE_CB, key)
            if error:
                lib.check(error)
            error = lib.TRITONSERVER_InferenceRequestSetResponseCallback(
                handle, allocator, key, _RESPONSE_COMPLETE_CB, key
            )
            if error:
                lib.check(error)
        if pool is not None:
            state.pool, state.model_key, state.pool_entry = pool, model_key, (handle, key, generation)
        _INFLIGHT[key] = state
        error = lib.TRITONSERVER_ServerInferAsync(server_handle, handle, None)
        if error:
            lib.check(error)
    except BaseException:
        _INFLIGHT.pop(key, None)
        state.handle = None
        state.inputs = None
        state.pool_entry = None
        lib.check(lib.TRITONSERVER_InferenceRequestDelete(handle))  # still ours: Triton refused it
        raise
    return state


def _is_plain(request: InferenceRequest) -> bool:
    """True if ``request`` sets inputs only: what a pooled request can be reused for (see _pool)."""
    return (
        request.request_id is None
        and not request.flags
        and request.correlation_id is None
        and not request.priority
        and not request.timeout
        and not request.parameters
    )


def cancel(lib: _lib.Library, state: _RequestState) -> None:
    """Ask Triton to cancel the request if it has not been released yet (best effort)."""
    with state.lock:
        if state.handle is not None and not state.released:
            lib.check(lib.TRITONSERVER_InferenceRequestCancel(state.handle))


# -- iterators --------------------------------------------------------------------------------------
class _Responses:
    """What the blocking and asyncio iterators share: ending on the final response or an error."""

    _model: Model
    _lib: _lib.Library
    _state: _RequestState
    _raise_on_error: bool
    _done: bool

    def _server_stopped(self) -> UnavailableError:
        """The error for a wait that found the server stopped (it ends the iteration)."""
        self._done = True
        return UnavailableError("The server stopped before the request completed")

    def _accept(self, response: InferenceResponse) -> InferenceResponse:
        """Return ``response``, ending the iteration after the final one; raise its error if asked."""
        if response.final:
            self._done = True
        if response.error is not None and self._raise_on_error:
            self._done = True
            raise response.error
        return response

    def cancel(self) -> None:
        """Cancel the request (best effort: a request already executing may still complete)."""
        cancel(self._lib, self._state)


class ResponseIterator(_Responses):
    """Blocking iterator over a request's responses, in arrival order; stops after the final one."""

    def __init__(
        self,
        model: Model,
        request: InferenceRequest,
        user_queue: Optional[queue.Queue[InferenceResponse]] = None,
        raise_on_error: bool = False,
    ):
        self._model = model
        self._queue: queue.SimpleQueue[InferenceResponse] = queue.SimpleQueue()
        self._user_queue = user_queue
        self._raise_on_error = raise_on_error
        self._done = False
        self._lib = model._server._library()
        self._state = submit(self._lib, model._server._handle_or_raise(), request, self._deliver)

    def _deliver(self, response: InferenceResponse) -> None:
        self._queue.put(response)
        if self._user_queue is not None:
            self._user_queue.put(response)

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            raise StopIteration
        while True:
            try:
                response = self._queue.get(timeout=_WAIT_SLICE_S)
                break
            except queue.Empty:
                if not self._model._server._running():
                    raise self._server_stopped() from None
        return self._accept(response)


class AsyncResponseIterator(_Responses):
    """``async for`` iterator over a request's responses, delivered into ``loop``."""

    def __init__(
        self,
        model: Model,
        request: InferenceRequest,
        user_queue: Optional[asyncio.Queue[InferenceResponse]] = None,
        raise_on_error: bool = False,
        loop: Optional[asyncio.AbstractEventLoop] = None,
    ):
        self._model = model
        self._loop = loop or asyncio.get_running_loop()
        self._queue: asyncio.Queue[InferenceResponse] = asyncio.Queue()
        self._user_queue = user_queue
        self._raise_on_error = raise_on_error
        self._done = False
        self._lib = model._server._library()
        self._state = submit(self._lib, model._server._handle_or_raise(), request, self._deliver)

    def _put(self, response: InferenceResponse) -> None:
        self._queue.put_nowait(response)
        if self._user_queue is not None:
            self._user_queue.put_nowait(response)

    def _deliver(self, response: InferenceResponse) -> None:
        try:
            self._loop.call_soon_threadsafe(self._put, response)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def __aiter__(self) -> AsyncResponseIterator:
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._done:
            raise StopAsyncIteration
        while True:
            try:
                response = await asyncio.wait_for(self._queue.get(), _WAIT_SLICE_S)
                break
            except asyncio.TimeoutError:
                if not self._model._server._running():
                    raise self._server_stopped() from None
        return self._accept(response)
