"""The TCP transport (pytriton/proxy/stubside/_zmq_channel.py) over a loopback hub and stub channel, no server."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig
from pytriton.proxy._worker import InstanceWorker
from pytriton.proxy.stubside import _messages, _tensors, _zmq_channel

TOKEN = "unit-token"


@pytest.fixture()
def hub():
    hub = _zmq_channel.Hub("127.0.0.1", 0, TOKEN)
    yield hub
    hub.close()


def _serve_one(listener: _zmq_channel.Listener, replies: int = 1) -> threading.Thread:
    """Accept one connection and echo ``replies`` messages back."""

    def run() -> None:
        connection, _ = listener.accept()
        channel = connection.channel()
        try:
            for _ in range(replies):
                channel.send(channel.recv())
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_round_trip_and_goodbye(hub):
    assert hub.endpoint == f"tcp://127.0.0.1:{hub.port}" and hub.port > 0
    listener = hub.register("m1/0")
    accepted = []

    def run() -> None:
        connection, route = listener.accept()
        accepted.append(route)
        channel = connection.channel()
        message = channel.recv()
        channel.send(message)
        with pytest.raises(EOFError):
            channel.recv()  # the stub's close() ends the connection
        accepted.append("eof")
        connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    stub = _zmq_channel.connect(hub.endpoint, TOKEN, "m1/0")
    payload = "x" * 1_200_000  # larger than any socket buffer
    stub.send(_messages.Error(payload, False, 7.0))
    reply = stub.recv()
    assert reply == _messages.Error(payload, False, 7.0)
    stub.close()
    thread.join(5)
    assert accepted == ["m1/0", "eof"]


@pytest.mark.parametrize(
    ("token", "route", "reason"),
    [("wrong", "m1/0", "wrong token"), (TOKEN, "m9/0", "no model instance is served under that route")],
)
def test_refused_stubs_get_the_reason(hub, token, route, reason):
    hub.register("m1/0")
    with pytest.raises(ConnectionError, match=reason):
        _zmq_channel.StubChannel(endpoint=hub.endpoint, token=token, route=route)


def test_unreachable_hub_is_named():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionError, match="no answer from the pytriton process"):
        _zmq_channel.StubChannel(endpoint=f"tcp://127.0.0.1:{port}", token=TOKEN, route="m1/0", auth_timeout_s=0.2)


def test_receive_timeout_and_lost_hub():
    hub = _zmq_channel.Hub("127.0.0.1", 0, TOKEN)
    listener = hub.register("r")
    _serve_one(listener, replies=0)
    stub = _zmq_channel.connect(hub.endpoint, TOKEN, "r")
    try:
        stub.settimeout(0.05)
        with pytest.raises(socket.timeout):
            stub.recv()
        hub.close()  # the user's process goes away: the stub sees the connection drop
        stub.settimeout(5.0)
        with pytest.raises(EOFError):
            stub.recv()
    finally:
        stub.close()
        hub.close()


def test_garbage_peer_is_refused_and_ignored(hub):
    zmq = pytest.importorskip("zmq")
    context = zmq.Context()
    peer = context.socket(zmq.DEALER)
    try:
        peer.connect(hub.endpoint)
        peer.send(b"\x00not marshal")
        assert peer.poll(5000)
        assert peer.recv().startswith(b"REFUSED not a pytriton greeting")
        peer.send(b"PYTRITON1 " + TOKEN.encode() + b" r")  # too late: nothing from it is read any more
        assert not peer.poll(200)
    finally:
        peer.close(linger=0)
        context.term()


def test_inline_arena_puts_every_tensor_in_the_message():
    arena = _zmq_channel.InlineArena()
    large = np.arange(1 << 18, dtype=np.float32)  # 1 MiB, above the shared-memory threshold
    segment, metas = _tensors.write_tensors(arena, [[("x", large)]])  # type: ignore[arg-type]
    assert segment is None and metas[0][0].place == _messages.INLINE and metas[0][0].data is not None
    np.testing.assert_array_equal(_tensors.read_tensor(None, metas[0][0], copy=True), large)


def echo_worker(hub: _zmq_channel.Hub, route: str) -> InstanceWorker:
    """A started ``InstanceWorker`` on ``route`` of ``hub`` whose callable doubles float32 ``x`` into ``y``."""
    config = TritonModelConfig(
        model_name="Echo",
        max_batch_size=0,
        batching=False,
        inputs=[TensorSpec(name="x", shape=(-1,), dtype=np.float32)],
        outputs=[TensorSpec(name="y", shape=(-1,), dtype=np.float32)],
    )
    worker = InstanceWorker(
        path=hub.path(route),
        infer_func=lambda requests: [{"y": request["x"] * 2} for request in requests],
        config=config,
        strict=False,
        shm_prefix="pytriton-unit-zmq",
        on_unrecoverable=lambda exc: None,
        name=f"Echo-{route}",
    )
    worker.start()
    return worker


def test_worker_serves_a_stub_over_tcp(hub):
    """An InstanceWorker on a hub route: HELLO, INFER with a large input, BYE, all inline."""
    worker = echo_worker(hub, "m1/0")
    stub = _zmq_channel.connect(hub.endpoint, TOKEN, "m1/0")
    try:
        stub.send(_messages.Hello(12345, 0))
        assert type(stub.recv()) is _messages.Welcome
        assert worker.connected
        large = np.arange(1 << 18, dtype=np.float32)
        segment, metas = _tensors.write_tensors(_zmq_channel.InlineArena(), [[("x", large)]])  # type: ignore[arg-type]
        stub.send(_messages.Infer(segment, [_messages.Entry(metas[0])]))
        reply = stub.recv()
        assert reply.segment is None
        np.testing.assert_array_equal(_tensors.read_tensor(None, reply.results[0][0], copy=True), large * 2)
        stub.send(_messages.BYE_MESSAGE)
        stub.recv()
        assert not worker.connected
    finally:
        stub.close()
        worker.stop()


def test_a_stub_whose_acceptance_was_not_reported_is_served(hub, monkeypatch):
    """The monitor drops events when it falls behind: a stub is never taken for closed on a missing acceptance."""
    real = hub._connection_events

    def dropping() -> None:  # every acceptance lost, as under a flood of connections
        real()
        for fd, state in list(hub._fds.items()):
            if state is _zmq_channel._Unnamed.ACCEPTED:
                del hub._fds[fd]

    monkeypatch.setattr(hub, "_connection_events", dropping)
    worker = echo_worker(hub, "m1/0")
    stub = _zmq_channel.connect(hub.endpoint, TOKEN, "m1/0")
    stub.settimeout(5.0)  # an ended connection would leave the stub waiting
    try:
        stub.send(_messages.Hello(12345, 0))
        assert type(stub.recv()) is _messages.Welcome
        segment, metas = _tensors.write_tensors(_zmq_channel.InlineArena(), [[("x", np.ones(4, np.float32))]])  # type: ignore[arg-type]
        stub.send(_messages.Infer(segment, [_messages.Entry(metas[0])]))
        reply = stub.recv()
        np.testing.assert_array_equal(_tensors.read_tensor(None, reply.results[0][0], copy=True), np.full(4, 2.0))
        assert worker.connected
    finally:
        stub.close()
        worker.stop()


def test_encrypted_hub_needs_its_key():
    hub = _zmq_channel.Hub("127.0.0.1", 0, TOKEN, encrypt=True)
    try:
        assert hub.public_key is not None and len(hub.public_key) == 40  # Z85 of a 32-byte key
        thread = _serve_one(hub.register("r"))
        stub = _zmq_channel.connect(hub.endpoint, TOKEN, "r", hub.public_key)
        try:
            stub.send(_messages.Error("\x01" * 100_000))
            assert stub.recv() == _messages.Error("\x01" * 100_000)
        finally:
            stub.close()
        thread.join(5)
        # Without the key the CURVE handshake fails: the greeting never arrives.
        with pytest.raises(ConnectionError, match="no answer"):
            _zmq_channel.StubChannel(endpoint=hub.endpoint, token=TOKEN, route="r", auth_timeout_s=0.3)
    finally:
        hub.close()


def _ends_with_eof(listener: _zmq_channel.Listener) -> threading.Event:
    """Accept one connection on a thread; the event is set once reading it ends in EOF."""
    ended = threading.Event()

    def run() -> None:
        connection, _ = listener.accept()
        with pytest.raises(EOFError):
            connection.channel().recv()
        connection.close()
        ended.set()

    threading.Thread(target=run, daemon=True).start()
    return ended


def test_a_peer_that_vanishes_without_goodbye_ends_its_connection(hub):
    """A killed stub sends no goodbye: the hub's socket monitor ends its connection all the same."""
    zmq = pytest.importorskip("zmq")
    listener = hub.register("r")
    for _ in range(3):  # descriptors get reused: each round must end its own connection only
        ended = _ends_with_eof(listener)
        context = zmq.Context()
        peer = context.socket(zmq.DEALER)
        peer.connect(hub.endpoint)
        peer.send(b"PYTRITON1 " + TOKEN.encode() + b" r")
        assert peer.poll(5000) and peer.recv() == b"OK"
        peer.close(linger=0)  # no empty goodbye frame
        context.term()
        assert ended.wait(5), "the hub did not notice the peer's disconnection"


