"""The RemoteTriton TCP hub (pytriton/proxy/stubside/_zmq_channel.py) under hostile bytes, no server.

A real hub on 127.0.0.1 serves a real authenticated stub connection (an ``InstanceWorker`` doubling
its input) while other peers send at least 10,000 frames: random, multi-frame, truncated greetings,
oversized, replays of the stub's own frames, valid-looking messages without authentication, raw TCP
bytes (broken ZMTP, a frame header declaring 2**62 bytes), and malformed messages from a peer that
does hold the token. The served stub must get every answer right meanwhile and after, the dispatcher
must still run, and a new stub must still be able to connect. Issue 25, item 4.
"""

from __future__ import annotations

import marshal
import random
import socket
import struct
import threading
import time
from typing import Any, List

import numpy as np
import pytest

from pytriton.proxy.stubside import _messages, _tensors, _zmq_channel
from tests.unit.test_zmq_channel import echo_worker

zmq = pytest.importorskip("zmq")

TOKEN = "fuzz-token-0123456789"
ROUTE = "Echo/0"
FRAMES = 10_000  # frames the attackers send in all, at least


def _infer_message(values: np.ndarray) -> Any:
    segment, metas = _tensors.write_tensors(_zmq_channel.InlineArena(), [[("x", values)]])  # type: ignore[arg-type]
    return _messages.Infer(segment, [_messages.Entry(metas[0])])


def _check_infer(stub: _zmq_channel.StubChannel, values: np.ndarray) -> None:
    stub.send(_infer_message(values))
    reply = stub.recv()
    np.testing.assert_array_equal(_tensors.read_tensor(None, reply.results[0][0], copy=True), values * 2)


def _stub(hub: _zmq_channel.Hub) -> _zmq_channel.StubChannel:
    stub = _zmq_channel.StubChannel(endpoint=hub.endpoint, token=TOKEN, route=ROUTE, server_key=hub.public_key)
    stub.settimeout(10.0)
    stub.send(_messages.Hello(999_999_999, 0))  # a pid that does not exist: nobody is marked abandoned
    assert type(stub.recv()) is _messages.Welcome
    return stub


class _Peer:
    """A ZeroMQ ``DEALER`` that knows the hub's public key (which travels in the load request) but not the token."""

    def __init__(self, context: Any, hub: _zmq_channel.Hub):
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDTIMEO, 2000)
        if hub.public_key is not None:
            public, secret = zmq.curve_keypair()
            self.socket.setsockopt(zmq.CURVE_PUBLICKEY, public)
            self.socket.setsockopt(zmq.CURVE_SECRETKEY, secret)
            self.socket.setsockopt(zmq.CURVE_SERVERKEY, hub.public_key.encode())
        self.socket.connect(hub.endpoint)

    def close(self) -> None:
        self.socket.close(linger=0)


def _frames(rng: random.Random, replays: List[bytes]) -> List[List[bytes]]:
    """One peer's messages: each a list of frames (ZeroMQ puts the peer's identity in front)."""
    greeting = b"PYTRITON1 " + TOKEN.encode() + b" " + ROUTE.encode()
    kinds = [
        lambda: [rng.randbytes(rng.randint(0, 300))],
        lambda: [rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(2, 5))],  # multi-frame
        lambda: [greeting[: rng.randint(0, len(greeting) - 1)]],  # truncated greeting
        lambda: [b"PYTRITON1 " + rng.randbytes(len(TOKEN)) + b" " + ROUTE.encode()],  # guessed token
        lambda: [greeting, b"x"],  # the right greeting, but two frames
        lambda: [rng.choice(replays)],  # the served stub's own frames, replayed
        lambda: [marshal.dumps(_messages.Hello(rng.randint(1, 1 << 22), 0).encode())],  # valid-looking, unauthenticated
        lambda: [marshal.dumps(_infer_message(np.ones(rng.randint(1, 64), np.float32)).encode())],
        lambda: [marshal.dumps(_messages.BYE_MESSAGE.encode())],
        lambda: [b""],
    ]
    return [rng.choice(kinds)() for _ in range(rng.randint(20, 60))]


