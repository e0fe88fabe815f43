"""InstanceWorker driven over its real Unix socket by a fake stub (no server).

Covers what the worker must survive: any BaseException from the callable (sync, async, generator),
a stub that gives up on a hung call and reconnects (execution timeout), stop() with a hung call,
and telling a dead stub from one that said goodbye.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from pytriton.model_config.tensor import Tensor
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy._binding import _resolve_tensors
from pytriton.proxy._worker import InstanceWorker, error_text
from pytriton.proxy.stubside import _arena, _messages, _tensors, _wire
from tests.conftest import shm_entries, wait_for


class CustomBase(BaseException):
    pass


class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("cannot print")


RAISES = [SystemExit(2), KeyboardInterrupt("inside"), GeneratorExit("inside"), CustomBase("custom"), BadStr()]


def _config(decoupled=False):
    return TritonModelConfig(
        model_name="Unit",
        batching=True,
        max_batch_size=4,
        decoupled=decoupled,
        inputs=_resolve_tensors([Tensor(name="k", shape=(1,), dtype=np.int32)], "INPUT", "Unit"),
        outputs=_resolve_tensors([Tensor(name="y", shape=(1,), dtype=np.int32)], "OUTPUT", "Unit"),
    )


@pytest.fixture()
def make_worker(tmp_path):
    workers = []
    prefix = f"pytriton-{os.getpid()}-unit{secrets.token_hex(3)}"

    def make(func, decoupled=False):
        lost = []
        worker = InstanceWorker(
            path=str(tmp_path / f"slot-{len(workers)}.sock"),
            infer_func=func,
            config=_config(decoupled),
            strict=False,
            shm_prefix=prefix,
            on_unrecoverable=lambda exc: None,
            name=f"Unit-{len(workers)}",
            on_stub_lost=lambda generation, server_pid: lost.append(generation),
        )
        worker.start()
        workers.append(worker)
        return worker, lost

    yield make
    for worker in workers:
        worker.stop()
    assert not shm_entries(prefix)


def _connect(worker, pid=None, generation=0):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(worker._path)
    channel = _wire.SocketChannel(sock)
    channel.send(_messages.Hello(os.getpid() if pid is None else pid, generation))
    assert channel.recv().KIND == _messages.WELCOME
    return sock, channel


def _infer(channel, value):
    segment, metas = _tensors.write_tensors(
        _arena.SharedArena("pytriton-unit-unused"), [[("k", np.array([[value]], np.int32))]]
    )
    channel.send(_messages.Infer(segment, [_messages.Entry(metas[0])]))
    return channel.recv()


def _value(reply):
    assert reply.KIND == _messages.OK, reply
    return int(np.frombuffer(reply.results[0][0].data, dtype=np.int32)[0])


def _exception_records(caplog, kind):
    return [r for r in caplog.records if r.exc_info and r.exc_info[1] is not None and type(r.exc_info[1]) is kind]


def test_only_batches_count_as_work_not_the_hello(make_worker):
    # Triton.stop() waits longer after recent work (RESPONSE_SETTLE_S); a stub that just connected
    # did none, so a stop right after run() must not wait for it.
    worker, _ = make_worker(lambda requests: [{"y": request["k"]} for request in requests])
    sock, channel = _connect(worker)
    try:
        assert worker.last_active == 0.0
        before = time.monotonic()
        assert _value(_infer(channel, 5)) == 5
        assert wait_for(lambda: worker.last_active >= before, 10.0)
    finally:
        sock.close()


def test_error_text_survives_a_broken_str():
    assert error_text(BadStr()) == "BadStr (its message could not be printed)"
    assert error_text(SystemExit(3)) == "SystemExit: 3"
    assert error_text(KeyboardInterrupt()) == "KeyboardInterrupt"


@pytest.mark.parametrize("exc", RAISES, ids=lambda exc: type(exc).__name__)
def test_base_exception_fails_only_its_batch(make_worker, caplog, exc):
    def func(requests):
        if int(requests[0]["k"].flat[0]) < 0:
            raise exc
        return [{"y": r["k"]} for r in requests]

    worker, lost = make_worker(func)
    sock, channel = _connect(worker)
    with caplog.at_level(logging.ERROR, logger="pytriton.proxy"):
        reply = _infer(channel, -1)
    assert reply.KIND == _messages.ERROR and reply.text.startswith(type(exc).__name__), reply
    assert _value(_infer(channel, 7)) == 7  # same connection, same thread: still serving
    assert _exception_records(caplog, type(exc)), "traceback not logged"
    sock.close()
    assert lost == []


def test_async_callable_raising_keyboard_interrupt_keeps_serving(make_worker):
    async def func(requests):
        await asyncio.sleep(0)
        if int(requests[0]["k"].flat[0]) < 0:
            raise KeyboardInterrupt("async")
        return [{"y": r["k"]} for r in requests]

    worker, _ = make_worker(func)
    sock, channel = _connect(worker)
    assert _infer(channel, -1).KIND == _messages.ERROR
    assert _value(_infer(channel, 3)) == 3
    sock.close()


@pytest.mark.parametrize("exc", RAISES, ids=lambda exc: type(exc).__name__)
def test_base_exception_in_a_generator_ends_only_its_stream(make_worker, exc):
    def func(requests):
        yield [{"y": r["k"]} for r in requests]
        if int(requests[0]["k"].flat[0]) < 0:
            raise exc

    worker, _ = make_worker(func, decoupled=True)
    sock, channel = _connect(worker)
    first = _infer(channel, -1)
    assert first.KIND == _messages.CHUNK
    final = channel.recv()
    assert final.KIND == _messages.ERROR and final.text.startswith(type(exc).__name__), final
    assert _infer(channel, 4).KIND == _messages.CHUNK and channel.recv().KIND == _messages.END
    sock.close()


def test_a_stub_reconnecting_abandons_its_hung_call(make_worker, caplog):
    release = threading.Event()

    def func(requests):
        if int(requests[0]["k"].flat[0]) < 0:
            release.wait(30)
        return [{"y": r["k"]} for r in requests]

    worker, lost = make_worker(func)
    caplog.set_level(logging.WARNING, logger="pytriton.proxy")
    first_sock, first = _connect(worker)
    segment, metas = _tensors.write_tensors(
        _arena.SharedArena("pytriton-unit-unused"), [[("k", np.array([[-1]], np.int32))]]
    )
    first.send(_messages.Infer(segment, [_messages.Entry(metas[0])]))
    assert wait_for(lambda: worker.busy, 10)
    first_sock.close()  # what the stub does when its execution timeout expires ...
    second_sock, second = _connect(worker)  # ... before it connects again
    assert not worker.busy, "an abandoned call must not count as in flight (stop() would wait for it)"
    assert _value(_infer(second, 5)) == 5  # served while the hung call still runs
    release.set()
    assert wait_for(lambda: any("discarded" in r.getMessage() for r in caplog.records), 10)
    assert _value(_infer(second, 6)) == 6
    second_sock.close()
    assert lost == []


def test_a_stuck_call_failed_by_the_watch_answers_its_stub_and_the_instance_serves_on(make_worker, caplog):
    """Issue 42 item 4 (pytriton/_serving/unresponsive.py): the stub gets the retryable error at once, its next
    send fails before anything was delivered (so it connects again, losing nothing), and the new
    connection is served while the abandoned call still runs; its late result is discarded."""
    release = threading.Event()

    def func(requests):
        if int(requests[0]["k"].flat[0]) < 0:
            release.wait(30)
        return [{"y": r["k"]} for r in requests]

    worker, lost = make_worker(func)
    caplog.set_level(logging.WARNING, logger="pytriton.proxy")
    assert not worker.fail_stuck_call(_messages.STUCK_TEXT)  # nothing in a call: nothing to fail
    first_sock, first = _connect(worker)
    segment, metas = _tensors.write_tensors(
        _arena.SharedArena("pytriton-unit-unused"), [[("k", np.array([[-1]], np.int32))]]
    )
    first.send(_messages.Infer(segment, [_messages.Entry(metas[0])]))
    assert wait_for(lambda: worker.busy, 10)
    assert not worker.fail_stuck_call(_messages.STUCK_TEXT, older_than_s=600)  # a call younger than that: left alone
    assert worker.fail_stuck_call(_messages.STUCK_TEXT)
    reply = first.recv()
    assert reply.KIND == _messages.ERROR and reply.text == _messages.STUCK_TEXT
    assert not worker.busy
    with pytest.raises(OSError):  # EPIPE: the stub's next batch was never delivered, it connects again
        first.send(_messages.Infer(segment, [_messages.Entry(metas[0])]))
    first_sock.close()
    second_sock, second = _connect(worker)
    assert _value(_infer(second, 5)) == 5  # served while the stuck call still runs
    release.set()
    assert wait_for(lambda: any("discarded" in r.getMessage() for r in caplog.records), 10)
    assert _value(_infer(second, 6)) == 6
    second_sock.close()
    assert lost == []


def test_stop_leaves_a_hung_call_behind_and_says_so(make_worker, caplog):
    release = threading.Event()
    worker, _ = make_worker(lambda requests: release.wait(60) and [])
    sock, channel = _connect(worker)
    segment, metas = _tensors.write_tensors(
        _arena.SharedArena("pytriton-unit-unused"), [[("k", np.array([[1]], np.int32))]]
    )
    channel.send(_messages.Infer(segment, [_messages.Entry(metas[0])]))
    assert wait_for(lambda: worker.busy, 10)
    caplog.set_level(logging.WARNING, logger="pytriton.proxy")
    started = time.monotonic()
    worker.stop()
    # stop() promises not to wait for a hung callable: generous margin against the 60 s it would take.
    assert time.monotonic() - started < 30
    assert any("left behind" in r.getMessage() for r in caplog.records)
    release.set()
    sock.close()


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dead_stub_is_reported_once_and_a_goodbye_is_not(make_worker):
    worker, lost = make_worker(lambda requests: [{"y": r["k"]} for r in requests])
    sock, channel = _connect(worker, pid=_dead_pid(), generation=3)
    assert _value(_infer(channel, 1)) == 1
    sock.close()  # connection ends without BYE, and the pid is gone: a dead stub
    assert wait_for(lambda: lost == [3], 10), lost

    sock, channel = _connect(worker, pid=_dead_pid(), generation=4)
    channel.send(_messages.BYE_MESSAGE)
    channel.recv()
    sock.close()
    sock, _ = _connect(worker)  # a live stub (this process) that drops its connection
    sock.close()
    time.sleep(0.2)
    assert lost == [3]


def test_retired_connections_are_not_reported(make_worker):
    worker, lost = make_worker(lambda requests: [{"y": r["k"]} for r in requests])
    dead = _dead_pid()
    sock, _ = _connect(worker, pid=dead, generation=0)
    assert wait_for(lambda: worker.connected, 5)
    assert worker.retire(1) == [dead]
    sock.close()
    time.sleep(0.2)
    assert lost == []