def _hold_the_dispatcher(hub, monkeypatch):
    """Make the hub's dispatcher wait, before it reads the next message, until ``release`` is set.

    Returns ``(holding, release, handled)``: ``holding`` is set once a message waits unread,
    ``handled`` once the dispatcher has read and handled it. Meanwhile a peer can close its
    connection, which ZeroMQ then reports before that message is read.
    """
    holding, release, handled = threading.Event(), threading.Event(), threading.Event()
    real = hub._receive

    def held() -> None:
        holding.set()
        release.wait(10)
        try:
            real()
        finally:
            handled.set()

    monkeypatch.setattr(hub, "_receive", held)  # the dispatcher looks it up for each message
    return holding, release, handled


def _closed_before_read(hub, monkeypatch, frame: bytes, zmq) -> None:
    """A peer sends ``frame`` and closes its connection before the hub has read the frame."""
    holding, release, handled = _hold_the_dispatcher(hub, monkeypatch)
    context = zmq.Context()
    peer = context.socket(zmq.DEALER)
    peer.connect(hub.endpoint)
    peer.send(frame)
    assert holding.wait(5), "the hub never saw the frame"
    peer.close(linger=0)
    context.term()
    time.sleep(1.0)  # ZeroMQ reports the closing (in microseconds on loopback) while the frame waits
    release.set()
    assert handled.wait(5), "the hub did not handle the frame"


