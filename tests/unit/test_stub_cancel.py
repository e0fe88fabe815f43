"""Requests cancelled while they queued are answered, not run (``pytriton/proxy/stubside/_stub_cancel.py``).

The gate with a fake clock (when Triton is asked at all), and the proxy model (``_stub.py``) driven
through test_stub.py's fake ``triton_python_backend_utils`` and fake worker: after a long batch,
a batch's cancelled requests never reach the worker, are answered as cancelled and counted, and
the others of the batch are served; a batch after a short one is not asked about (its cost).
"""

from __future__ import annotations

import queue
import socket
import types

import numpy as np
import pytest

from pytriton.proxy.stubside import _messages, _stub_cancel, _stub_metrics
from tests.unit.test_backend_kind import _model, _no_batch_reached, _x, inline  # noqa: F401 - fixture
from tests.unit.test_stub import FINAL, TIMEOUT_S, FakeRequest, _ok, pool, setup, stub  # noqa: F401 - fixtures

# -- the gate -----------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_gate_arms_only_after_a_long_batch_and_for_a_short_gap():
    clock = Clock()
    gate = _stub_cancel.Gate(check_after_s=0.01, gap_s=0.05, clock=clock)
    assert clock() >= gate.until  # a fresh instance asks nothing
    gate.ran(100.0, 100.005)  # short: queued requests waited at most that long
    assert gate.until <= 100.005
    gate.ran(100.0, 100.5)  # long: the next batch, if it starts within the gap, was queued behind it
    assert 100.52 < gate.until <= 100.55
    clock.now = 100.6
    assert clock() >= gate.until  # too late: that batch did not queue behind the long one
    gate.dropped()  # cancelled requests dropped: more may wait
    assert gate.until == pytest.approx(100.65)


class Asked:
    def __init__(self, cancelled, fails=False):
        self.flag = cancelled
        self.fails = fails
        self.asked = 0

    def is_cancelled(self):
        self.asked += 1
        if self.fails:
            raise RuntimeError("the server is going away")
        return self.flag


def test_cancelled_asks_each_request_once_and_never_drops_on_a_failed_question():
    requests = [Asked(False), Asked(True), Asked(True, fails=True), Asked(True)]
    assert _stub_cancel.cancelled(requests) == [1, 3]
    assert [request.asked for request in requests] == [1, 1, 1, 1]


def test_merge_keeps_the_request_order():
    assert _stub_cancel.merge(4, [0, 2], lambda: "c", ["a", "b"]) == ["c", "a", "c", "b"]
    assert _stub_cancel.merge(2, [0, 1], lambda: "c", None) == ["c", "c"]


def test_the_cancelled_counter_is_exported():
    metrics = _stub_metrics.StubMetrics(types.ModuleType("fake"), model="M", version="1", instance=0)
    metrics.cancelled(3)
    metrics.cancelled(2)
    names = [name for name, _ in metrics._series_labels()]
    assert metrics._values()[names.index(_stub_metrics.CANCELLED)] == 5
    _stub_metrics.NULL.cancelled(1)  # the metrics off: nothing to count, nothing fails


# -- the proxy model ----------------------------------------------------------------------------


class Counted:
    def __init__(self):
        self.cancelled_requests = 0

    def cancelled(self, n):
        self.cancelled_requests += n

    def enter(self, n):
        pass

    def leave(self):
        pass

    def settled(self, final):
        pass


def _request(value, cancelled=False):
    request = FakeRequest({"x": np.array([value], np.int32)})
    request.cancelled = cancelled
    return request


def _serve(channel, replies, times=1):
    """Answer ``times`` INFER messages with y = x * 10; put each batch's x values on ``replies``."""
    for _ in range(times):
        message = channel.recv()
        assert type(message) is _messages.Infer, message
        values = [int(value) for value in _inputs_x(message)]
        replies.put(values)
        channel.send(_ok(None, [{"y": np.array([value * 10], np.int32)} for value in values]))


def _inputs_x(message):
    from pytriton.proxy.stubside import _tensors

    return [_tensors.read_tensor(None, entry.tensors[0], True)[0] for entry in message.entries]