def _zmtp_null_greeting() -> bytes:
    """A ZMTP 3.0 greeting and READY command (NULL mechanism, as a DEALER) written by hand."""
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
    socket_type = b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    body = b"\x05READY" + socket_type
    return greeting + b"\x04" + bytes([len(body)]) + body


def _raw_tcp(hub: _zmq_channel.Hub, rng: random.Random, encrypted: bool) -> List[bytes]:
    """Raw bytes from plain TCP connections, one write each; returns what each connection sent."""
    port = hub.port
    payloads = [
        rng.randbytes(9),
        rng.randbytes(1000),
        b"\xff" + b"\x00" * 8 + b"\x7f",  # a ZMTP signature, then nothing
        _zmtp_null_greeting()[: rng.randint(1, 70)],  # truncated
        b"\xff" + b"\x00" * 8 + b"\x7f\x01\x00" + b"\x01\x00",  # ZMTP 2.0 / 1.0 style greetings
    ]
    if not encrypted:
        # the handshake, then a frame header declaring 2**62 bytes, then a 2-frame message, then truncation
        payloads.append(_zmtp_null_greeting() + b"\x02" + struct.pack(">Q", 1 << 62))
        payloads.append(_zmtp_null_greeting() + b"\x01\x03abc" + b"\x00\x03def" + b"\x00\x09PYTRI")
    for payload in payloads * 4:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            try:
                conn.sendall(payload)
                conn.settimeout(0.05)
                conn.recv(4096)
            except OSError:
                pass
    return payloads * 4


def _unexplained_refusals(hub: _zmq_channel.Hub, raw_payloads: List[bytes]) -> List[bytes]:
    """The refused peers ``hub`` remembers that it should have forgotten (none, for a healthy hub).

    A refused peer may stay remembered while a descriptor's slot names it (one per descriptor
    number, whatever the number of peers: a reused descriptor's slot forgets it). The exception is
    a ZMTP/1.0 peer, which names itself and whose frames carry no source descriptor, so it stays
    until ``_MAX_REFUSED`` evicts it: here only a raw TCP connection can be one, named by bytes it
    sent. Each dict is copied in one step, as the dispatcher thread may change it meanwhile.
    """
    named = {identity for identity in list(hub._fds.values()) if isinstance(identity, bytes)}
    unheld = set(hub._refused) - named
    return [identity for identity in unheld if not any(identity in payload for payload in raw_payloads)]