def test_a_refused_peer_closed_before_its_frame_was_read_is_forgotten(hub, monkeypatch):
    """Its closing was reported first; remembering it would last until its descriptor is reused."""
    zmq = pytest.importorskip("zmq")
    _closed_before_read(hub, monkeypatch, b"\x00not marshal", zmq)
    assert hub._refused == {}  # the frame is handled, and with it every connection event reported before
    assert not [fd for fd, held in hub._fds.items() if isinstance(held, bytes)], "an identity stays tracked"


def test_a_late_frame_of_a_refused_peer_that_closed_is_forgotten_quietly(hub, monkeypatch, caplog):
    """A frame read after its connection's closing was taken in: no second log line, nothing remembered.

    The first frame is refused while the peer is connected; the second is read only after the hub
    took in the closing (which forgot the refusal). It is a frame of a closed connection, so the
    hub neither logs nor answers it again, and does not remember the peer until its descriptor is
    reused (which left up to a few dozen stale refusals after the fuzz test's attack).
    """
    zmq = pytest.importorskip("zmq")
    calls, holding, release, handled = [0], threading.Event(), threading.Event(), threading.Event()
    real = hub._receive

    def second_held() -> None:
        calls[0] += 1
        if calls[0] == 2:
            holding.set()
            release.wait(10)
            hub._connection_events()  # the closing is taken in before this frame is read
        try:
            real()
        finally:
            if calls[0] == 2:
                handled.set()

    monkeypatch.setattr(hub, "_receive", second_held)
    context = zmq.Context()
    peer = context.socket(zmq.DEALER)
    try:
        with caplog.at_level("WARNING", logger=_zmq_channel.LOGGER.name):
            peer.connect(hub.endpoint)
            peer.send(b"\x00not marshal")
            assert peer.poll(5000) and peer.recv().startswith(b"REFUSED")
            peer.send(b"\x00again")
            assert holding.wait(5), "the hub never saw the second frame"
            peer.close(linger=0)
            context.term()
            time.sleep(1.0)  # ZeroMQ reports the closing while the frame waits
            release.set()
            assert handled.wait(5), "the hub did not handle the second frame"
        refusals = [r for r in caplog.records if "refused a connection" in r.getMessage()]
        assert len(refusals) == 1, [r.getMessage() for r in refusals]
        assert hub._refused == {}
        assert not [fd for fd, held in hub._fds.items() if isinstance(held, bytes)], "an identity stays tracked"
    finally:
        release.set()
        if not peer.closed:
            peer.close(linger=0)
            context.term()


