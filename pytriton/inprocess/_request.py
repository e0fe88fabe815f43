"""Inference requests, responses and response iterators on the C API's asynchronous inference.

Lifetimes and ownership (each Triton object is deleted exactly once):

* ``TRITONSERVER_InferenceRequest``: created by :func:`submit`; if ``ServerInferAsync`` fails it is
  deleted there, otherwise Triton owns it until the release callback, which deletes it and drops the
  input tensors kept alive for it (inputs are handed to Triton without a copy).
* ``TRITONSERVER_InferenceResponse``: read in the response callback (on a Triton thread), turned into
  an :class:`InferenceResponse` and deleted at once. Output memory comes from a Python allocator, so
  the output :class:`Tensor` objects keep that memory alive after the delete (no copy).
* The response allocator is created once per process and lives as long as the loaded library.

A request's bookkeeping entry is dropped when it is both released and has seen its final response.

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
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Union

from pytriton.inprocess import _lib
from pytriton.inprocess._enums import (
    DataType,
    ErrorCode,
    MemoryType,
    ParameterType,
    RequestReleaseFlag,
    ResponseCompleteFlag,
)
from pytriton.inprocess._errors import InvalidArgumentError, TritonError, UnavailableError, error_from_code
from pytriton.inprocess._tensor import MemoryAllocator, MemoryBuffer, NumpyAllocator, Tensor, parse_device

if TYPE_CHECKING:
    from pytriton.inprocess._server import Model

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
    output_memory_type: Optional[Any] = None
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
    """Bookkeeping of one in-flight request, shared by the Triton callbacks and the iterator."""

    def __init__(self, model: Model, allocator: MemoryAllocator, deliver: Callable[[InferenceResponse], None]):
        self.model = model
        self.allocator = allocator
        self.deliver = deliver
        self.handle: Optional[int] = None
        self.inputs: Optional[List[Tensor]] = []
        self.released = False
        self.finished = False
        self.lock = threading.Lock()


_REGISTRY_LOCK = threading.Lock()
_KEYS = itertools.count(1)
_INFLIGHT: Dict[int, _RequestState] = {}
_BUFFERS: Dict[int, MemoryBuffer] = {}


def inflight_count() -> int:
    """Requests not yet both released and finished (for tests and diagnostics)."""
    with _REGISTRY_LOCK:
        return len(_INFLIGHT)


def _forget_if_done(key: int, state: _RequestState) -> None:
    if state.released and state.finished:
        with _REGISTRY_LOCK:
            _INFLIGHT.pop(key, None)


# -- callbacks (run on Triton threads; never let an exception escape) -----------------------------
def _alloc(
    allocator: Any,
    tensor_name: Any,
    byte_size: int,
    memory_type: int,
    memory_type_id: int,
    userp: Optional[int],
    buffer: Any,
    buffer_userp: Any,
    actual_type: Any,
    actual_id: Any,
) -> Optional[int]:
    lib = _lib.library()
    try:
        with _REGISTRY_LOCK:
            state = _INFLIGHT.get(int(userp or 0))
        chosen = state.allocator if state is not None else NumpyAllocator()
        memory = chosen.allocate(int(byte_size), MemoryType(memory_type), int(memory_type_id))
        if memory.memory_type == MemoryType.GPU:
            return lib.new_error(ErrorCode.UNSUPPORTED, "GPU output memory is not supported in-process here")
        if memory.size < byte_size:
            return lib.new_error(ErrorCode.INTERNAL, f"allocator returned {memory.size} bytes, {byte_size} needed")
        key = next(_KEYS)
        with _REGISTRY_LOCK:
            _BUFFERS[key] = memory
        buffer[0] = memory.data_ptr
        buffer_userp[0] = key
        actual_type[0] = int(memory.memory_type)
        actual_id[0] = int(memory.memory_type_id)
        return None
    except BaseException as exc:  # noqa: BLE001  (reported to Triton as the allocation's error)
        return lib.new_error(ErrorCode.INTERNAL, f"output allocation failed: {exc!r}")


def _release(
    allocator: Any, buffer: Any, buffer_userp: Optional[int], byte_size: int, memory_type: int, memory_type_id: int
) -> Optional[int]:
    with _REGISTRY_LOCK:
        _BUFFERS.pop(int(buffer_userp or 0), None)
    return None


def _start(allocator: Any, userp: Any) -> Optional[int]:
    return None


def _request_released(request: Optional[int], flags: int, userp: Optional[int]) -> None:
    if not flags & RequestReleaseFlag.ALL:
        return
    lib = _lib.library()
    key = int(userp or 0)
    try:
        with _REGISTRY_LOCK:
            state = _INFLIGHT.get(key)
        if state is not None:
            with state.lock:
                state.released = True
                state.handle = None
                state.inputs = None  # Triton no longer reads the input buffers
        error = lib.TRITONSERVER_InferenceRequestDelete(request)
        if error:
            LOGGER.warning("deleting a released request failed: %s", lib.error_message(error))
            lib.TRITONSERVER_ErrorDelete(error)
        if state is not None:
            _forget_if_done(key, state)
    except BaseException:  # noqa: BLE001
        LOGGER.exception("request release callback failed")


def _read_response(lib: _lib.Library, model: Model, response: int, final: bool) -> InferenceResponse:
    result = InferenceResponse(model=model, final=final)
    error = lib.TRITONSERVER_InferenceResponseError(response)  # owned by the response: not deleted here
    if error:
        result.error = error_from_code(lib.TRITONSERVER_ErrorCode(error), lib.error_message(error))
    name = ctypes.c_char_p()
    if not lib.TRITONSERVER_InferenceResponseId(response, ctypes.byref(name)) and name.value:
        result.request_id = name.value.decode()
    count = ctypes.c_uint32()
    lib.check(lib.TRITONSERVER_InferenceResponseParameterCount(response, ctypes.byref(count)))
    for index in range(count.value):
        kind = ctypes.c_int32()
        value = ctypes.c_void_p()
        lib.check(
            lib.TRITONSERVER_InferenceResponseParameter(
                response, index, ctypes.byref(name), ctypes.byref(kind), ctypes.byref(value)
            )
        )
        result.parameters[(name.value or b"").decode()] = _parameter_value(kind.value, value.value)
    lib.check(lib.TRITONSERVER_InferenceResponseOutputCount(response, ctypes.byref(count)))
    for index in range(count.value):
        data_type = ctypes.c_int32()
        shape = ctypes.POINTER(ctypes.c_int64)()
        dims = ctypes.c_uint64()
        base = ctypes.c_void_p()
        size = ctypes.c_size_t()
        memory_type = ctypes.c_int32()
        memory_id = ctypes.c_int64()
        userp = ctypes.c_void_p()
        lib.check(
            lib.TRITONSERVER_InferenceResponseOutput(
                response,
                index,
                ctypes.byref(name),
                ctypes.byref(data_type),
                ctypes.byref(shape),
                ctypes.byref(dims),
                ctypes.byref(base),
                ctypes.byref(size),
                ctypes.byref(memory_type),
                ctypes.byref(memory_id),
                ctypes.byref(userp),
            )
        )
        with _REGISTRY_LOCK:
            owner = _BUFFERS.get(int(userp.value or 0))
        if owner is None:  # not from our allocator (should not happen): copy while the response lives
            import numpy as np

            raw = ctypes.string_at(int(base.value or 0), size.value) if size.value else b""
            copied = np.frombuffer(raw, dtype=np.uint8).copy()
            owner = MemoryBuffer(int(copied.ctypes.data), MemoryType.CPU, 0, size.value, copied)
        buffer = MemoryBuffer(
            int(base.value or owner.data_ptr), MemoryType(memory_type.value), memory_id.value, size.value, owner.owner
        )
        tensor_shape = [int(shape[dim]) for dim in range(dims.value)]
        result.outputs[(name.value or b"").decode()] = Tensor(DataType(data_type.value), tensor_shape, buffer)
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
    key = int(userp or 0)
    final = bool(flags & ResponseCompleteFlag.FINAL)
    try:
        lib = _lib.library()
        with _REGISTRY_LOCK:
            state = _INFLIGHT.get(key)
        if state is None:
            if response:
                lib.check(lib.TRITONSERVER_InferenceResponseDelete(response))
            return
        if response:
            try:
                result = _read_response(lib, state.model, response, final)
            except TritonError as exc:
                result = InferenceResponse(model=state.model, error=exc, final=final)
            finally:
                lib.check(lib.TRITONSERVER_InferenceResponseDelete(response))
            state.deliver(result)
        elif final:
            state.deliver(InferenceResponse(model=state.model, final=True))
        if final:
            state.finished = True
            _forget_if_done(key, state)
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
def _fill(lib: _lib.Library, handle: int, request: InferenceRequest, keep: List[Tensor]) -> None:
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
    for input_name, value in request.inputs.items():
        tensor = Tensor._from_object(value)
        if tensor.memory_type == MemoryType.GPU:
            raise InvalidArgumentError(f"Input {input_name!r} is in GPU memory, which this build cannot read")
        keep.append(tensor)
        shape = (ctypes.c_int64 * max(len(tensor.shape), 1))(*[int(dim) for dim in tensor.shape])
        name = str(input_name).encode()
        lib.check(
            lib.TRITONSERVER_InferenceRequestAddInput(handle, name, int(tensor.data_type), shape, len(tensor.shape))
        )
        lib.check(
            lib.TRITONSERVER_InferenceRequestAppendInputData(
                handle, name, tensor.data_ptr, tensor.size, int(tensor.memory_type), tensor.memory_type_id
            )
        )


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
    allocator = request.output_memory_allocator or NumpyAllocator()
    state = _RequestState(request.model, allocator, deliver)
    handle = ctypes.c_void_p()
    lib.check(
        lib.TRITONSERVER_InferenceRequestNew(
            ctypes.byref(handle), server_handle, request.model.name.encode(), int(request.model.version)
        )
    )
    key = next(_KEYS)
    keep: List[Tensor] = []
    try:
        _fill(lib, int(handle.value or 0), request, keep)
        state.inputs = keep
        state.handle = handle.value
        lib.check(lib.TRITONSERVER_InferenceRequestSetReleaseCallback(handle, _REQUEST_RELEASE_CB, key))
        lib.check(
            lib.TRITONSERVER_InferenceRequestSetResponseCallback(
                handle, _response_allocator(lib), key, _RESPONSE_COMPLETE_CB, key
            )
        )
        with _REGISTRY_LOCK:
            _INFLIGHT[key] = state
        lib.check(lib.TRITONSERVER_ServerInferAsync(server_handle, handle, None))
    except BaseException:
        with _REGISTRY_LOCK:
            _INFLIGHT.pop(key, None)
        state.handle = None
        state.inputs = None
        lib.check(lib.TRITONSERVER_InferenceRequestDelete(handle))  # still ours: Triton refused it
        raise
    return state


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
        self, model: Model, request: InferenceRequest, user_queue: Optional[Any] = None, raise_on_error: bool = False
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
