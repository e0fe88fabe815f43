"""inprocess/_pool.py and the reuse of released requests by inprocess/_request.py, on a fake library.

The fake keeps each request handle's inputs the way Triton does (``AddInput`` and
``AppendInputData`` add, ``RemoveAllInputs`` clears) and records what every ``ServerInferAsync``
sent; the tests play Triton's side by calling the response and release callbacks themselves.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict, List, Set, Tuple

import numpy as np
import pytest

from pytriton.inprocess import _lib, _pool, _request
from pytriton.inprocess._enums import RequestReleaseFlag, ResponseCompleteFlag
from pytriton.inprocess._errors import InvalidArgumentError, error_from_code

REFUSED = 777  # the error pointer the fake returns when told to refuse a request


class FakeTriton:
    """The C functions of a request's life, on Python objects (handles are ints)."""

    def __init__(self) -> None:
        self.next_handle = 100
        self.created: List[int] = []
        self.deleted: List[int] = []
        self.inputs: Dict[int, Dict[bytes, List[Any]]] = {}
        self.keys: Dict[int, Tuple[int, int]] = {}  # handle -> (release key, response key)
        self.sent: List[Tuple[int, Dict[bytes, List[Any]]]] = []
        self.in_triton: Set[int] = set()
        self.refuse = False

    # -- the library surface _request and _pool use ------------------------------------------------
    def check(self, error: Any) -> None:
        if error:
            raise error_from_code(3, "refused by the fake")

    def error_message(self, error: Any) -> str:
        return "fake error"

    def TRITONSERVER_ErrorDelete(self, error: Any) -> None:  # noqa: N802 - the C API's names
        pass

    def TRITONSERVER_InferenceRequestNew(self, out: Any, server: Any, name: bytes, version: int) -> None:  # noqa: N802
        self.next_handle += 1
        out._obj.value = self.next_handle
        self.created.append(self.next_handle)
        self.inputs[self.next_handle] = {}

    def TRITONSERVER_InferenceRequestRemoveAllInputs(self, handle: int) -> None:  # noqa: N802
        assert handle not in self.in_triton, "cleared while Triton owns it"
        self.inputs[handle].clear()

    def TRITONSERVER_InferenceRequestAddInput(
        self, handle: int, name: bytes, dtype: int, shape: Any, dims: int
    ) -> None:  # noqa: N802
        assert name not in self.inputs[handle], "Triton refuses an input added twice"
        self.inputs[handle][name] = [dtype, list(shape[:dims]), None]

    def TRITONSERVER_InferenceRequestAppendInputData(
        self, handle: int, name: bytes, ptr: int, size: int, *_: Any
    ) -> None:  # noqa: N802
        self.inputs[handle][name][2] = (ptr, size)

    def TRITONSERVER_InferenceRequestSetReleaseCallback(self, handle: int, function: Any, key: int) -> None:  # noqa: N802
        self.keys[handle] = (key, self.keys.get(handle, (0, 0))[1])

    def TRITONSERVER_InferenceRequestSetResponseCallback(
        self, handle: int, allocator: Any, akey: int, function: Any, key: int
    ) -> None:  # noqa: N802
        self.keys[handle] = (self.keys[handle][0], key)

    def TRITONSERVER_ServerInferAsync(self, server: Any, handle: int, trace: Any) -> Any:  # noqa: N802
        assert handle not in self.in_triton and handle not in self.deleted
        if self.refuse:
            return REFUSED
        self.in_triton.add(handle)
        self.sent.append((handle, {name: list(value) for name, value in self.inputs[handle].items()}))
        return None

    def TRITONSERVER_InferenceRequestDelete(self, handle: int) -> None:  # noqa: N802
        assert handle not in self.in_triton, "deleted while Triton owns it"
        assert handle not in self.deleted, "deleted twice"
        self.deleted.append(handle)

    # -- Triton's side ----------------------------------------------------------------------------
    def complete(self, handle: int, release_first: bool = False) -> None:
        """The final (empty) response and the release, in either order."""
        release_key, response_key = self.keys[handle]

        def release() -> None:
            self.in_triton.discard(handle)
            _request._request_released(handle, int(RequestReleaseFlag.ALL), release_key)

        def respond() -> None:
            _request._response_complete(None, int(ResponseCompleteFlag.FINAL), response_key)

        for step in (release, respond) if release_first else (respond, release):
            step()


