"""Cancellation through its seams: the stub answers ASK, ``CancelProbe`` asks it, a hung call is ended.

End to end: tests/e2e/test_cancellation.py.
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np

from pytriton.proxy import _worker as _worker_module
from pytriton.proxy._session import CallAbandoned, CancelProbe, _raise_in_thread
from pytriton.proxy.stubside import _arena, _messages, _tensors, _wire
from pytriton.proxy.types import Request
from tests.unit.test_stub import TIMEOUT_S, FakeRequest, _ok, pool, setup, stub  # noqa: F401 - fixtures
from tests.unit.test_worker import _connect, make_worker  # noqa: F401 - the fixture


def test_the_stub_answers_ask_while_it_waits_and_sends_each_timeout(setup, pool):  # noqa: F811
    worker = setup.worker()
    model = setup.model()
    channel = worker.channel()
    requests = [
        FakeRequest({"x": np.array([[1]], np.int32)}, timeout_us=250_000),
        FakeRequest({"x": np.array([[2]], np.int32)}),
    ]
    future = pool.submit(model.execute, requests)
    message = channel.recv()
    assert [raw.timeout_s for raw in message.entries] == [0.25, 0.0]
    channel.send(_messages.ASK_MESSAGE)
    assert channel.recv().flags == [False, False]
    requests[1].cancelled = True
    channel.send(_messages.ASK_MESSAGE)
    assert channel.recv().flags == [False, True]
    arena = _arena.SharedArena(f"{setup.shm_prefix}-w")
    try:
        channel.send(_ok(arena, [{"y": np.array([[1]], np.int32)}, {"y": np.array([[2]], np.int32)}]))
        responses = future.result(TIMEOUT_S)
    finally:
        arena.close()
    assert [response.error for response in responses] == [None, None]


def test_asks_do_not_stretch_the_execution_timeout(setup, pool):  # noqa: F811
    worker = setup.worker()
    model = setup.model(execution_timeout_s=0.3)
    channel = worker.channel()
    started = time.monotonic()
    future = pool.submit(model.execute, [FakeRequest({"x": np.array([[1]], np.int32)})])
    channel.recv()
    while not future.done() and time.monotonic() - started < TIMEOUT_S:
        try:
            channel.send(_messages.ASK_MESSAGE)
            channel.recv()
        except (OSError, EOFError):
            break
        time.sleep(0.02)
    responses = future.result(TIMEOUT_S)
    assert "execution timeout of 0.3 s" in responses[0].error.message()
    assert time.monotonic() - started < TIMEOUT_S


class FakeChannel:
    """The stub's side as CancelProbe sees it: answers each ASK with the current flags."""

    def __init__(self, flags):
        self.flags = flags
        self.asked = 0
        self.pending = None

    def send(self, message):
        assert message == _messages.ASK_MESSAGE
        self.asked += 1
        self.pending = _messages.Cancelled(list(self.flags))

    def recv(self):
        reply, self.pending = self.pending, None
        return reply


def test_the_probe_asks_at_most_once_per_interval_and_remembers_a_cancellation(monkeypatch):
    # An interval no scheduler delay can exceed between two calls (the real one is 1 ms: a loaded machine
    # can pause this thread for longer between them).
    monkeypatch.setattr(CancelProbe, "INTERVAL_S", 3600.0)
    channel = FakeChannel([False, False])
    probe = CancelProbe(channel, 2)
    requests = [Request({}), Request({})]
    for index, request in enumerate(requests):
        request._probe, request._index = probe, index
    assert [request.is_cancelled() for request in requests] == [False, False]
    assert channel.asked == 1  # the second call fell within the interval
    channel.flags = [True, False]
    monkeypatch.setattr(CancelProbe, "INTERVAL_S", 0.0)
    assert requests[0].is_cancelled() and not requests[1].is_cancelled()
    channel.flags = [False, False]
    assert requests[0].is_cancelled()  # stays cancelled, without asking again
    probe.close()
    asked = channel.asked
    assert not requests[1].is_cancelled() and channel.asked == asked  # after the call: the last answer
    probe.cancel_all()
    assert requests[1].is_cancelled()


