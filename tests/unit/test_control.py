"""The process instances' control channel (pytriton/proxy/_control.py), over a socket pair."""

import socket
import threading

import pytest

from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy import _control

OPTIONS = _control.WorkerOptions(
    path="/tmp/x.sock",
    config=TritonModelConfig(model_name="M"),
    strict=False,
    shm_prefix="pytriton-1-ab",
    name="M-0",
    poll_s=0.0,
    metrics=True,
)


@pytest.fixture()
def links():
    left, right = socket.socketpair()
    yield _control.ControlLink(left), _control.ControlLink(right)
    left.close()
    right.close()


@pytest.mark.parametrize(
    "message",
    [
        _control.Start(b"pickled", OPTIONS, {"sys_path": ["/a"]}, {"": 30, "pytriton": 20}),
        _control.Ready(),
        _control.Failed("ImportError: no module named x"),
        _control.Log({"name": "pytriton", "levelno": 30, "msg": "hello", "args": None}),
        _control.StubLost(3, 1234),
        _control.Unrecoverable("PyTritonUnrecoverableError: gone"),
        _control.Reply(7, [11, 12]),
        _control.Reply(8, True),
        _control.Retire(7, 2),
        _control.Drain(8, 5),
        _control.FailStuck("pytriton: the call ran past the limit"),
        _control.Stop(2.0),
    ],
    ids=lambda message: type(message).__name__,
)
def test_every_control_message_arrives_as_its_record(links, message):
    sender, receiver = links
    sender.send(message)
    received = receiver.recv()
    assert type(received) is type(message) and received == message


def test_concurrent_senders_never_interleave_their_frames(links):
    sender, receiver = links
    count = 200

    def send_many(tag: str) -> None:
        for index in range(count):
            sender.send(_control.Failed(f"{tag}{index}" + "x" * 5000))

    threads = [threading.Thread(target=send_many, args=(tag,)) for tag in "ab"]
    for thread in threads:
        thread.start()
    received = [receiver.recv() for _ in range(2 * count)]
    for thread in threads:
        thread.join(10)
    assert all(type(message) is _control.Failed for message in received)
    assert sorted(m.text[:4].rstrip("x") for m in received) == sorted(f"{t}{i}" for t in "ab" for i in range(count))


def test_recv_raises_eof_once_the_peer_closed(links):
    sender, receiver = links
    sender.sock.close()
    with pytest.raises(EOFError):
        receiver.recv()