@pytest.fixture
def fake(monkeypatch):
    triton = FakeTriton()
    monkeypatch.setattr(_lib, "library", lambda *_: triton)
    monkeypatch.setattr(_request, "_ALLOCATOR", 1)  # never create one: later tests may use the real library
    yield triton
    assert _request.inflight_count() == 0


@pytest.fixture
def model():
    server = SimpleNamespace(_requests=_pool.RequestPool(), _handle=1)
    return SimpleNamespace(name="m", version=1, _server=server)


def send(fake: FakeTriton, model: Any, responses: List[Any], **fields: Any) -> int:
    """Submit a request; returns the handle it went out on."""
    _request.submit(fake, 1, _request.InferenceRequest(model=model, **fields), responses.append)  # type: ignore[arg-type]
    return fake.sent[-1][0]


@pytest.mark.parametrize("release_first", [False, True])
def test_a_released_plain_request_is_reused_carrying_only_the_new_inputs(fake, model, release_first):
    responses: List[Any] = []
    first = np.ones((1, 4), np.float32)
    handle = send(fake, model, responses, inputs={"A": first, "B": np.zeros(2, np.int32)})
    fake.complete(handle, release_first)
    assert model._server._requests.idle_count() == 1 and fake.deleted == []
    second = np.full((2, 3), 7, np.float32)
    again = send(fake, model, responses, inputs={"A": second})
    assert again == handle and fake.created == [handle]  # no InferenceRequestNew, same callbacks
    sent_inputs = fake.sent[-1][1]
    assert list(sent_inputs) == [b"A"]  # nothing of the previous call's inputs
    assert sent_inputs[b"A"][1:] == [[2, 3], (second.ctypes.data, second.nbytes)]
    fake.complete(again, release_first)
    assert [response.final for response in responses] == [True, True]
    model._server._requests.close(fake)
    assert fake.deleted == [handle]  # exactly once, when the pool closed


def test_a_request_is_pooled_only_once_released_and_finished(fake, model):
    responses: List[Any] = []
    pool = model._server._requests
    handle = send(fake, model, responses, inputs={"A": np.ones(1, np.float32)})
    other = send(fake, model, responses, inputs={"A": np.ones(1, np.float32)})  # none idle: a new one
    assert other != handle and len(fake.created) == 2
    release_key, response_key = fake.keys[handle]
    fake.in_triton.discard(handle)
    _request._request_released(handle, int(RequestReleaseFlag.ALL), release_key)
    assert pool.idle_count() == 0  # released, final response still to come
    _request._request_released(handle, int(RequestReleaseFlag.RESCHEDULE), release_key)  # not a release
    _request._response_complete(None, int(ResponseCompleteFlag.FINAL), response_key)
    assert pool.idle_count() == 1
    fake.complete(other)
    assert pool.idle_count() == 2
    pool.close(fake)
    assert sorted(fake.deleted) == sorted(fake.created)


@pytest.mark.parametrize(
    "fields",
    [
        {"request_id": "r1"},
        {"flags": 1},
        {"correlation_id": 5},
        {"correlation_id": "seq"},
        {"priority": 2},
        {"timeout": 1000},
        {"parameters": {"p": 1}},
    ],
)
def test_requests_with_more_than_inputs_are_deleted_not_pooled(fake, model, monkeypatch, fields):
    for name in (
        "SetId", "SetFlags", "SetCorrelationId", "SetCorrelationIdString", "SetPriorityUInt64",
        "SetTimeoutMicroseconds", "SetIntParameter",
    ):  # fmt: skip
        monkeypatch.setattr(fake, f"TRITONSERVER_InferenceRequest{name}", lambda *_: None, raising=False)
    responses: List[Any] = []
    handle = send(fake, model, responses, inputs={"A": np.ones(1, np.float32)}, **fields)
    fake.complete(handle)
    assert fake.deleted == [handle] and model._server._requests.idle_count() == 0
    again = send(fake, model, responses, inputs={"A": np.ones(1, np.float32)})
    assert again != handle  # a plain request after it gets a new one
    fake.complete(again)
    model._server._requests.close(fake)
    assert fake.deleted == [handle, again]