def test_a_lost_stub_means_cancelled():
    left, right = socket.socketpair()
    right.close()
    probe = CancelProbe(_wire.SocketChannel(left), 1)
    assert probe(0)
    left.close()


def test_a_request_past_its_timeout_is_cancelled_without_asking():
    request = Request({}, timeout_s=0.01)
    assert request.timeout_s == 0.01 and not request.is_cancelled()
    time.sleep(0.02)
    assert request.is_cancelled()
    assert not Request({}).is_cancelled()  # built by hand: no probe, no timeout


def test_call_abandoned_interrupts_pure_python_code():
    outcome = []

    def loop():
        try:
            while True:
                pass
        except CallAbandoned:
            outcome.append("interrupted")

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    assert thread.ident is not None and _raise_in_thread(thread.ident, CallAbandoned)
    thread.join(TIMEOUT_S)
    assert outcome == ["interrupted"]


def _spin(seconds):
    """Pure Python for ``seconds``. In a function of its own: an exception raised in this loop reaches
    the caller at its call, which its ``try`` covers on every CPython (see the next test)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


def _hang_and_give_up(make_worker, func):  # noqa: F811 - the fixture, passed on
    """A thread instance runs ``func`` on a batch; its stub gives up on it (execution timeout) and
    reconnects. Returns the worker and the reconnected socket (closed by the caller)."""
    worker, _ = make_worker(func)
    first_sock, first = _connect(worker)
    segment, metas = _tensors.write_tensors(None, [[("k", np.array([[-1]], np.int32))]])
    first.send(_messages.Infer(segment, [_messages.Entry(metas[0])]))
    deadline = time.monotonic() + TIMEOUT_S
    while not (worker._sessions and worker._sessions[0].in_callable) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker._sessions[0].in_callable, "the callable was not called"
    first_sock.close()  # the stub's execution timeout ...
    second_sock, _ = _connect(worker)  # ... and its reconnection
    return worker, second_sock


def test_a_stub_giving_up_ends_the_hung_call_of_a_thread_instance(make_worker):  # noqa: F811
    results = []

    def func(requests):
        try:
            _spin(30)
        except CallAbandoned:
            results.append((requests[0].is_cancelled(), "abandoned"))
            raise
        return [{"y": r["k"]} for r in requests]

    _, second_sock = _hang_and_give_up(make_worker, func)
    deadline = time.monotonic() + TIMEOUT_S
    while not results and time.monotonic() < deadline:
        time.sleep(0.01)
    assert results == [(True, "abandoned")]
    second_sock.close()


def test_the_hung_call_ends_even_where_python_skips_the_callables_handler(make_worker, caplog):  # noqa: F811
    # CPython 3.13 raises an asynchronous exception at a loop's backward jump with a location its
    # exception table may not cover (python/cpython#130279): CallAbandoned can then skip the
    # callable's own except/finally. The call must end all the same, and the worker carry on.
    def func(requests):
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                pass
            requests = requests[:1]  # the loop is not the last statement: the shape that escapes on 3.13.0
        except CallAbandoned:
            raise
        return [{"y": r["k"]} for r in requests]

    worker, second_sock = _hang_and_give_up(make_worker, func)
    deadline = time.monotonic() + TIMEOUT_S
    while len(worker._sessions) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(worker._sessions) == 1, "the hung call did not end"
    assert not [record for record in caplog.records if "crashed" in record.getMessage()]
    second_sock.close()


def test_an_interrupt_after_the_callable_returned_raises_nothing():
    session = _worker_module.Session(1, None, "pytriton-unit-unused")
    outcome = []
    left = threading.Event()

    def serving_thread():
        try:
            session.in_callable = True
            session.leave_callable()
            left.set()
            _spin(0.3)
            outcome.append("no exception")
        except CallAbandoned:
            outcome.append("interrupted outside the callable")

    session.thread = threading.Thread(target=serving_thread, daemon=True)
    session.thread.start()
    assert left.wait(TIMEOUT_S)
    assert not session.interrupt()
    session.thread.join(TIMEOUT_S)
    assert outcome == ["no exception"]
    session.close()
