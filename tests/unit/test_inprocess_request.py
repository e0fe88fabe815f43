"""inprocess/_request.py without the Triton library: response iterators, cancel, parameter decoding.

``submit`` (which needs the library) is replaced by a fake that keeps the ``deliver`` callback, so
the tests deliver responses the way Triton's response callback does.
"""

from __future__ import annotations

import asyncio
import ctypes
import queue
import threading
from types import SimpleNamespace
from typing import Any, Callable, List

import pytest

from pytriton.inprocess import _request
from pytriton.inprocess._enums import ParameterType, RequestReleaseFlag
from pytriton.inprocess._errors import InvalidArgumentError, UnavailableError
from pytriton.inprocess._request import AsyncResponseIterator, InferenceRequest, InferenceResponse, ResponseIterator


class FakeLib:
    def __init__(self) -> None:
        self.cancelled: List[Any] = []

    def check(self, error: Any) -> None:
        assert error is None

    def TRITONSERVER_InferenceRequestCancel(self, handle: Any) -> None:  # noqa: N802 - the C API's name
        self.cancelled.append(handle)


@pytest.fixture
def model(monkeypatch):
    """A model whose server runs (``model.running = False`` stops it); ``model.deliver`` sends responses."""
    lib = FakeLib()
    model = SimpleNamespace(name="m", version=1, running=True, lib=lib, deliver=None, requests=[])
    model._server = SimpleNamespace(_library=lambda: lib, _handle_or_raise=lambda: 1234, _running=lambda: model.running)

    def fake_submit(lib: Any, server_handle: int, request: Any, deliver: Callable[[Any], None]) -> Any:
        assert server_handle == 1234
        model.deliver = deliver
        model.requests.append(request)
        return SimpleNamespace(handle=5678, released=False, lock=threading.Lock())

    monkeypatch.setattr(_request, "submit", fake_submit)
    monkeypatch.setattr(_request, "_WAIT_SLICE_S", 0.01)
    return model


def _response(model: Any, final: bool = False, error: Any = None, request_id: str = "r") -> InferenceResponse:
    return InferenceResponse(model=model, request_id=request_id, final=final, error=error)


def test_the_iterator_yields_in_order_and_ends_after_the_final_response(model):
    user_queue: queue.SimpleQueue[InferenceResponse] = queue.SimpleQueue()
    request = InferenceRequest(model=model)
    iterator = ResponseIterator(model, request, user_queue=user_queue)
    assert model.requests == [request]
    model.deliver(_response(model, request_id="first"))
    model.deliver(_response(model, final=True, request_id="last"))
    assert [response.request_id for response in iterator] == ["first", "last"]
    assert [user_queue.get_nowait().request_id for _ in range(2)] == ["first", "last"]
    with pytest.raises(StopIteration):
        next(iterator)


def test_an_error_response_is_raised_only_when_asked(model):
    failure = InvalidArgumentError("bad input")
    quiet = ResponseIterator(model, InferenceRequest(model=model))
    model.deliver(_response(model, final=True, error=failure))
    assert next(quiet).error is failure
    loud = ResponseIterator(model, InferenceRequest(model=model), raise_on_error=True)
    model.deliver(_response(model, error=failure))
    with pytest.raises(InvalidArgumentError, match="bad input"):
        next(loud)
    with pytest.raises(StopIteration):  # nothing more after the error
        next(loud)


def test_a_stopped_server_ends_a_waiting_iterator(model):
    iterator = ResponseIterator(model, InferenceRequest(model=model))
    model.running = False
    with pytest.raises(UnavailableError, match="stopped before the request completed"):
        next(iterator)
    with pytest.raises(StopIteration):
        next(iterator)


def test_cancel_asks_triton_only_while_it_holds_the_request(model):
    iterator = ResponseIterator(model, InferenceRequest(model=model))
    iterator.cancel()
    assert model.lib.cancelled == [5678]
    iterator._state.released = True
    iterator.cancel()
    assert model.lib.cancelled == [5678]


def test_the_async_iterator_receives_responses_from_triton_threads(model):
    async def main() -> List[str]:
        user_queue: asyncio.Queue[InferenceResponse] = asyncio.Queue()
        iterator = AsyncResponseIterator(model, InferenceRequest(model=model), user_queue=user_queue)
        sender = threading.Thread(
            target=lambda: [model.deliver(_response(model, final=i == 2, request_id=str(i))) for i in range(3)]
        )
        sender.start()
        received = [response.request_id async for response in iterator]
        sender.join()
        assert user_queue.qsize() == 3
        return received

    assert asyncio.run(main()) == ["0", "1", "2"]


def test_the_async_iterator_raises_errors_when_asked_and_stops_with_the_server(model):
    async def main() -> None:
        iterator = AsyncResponseIterator(model, InferenceRequest(model=model), raise_on_error=True)
        model.deliver(_response(model, error=InvalidArgumentError("bad")))
        with pytest.raises(InvalidArgumentError):
            await iterator.__anext__()
        waiting = AsyncResponseIterator(model, InferenceRequest(model=model))
        model.running = False
        with pytest.raises(UnavailableError):
            await waiting.__anext__()

    asyncio.run(main())


def test_response_parameters_are_decoded_by_type():
    text, number, flag, real = ctypes.c_char_p(b"hello"), ctypes.c_int64(-7), ctypes.c_bool(True), ctypes.c_double(2.5)

    def address(value: Any) -> int:
        return ctypes.cast(ctypes.pointer(value), ctypes.c_void_p).value or 0

    assert _request._parameter_value(ParameterType.STRING, ctypes.cast(text, ctypes.c_void_p).value) == "hello"
    assert _request._parameter_value(ParameterType.INT, address(number)) == -7
    assert _request._parameter_value(ParameterType.BOOL, address(flag)) is True
    assert _request._parameter_value(ParameterType.DOUBLE, address(real)) == 2.5
    assert _request._parameter_value(ParameterType.BYTES, address(number)) is None
    assert _request._parameter_value(ParameterType.INT, None) is None


def test_a_request_released_for_rescheduling_is_left_alone(monkeypatch):
    def no_library() -> Any:
        raise AssertionError("the library must not be touched")

    monkeypatch.setattr(_request._lib, "library", no_library)
    _request._request_released(1234, int(RequestReleaseFlag.RESCHEDULE), 1)


def test_request_defaults():
    request = InferenceRequest(model="m")
    assert (request.request_id, request.flags, request.correlation_id, request.priority, request.timeout) == (
        None,
        0,
        None,
        0,
        0,
    )
    assert request.inputs == {} and request.parameters == {} and request.inputs is not InferenceRequest("m").inputs