def test_a_reused_request_that_triton_refuses_is_deleted_once(fake, model):
    responses: List[Any] = []
    handle = send(fake, model, responses, inputs={"A": np.ones(1, np.float32)})
    fake.complete(handle)
    fake.refuse = True
    with pytest.raises(InvalidArgumentError, match="refused"):
        _request.submit(fake, 1, _request.InferenceRequest(model=model, inputs={"A": np.ones(1)}), responses.append)  # type: ignore[arg-type]
    assert fake.deleted == [handle] and model._server._requests.idle_count() == 0
    fake.refuse = False
    assert send(fake, model, responses, inputs={"A": np.ones(1, np.float32)}) != handle
    fake.complete(fake.sent[-1][0])
    model._server._requests.close(fake)
    assert sorted(fake.deleted) == sorted(fake.created)


def test_invalidate_and_close_delete_idle_requests_and_refuse_older_ones(fake, model):
    responses: List[Any] = []
    pool = model._server._requests
    first = send(fake, model, responses, inputs={"A": np.ones(1, np.float32)})
    second = send(fake, model, responses, inputs={"A": np.ones(1, np.float32)})
    fake.complete(first)
    pool.invalidate(fake)  # e.g. Server.load/unload: the idle one goes, the one in flight is stale
    assert fake.deleted == [first]
    fake.complete(second)
    assert fake.deleted == [first, second] and pool.idle_count() == 0
    third = send(fake, model, responses, inputs={"A": np.ones(1, np.float32)})
    pool.close(fake)  # Server.stop: the one in flight is deleted when released
    fake.complete(third)
    assert fake.deleted == [first, second, third] and pool.idle_count() == 0
    assert len(responses) == 3


def test_the_pool_keeps_at_most_capacity_per_model():
    pool = _pool.RequestPool(capacity=2)
    model = (b"m", -1)
    assert [pool.put(model, (handle, handle, 0)) for handle in (1, 2, 3)] == [True, True, False]
    assert pool.put((b"other", -1), (4, 4, 0))
    assert pool.idle_count(model) == 2 and pool.idle_count((b"other", -1)) == 1 and pool.idle_count() == 3
    assert pool.put(model, (5, 5, 1)) is False  # made in another generation
    assert pool.take(model) == (2, 2, 0) and pool.take(model) == (1, 1, 0) and pool.take(model) is None
    deleted: List[int] = []
    lib = SimpleNamespace(TRITONSERVER_InferenceRequestDelete=lambda handle: deleted.append(handle))
    pool.close(lib)
    assert deleted == [4] and pool.put(model, (6, 6, pool.generation)) is False


def test_delete_request_logs_an_error_and_deletes_it(caplog):
    errors: List[int] = []
    lib = SimpleNamespace(
        TRITONSERVER_InferenceRequestDelete=lambda handle: 99,
        error_message=lambda error: "busy",
        TRITONSERVER_ErrorDelete=errors.append,
    )
    _pool.delete_request(lib, 5)
    assert errors == [99] and "busy" in caplog.text


def test_a_request_sent_through_another_server_is_not_pooled(fake, model):
    responses: List[Any] = []
    request = _request.InferenceRequest(model=model, inputs={"A": np.ones(1, np.float32)})
    _request.submit(fake, 2, request, responses.append)  # type: ignore[arg-type]  # not model's server (1)
    handle = fake.sent[-1][0]
    fake.complete(handle)
    assert fake.deleted == [handle] and model._server._requests.idle_count() == 0