@pytest.mark.parametrize("encrypt", [False, True], ids=["clear", "curve"])
def test_hub_survives_hostile_frames_while_serving_a_stub(encrypt):
    rng = random.Random(25)
    hub = _zmq_channel.Hub("127.0.0.1", 0, TOKEN, encrypt=encrypt)
    worker = echo_worker(hub, ROUTE)
    context = zmq.Context()
    stub = _stub(hub)
    served: List[int] = []
    errors: List[BaseException] = []
    stop = threading.Event()

    def serve() -> None:  # the honest stub keeps working while the attack runs
        try:
            while not stop.is_set():
                _check_infer(stub, np.arange(len(served) % 100 + 1, dtype=np.float32))
                served.append(1)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    replays = [
        marshal.dumps(_infer_message(np.arange(8, dtype=np.float32)).encode()),
        marshal.dumps(_messages.Hello(1, 0).encode()),
    ]
    replays.append(b"PYTRITON1 " + TOKEN.encode() + b" " + ROUTE.encode())  # the greeting: clear mode only
    if encrypt:
        replays.pop()  # over CURVE a captured greeting is ciphertext bound to its session: nothing to replay
    sent = 0
    try:
        while sent < FRAMES:
            peer = _Peer(context, hub)
            try:
                for message in _frames(rng, replays):
                    peer.socket.send_multipart(message)
                    sent += len(message)
            finally:
                peer.close()
        big = _Peer(context, hub)  # oversized: a 32 MiB frame first, then 4 MiB ones after the refusal
        try:
            for size in (32 << 20, 4 << 20, 4 << 20):
                big.socket.send(b"\x00" * size)
                sent += 1
        finally:
            big.close()
        raw_payloads = _raw_tcp(hub, rng, encrypt)
        sent += len(raw_payloads)
        # A peer that holds the token: malformed messages after a valid greeting end its own connection only.
        for malformed in (
            b"\x00garbage",
            marshal.dumps(42),
            marshal.dumps(()),
            marshal.dumps((_messages.INFER, "shm", [], None)),
        ):
            peer = _Peer(context, hub)
            try:
                peer.socket.send(b"PYTRITON1 " + TOKEN.encode() + b" " + ROUTE.encode())
                assert peer.socket.poll(5000) and peer.socket.recv() == b"OK"
                peer.socket.send(malformed)
                peer.socket.send(marshal.dumps(_messages.Hello(1, 0).encode()))  # dropped: the connection is over
                sent += 3
            finally:
                peer.close()
        assert sent >= FRAMES
        time.sleep(0.5)  # let the dispatcher drain what is queued
        stop.set()
        server.join(30)
        assert not errors, f"the served stub failed during the attack: {errors[0]!r}"
        assert not server.is_alive()
        assert len(served) > 0
        assert hub._thread.is_alive(), "the hub's dispatcher thread died"
        # The hub's memory of refused peers is bounded by construction, not by a count this test could
        # measure: a refusal is forgotten when its connection's closing is taken in, when the
        # descriptor it arrived on is reused, and past _MAX_REFUSED (test below). How many slots
        # still name a closed, refused peer depends on how many frames were read after their
        # connection closed, i.e. on load (2026-11-29, 183 peers, clear mode: 1-22 under two to six
        # busy loops, 39 in one full `make test`), so no such count is asserted; every other
        # remembered peer is a leak. The dispatcher may be between two steps of one message (a
        # refusal is recorded just before its descriptor): wait until it is not.
        deadline = time.monotonic() + 10.0
        while _unexplained_refusals(hub, raw_payloads) and time.monotonic() < deadline:
            time.sleep(0.05)
        leaked = _unexplained_refusals(hub, raw_payloads)
        assert not leaked, (
            f"{len(leaked)} refused peers are remembered though no descriptor names them and they did not "
            f"name themselves ({leaked[:5]!r}): the hub does not forget closed peers"
        )
        assert len(hub._refused) <= _zmq_channel._MAX_REFUSED
        for _ in range(20):  # the served stub still works, and a new stub still connects
            _check_infer(stub, np.arange(50, dtype=np.float32))
        second = _stub(hub)
        try:
            _check_infer(second, np.linspace(0, 1, 1000, dtype=np.float32))
        finally:
            second.close()
    finally:
        stop.set()
        stub.close()
        worker.stop()
        context.term()
        hub.close()


def test_refused_peers_remembered_are_bounded(monkeypatch):
    """However many refused peers stay connected, the hub remembers at most ``_MAX_REFUSED`` of them."""
    monkeypatch.setattr(_zmq_channel, "_MAX_REFUSED", 8)
    hub = _zmq_channel.Hub("127.0.0.1", 0, TOKEN)
    context = zmq.Context()
    peers = [_Peer(context, hub) for _ in range(30)]
    try:
        for peer in peers:
            peer.socket.send(b"not a greeting")
            assert peer.socket.poll(5000) and peer.socket.recv().startswith(b"REFUSED")
        assert len(hub._refused) == 8
        worker = echo_worker(hub, ROUTE)  # and the hub still serves
        try:
            stub = _stub(hub)
            _check_infer(stub, np.arange(10, dtype=np.float32))
            stub.close()
        finally:
            worker.stop()
    finally:
        for peer in peers:
            peer.close()
        context.term()
        hub.close()
