"""The worker's side of the wire protocol, driven over its real Unix socket by a fake stub.

What test_worker.py leaves out: a plain OK batch with parameters and requested outputs, the
streaming window (the generator is not pulled past ``STREAM_WINDOW`` inline chunks, nor past one
arena chunk, before NEXT), CANCEL (the generator is closed, its ``finally`` has run when END
arrives), the retire flag (set only when the callable keeps a large input), a stray NEXT, and BYE.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time

import numpy as np
import pytest

from pytriton.model_config.tensor import Tensor
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy._binding import _resolve_tensors
from pytriton.proxy._worker import InstanceWorker
from pytriton.proxy.stubside import _arena, _messages, _segments, _tensors, _wire
from tests.conftest import shm_entries

TIMEOUT_S = 10.0


def _config(decoupled, outputs=("y",)):
    return TritonModelConfig(
        model_name="Proto",
        batching=True,
        max_batch_size=4,
        decoupled=decoupled,
        inputs=_resolve_tensors([Tensor(name="x", shape=(-1,), dtype=np.float32)], "INPUT", "Proto"),
        outputs=_resolve_tensors(
            [Tensor(name=name, shape=(-1,), dtype=np.float32) for name in outputs], "OUTPUT", "Proto"
        ),
    )


@pytest.fixture()
def prefix():
    prefix = f"pytriton-{os.getpid()}-proto{secrets.token_hex(3)}"
    yield prefix
    _segments.sweep_segments(prefix)


@pytest.fixture()
def connect(tmp_path, prefix):
    """``connect(func, decoupled=False, outputs=("y",))`` -> a Channel to a running worker (HELLO done)."""
    workers, sockets = [], []

    def make(func, decoupled=False, outputs=("y",)):
        worker = InstanceWorker(
            path=str(tmp_path / f"w{len(workers)}.sock"),
            infer_func=func,
            config=_config(decoupled, outputs),
            strict=False,
            shm_prefix=f"{prefix}-w",
            on_unrecoverable=lambda exc: None,
            name=f"Proto-{len(workers)}",
        )
        worker.start()
        workers.append(worker)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT_S)
        sock.connect(worker._path)
        sockets.append(sock)
        channel = _wire.SocketChannel(sock)
        channel.send(_messages.Hello(os.getpid(), 0))
        assert type(channel.recv()) is _messages.Welcome
        return channel

    yield make
    for sock in sockets:
        sock.close()
    for worker in workers:
        worker.stop()
    assert not shm_entries(f"{prefix}-w")


def _infer(channel, arena, *requests):
    """Send one INFER: each request is ``(x array, parameters, requested names)``."""
    segment, metas = _tensors.write_tensors(arena, [[("x", x)] for x, _, _ in requests])
    channel.send(
        _messages.Infer(
            segment, [_messages.Entry(meta, params, names) for meta, (_, params, names) in zip(metas, requests)]
        )
    )


def _outputs(reply, reader=None):
    segment = reply.segment
    buffer = reader.attach(segment) if segment is not None else None
    return [{meta.name: _tensors.read_tensor(buffer, meta, True) for meta in metas} for metas in reply.results]


def test_ok_batch_with_parameters_and_requested_outputs(connect):
    seen = []

    def func(requests):
        seen.extend((request.parameters, request.requested_output_names) for request in requests)
        return [{"a": request["x"] + 1, "b": request["x"] * 2} for request in requests]

    channel = connect(func, outputs=("a", "b"))
    _infer(
        channel,
        None,
        (np.array([[1.0]], np.float32), {"p": 1}, ["b"]),
        (np.array([[2.0]], np.float32), None, None),
    )
    reply = channel.recv()
    assert type(reply) is _messages.Ok and not reply.retire
    first, second = _outputs(reply)
    assert seen[0][0] == {"p": 1} and list(seen[0][1]) == ["b"]
    assert not seen[1][0] and seen[1][1] is None
    assert sorted(first) == ["a", "b"] and first["b"].tolist() == [[2.0]]
    assert second["a"].tolist() == [[3.0]]


def test_a_stream_stops_at_the_window_until_next(connect):
    pulled = []

    def func(requests):
        for step in range(3 * _messages.STREAM_WINDOW):
            pulled.append(step)
            yield [{"y": np.full((1, 1), step, np.float32)} for _ in requests]

    channel = connect(func, decoupled=True)
    _infer(channel, None, (np.ones((1, 1), np.float32), None, None))
    for step in range(_messages.STREAM_WINDOW):
        chunk = channel.recv()
        assert type(chunk) is _messages.Chunk and _outputs(chunk)[0]["y"].tolist() == [[step]]
    # The worker now waits for NEXT: however long we wait, the generator is not pulled further.
    time.sleep(0.2)
    assert len(pulled) == _messages.STREAM_WINDOW
    channel.send(_messages.NEXT_MESSAGE)
    values = []
    while True:
        message = channel.recv()
        if type(message) is not _messages.Chunk:
            break
        values.append(int(_outputs(message)[0]["y"][0, 0]))
        if len(values) % _messages.STREAM_WINDOW == 0:
            channel.send(_messages.NEXT_MESSAGE)
    assert values == list(range(_messages.STREAM_WINDOW, 3 * _messages.STREAM_WINDOW))
    # The last chunk filled the window: its NEXT came before END (sent above).
    assert message == _messages.End()


def test_cancel_closes_the_generator_before_the_stream_ends(connect):
    closed = threading.Event()
    pulled = []

    def func(requests):
        try:
            for step in range(1000):
                pulled.append(step)
                yield [{"y": np.full((1, 1), step, np.float32)} for _ in requests]
        finally:
            closed.set()

    channel = connect(func, decoupled=True)
    _infer(channel, None, (np.ones((1, 1), np.float32), None, None))
    for _ in range(_messages.STREAM_WINDOW):
        assert type(channel.recv()) is _messages.Chunk
    channel.send(_messages.CANCEL_MESSAGE)
    assert channel.recv() == _messages.End()
    assert closed.is_set(), "the generator's finally must have run when END is sent"
    assert len(pulled) == _messages.STREAM_WINDOW
    # The connection is in step for the next batch.
    _infer(channel, None, (np.ones((1, 1), np.float32), None, None))
    assert type(channel.recv()) is _messages.Chunk


def test_an_arena_chunk_waits_for_its_acknowledgement(connect):
    pulled = []
    big = np.arange(1 << 15, dtype=np.float32)[None, :]  # 128 KiB: through the worker's arena

    def func(requests):
        for step in range(3):
            pulled.append(step)
            yield [{"y": big + step} for _ in requests]

    channel = connect(func, decoupled=True)
    _infer(channel, None, (np.ones((1, 1), np.float32), None, None))
    reader = _arena.ArenaReader()
    try:
        for step in range(3):
            chunk = channel.recv()
            assert chunk.segment is not None
            np.testing.assert_array_equal(_outputs(chunk, reader)[0]["y"], big + step)
            time.sleep(0.05)
            assert len(pulled) == step + 1, "the arena must not be written again before NEXT"
            channel.send(_messages.NEXT_MESSAGE)
        assert channel.recv() == _messages.End()
    finally:
        reader.close()


def test_retire_is_set_only_when_the_callable_keeps_a_large_input(connect, prefix):
    kept = []

    def func(requests):
        if requests[0].parameters.get("keep"):
            kept.append(requests[0]["x"][:, :10])  # a view of the stub's arena
        return [{"y": request["x"][:, :1]} for request in requests]

    channel = connect(func)
    arena = _arena.SharedArena(f"{prefix}-s")
    big = np.ones((1, 1 << 15), np.float32)  # 128 KiB: through the stub's arena
    try:
        for keep, small in ((False, False), (True, True), (True, False)):
            x = np.ones((1, 4), np.float32) if small else big
            _infer(channel, arena, (x, {"keep": keep}, None))
            reply = channel.recv()
            assert type(reply) is _messages.Ok
            # A kept small input is a private copy: nothing to retire.
            assert reply.retire is (keep and not small), (keep, small)
    finally:
        kept.clear()
        arena.close()


def test_stray_next_and_bye(connect):
    channel = connect(lambda requests: [{"y": request["x"]} for request in requests])
    channel.send(_messages.NEXT_MESSAGE)
    reply = channel.recv()
    assert type(reply) is _messages.Error and "unexpected message kind" in reply.text
    channel.send(_messages.BYE_MESSAGE)
    assert type(channel.recv()) is _messages.Ok