def test_a_stub_closed_before_its_greeting_was_read_ends_its_connection(hub, monkeypatch):
    """Its worker thread must not wait for messages from a peer that is gone (until a reused descriptor)."""
    zmq = pytest.importorskip("zmq")
    ended = _ends_with_eof(hub.register("r"))
    _closed_before_read(hub, monkeypatch, b"PYTRITON1 " + TOKEN.encode() + b" r", zmq)
    assert ended.wait(5), "the connection of a peer that had closed was not ended"
    assert hub._peers == {}


@pytest.mark.parametrize(
    "frame",
    [
        b"\x00garbage",
        b"",
        None,
        42,
        (),
        ("INFER",),
        (2, "pytriton-other-segment", [], None),
        (2, None, [([("x", "<f4", (1,), 1, None, 0, 4)], None, None, None, 0.0)], None),
        (2, None, [], None, "extra"),
    ],
    ids=[
        "undecodable",
        "empty-marshal",
        "none",
        "int",
        "empty-tuple",
        "kind-not-int",
        "infer-naming-shm",
        "tensor-in-an-arena",
        "wrong-arity",
    ],
)
def test_a_malformed_message_from_an_authenticated_peer_ends_its_connection(hub, frame):
    """The token holder is trusted with tensors, not with naming shared memory or crashing the worker."""
    import marshal

    zmq = pytest.importorskip("zmq")
    listener = hub.register("r")
    outcome: list = []

    def run() -> None:
        connection, _ = listener.accept()
        try:
            connection.channel().recv()
            outcome.append("decoded")
        except EOFError as exc:
            outcome.append(str(exc))
        connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    context = zmq.Context()
    peer = context.socket(zmq.DEALER)
    try:
        peer.connect(hub.endpoint)
        peer.send(b"PYTRITON1 " + TOKEN.encode() + b" r")
        assert peer.poll(5000) and peer.recv() == b"OK"
        peer.send(frame if isinstance(frame, bytes) and frame else marshal.dumps(frame))
        thread.join(5)
        assert outcome and outcome[0].startswith("malformed message from the stub")
    finally:
        peer.close(linger=0)
        context.term()