def test_after_a_long_batch_cancelled_requests_are_answered_without_running(pool, setup):  # noqa: F811 - pool first: its teardown comes last
    worker = setup.worker()
    model = setup.model()
    metrics = model._metrics = Counted()
    channel = worker.channel()
    seen: queue.SimpleQueue = queue.SimpleQueue()

    # A request cancelled after a short batch (or none) still runs: Triton is not asked (its cost).
    future = pool.submit(model.execute, [_request(1, cancelled=True)])
    _serve(channel, seen)
    assert future.result(TIMEOUT_S)[0].error is None and seen.get_nowait() == [1]

    # A long batch: the requests that queued behind it are asked about.
    future = pool.submit(model.execute, [_request(2)])
    message = channel.recv()
    # How long "long" is, is the gate's test above; here every batch counts as long, and the next
    # one as queued behind it (a loaded machine may take any time between two submits).
    model._cancel_gate.check_after_s = 0.0
    model._cancel_gate.gap_s = 3600.0
    channel.send(_ok(None, [{"y": np.array([20], np.int32)} for _ in message.entries]))
    assert future.result(TIMEOUT_S)[0].error is None

    # Behind it: two of three cancelled. Only the third reaches the worker; the answers keep their order.
    future = pool.submit(model.execute, [_request(3, True), _request(4), _request(5, True)])
    _serve(channel, seen)
    responses = future.result(TIMEOUT_S)
    assert seen.get_nowait() == [4]
    assert [r.error.message() if r.error else None for r in responses] == [
        _stub_cancel.CANCELLED_TEXT,
        None,
        _stub_cancel.CANCELLED_TEXT,
    ]
    assert int(responses[1].outputs()["y"][0]) == 40
    assert metrics.cancelled_requests == 2

    # A batch all of whose clients cancelled never reaches the worker.
    responses = pool.submit(model.execute, [_request(6, True), _request(7, True)]).result(TIMEOUT_S)
    assert [r.error.message() for r in responses] == [_stub_cancel.CANCELLED_TEXT] * 2
    assert metrics.cancelled_requests == 4
    channel.sock.setblocking(False)
    try:
        with pytest.raises(BlockingIOError):  # nothing was sent to the worker for that batch
            channel.sock.recv(1, socket.MSG_PEEK)
    finally:
        channel.sock.settimeout(TIMEOUT_S)

    # Healthy traffic beside: the next batch is served in full, in step.
    future = pool.submit(model.execute, [_request(8), _request(9)])
    _serve(channel, seen)
    assert [int(r.outputs()["y"][0]) for r in future.result(TIMEOUT_S)] == [80, 90]
    assert seen.get_nowait() == [8, 9]


def test_a_stream_model_answers_its_cancelled_requests_through_their_senders(pool, setup):  # noqa: F811 - pool first: its teardown comes last
    worker = setup.worker()
    model = setup.model(decoupled=True)
    metrics = model._metrics = Counted()
    worker.channel()
    model._cancel_gate.until = float("inf")  # as right after a long batch
    requests = [_request(1, True), _request(2, True)]
    assert pool.submit(model.execute, requests).result(TIMEOUT_S) is None
    for request in requests:  # one final CANCELLED answer each; nothing reached the worker
        ((response, flags),) = request.sender.sent
        assert flags == FINAL and response.error.message() == _stub_cancel.CANCELLED_TEXT
    assert metrics.cancelled_requests == 2


# -- a backend instance's short path (stubside/_inline.py) --------------------------------------

RAN: list = []  # the x of every request the callable below ran (it runs in this process here)


def doubled(requests):
    RAN.extend(float(request["x"][0, 0]) for request in requests)
    return [{"y": request["x"] * 2} for request in requests]


def test_the_backend_kind_short_path_drops_cancelled_requests_after_a_long_batch(setup, inline, monkeypatch):  # noqa: F811
    worker = setup.worker()
    model = _model(setup, inline, doubled)
    assert model.execute == model._execute_short  # the common case's path
    RAN.clear()
    cancelled_early = FakeRequest(_x(1))
    cancelled_early.cancelled = True
    # Not right after a long batch: Triton is not asked, the request runs.
    monkeypatch.setattr(_stub_cancel, "CHECK_AFTER_S", 0.0)  # from here, every batch counts as long
    monkeypatch.setattr(_stub_cancel, "GAP_S", 3600.0)
    assert model.execute([cancelled_early])[0].error is None and RAN == [1.0]
    # That batch armed the check: of the next batch, the cancelled request is answered, the other runs.
    cancelled, healthy = FakeRequest(_x(2)), FakeRequest(_x(3))
    cancelled.cancelled = True
    responses = model.execute([cancelled, healthy])
    assert responses[0].error.message() == _stub_cancel.CANCELLED_TEXT
    np.testing.assert_array_equal(responses[1].outputs()["y"], [[6]])
    assert RAN == [1.0, 3.0]
    _no_batch_reached(worker)
