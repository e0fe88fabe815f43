"""The proxy's wire format and shared-memory arenas, without a server."""

import contextlib
import os
import pathlib
import socket
import threading
import time

import numpy as np
import pytest

from pytriton.proxy.stubside import _arena, _messages, _segments, _tensors, _wire
from pytriton.proxy.stubside._messages import (
    Chunk,
    End,
    Entry,
    Error,
    Hello,
    Infer,
    Ok,
    TensorMeta,
    Welcome,
)
from tests.conftest import DTYPES, wait_for


@pytest.fixture()
def arena():
    owner = _arena.SharedArena(f"pytriton-{os.getpid()}-unittest", initial_size=4096)
    reader = _arena.ArenaReader()
    yield owner, reader
    owner.close()
    reader.close()
    assert not _segments.sweep_segments(f"pytriton-{os.getpid()}-unittest")


def _round_trip(arena, tensors):
    owner, reader = arena
    segment, metas = _tensors.write_tensors(owner, [list(tensors.items())])
    buffer = reader.attach(segment) if segment else None
    return {meta.name: _tensors.read_tensor(buffer, meta, copy=True) for meta in metas[0]}


@pytest.mark.parametrize("rows", [3, 20_000], ids=["inline", "arena"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_numeric_round_trip_is_exact(arena, dtype, rows):
    rng = np.random.default_rng(0)
    data = (rng.random((rows, 5)) * 100).astype(dtype)
    out = _round_trip(arena, {"x": data})["x"]
    assert out.dtype == data.dtype and out.shape == data.shape
    np.testing.assert_array_equal(out, data)


def test_bytes_round_trip(arena):
    data = np.array([[b"a", b""], [b"\x00\xffbinary", "unicode \u00e9".encode()]], dtype=object)
    out = _round_trip(arena, {"s": data})["s"]
    assert out.dtype == object and out.shape == (2, 2)
    assert out.tolist() == data.tolist()
    fixed = np.array([b"ab", b"c"], dtype="S2")
    assert _round_trip(arena, {"s": fixed})["s"].tolist() == [b"ab", b"c"]
    large = np.array([b"x" * 1000] * 200, dtype=object)  # 200 KB: through the arena
    assert _round_trip(arena, {"s": large})["s"].tolist() == large.tolist()


def test_fortran_non_contiguous_and_zero_size(arena):
    base = np.arange(240_000, dtype=np.float32).reshape(400, 600)
    tensors = {"f": np.asfortranarray(base), "strided": base[:, ::2], "empty": np.zeros((0, 3), np.int32)}
    out = _round_trip(arena, tensors)
    np.testing.assert_array_equal(out["f"], base)
    np.testing.assert_array_equal(out["strided"], base[:, ::2])
    assert out["empty"].shape == (0, 3) and out["empty"].dtype == np.int32


def test_arena_grows_and_reader_follows(arena):
    owner, reader = arena
    small = _round_trip(arena, {"x": np.ones(10, np.float32)})
    first = owner.name
    big = np.arange(1 << 20, dtype=np.float64)
    out = _round_trip(arena, {"x": big})["x"]
    assert owner.name != first and owner.size >= big.nbytes
    np.testing.assert_array_equal(out, big)
    assert small["x"].sum() == 10
    # The reader unlinks every segment it mapped: nothing is left visible in /dev/shm.
    assert not os.path.exists(os.path.join(_arena.SHM_DIR, owner.name))


def test_copies_do_not_alias_the_arena(arena):
    owner, reader = arena
    for size in (8, 100_000):
        first = _round_trip(arena, {"x": np.full(size, 1.0)})["x"]
        _round_trip(arena, {"x": np.full(size, 2.0)})
        assert (first == 1.0).all() and first.flags.writeable


def test_channel_frames_over_a_socket_pair():
    import socket
    import threading

    left, right = socket.socketpair()
    with left, right:
        sender, receiver = _wire.SocketChannel(left), _wire.SocketChannel(right, poll_s=0.001)
        big = Error("x" * 3_000_000, True, 1.5)  # larger than the socket buffer
        thread = threading.Thread(target=sender.send, args=(big,))
        thread.start()
        assert receiver.recv() == big
        thread.join(5)
        # Several frames in flight at once are split correctly.
        for index in range(50):
            sender.send(Welcome("z" * index))
        assert [receiver.recv() for _ in range(50)] == [Welcome("z" * i) for i in range(50)]
        left.close()
        with pytest.raises(EOFError):
            receiver.recv()


def _poll_window_of_next_recv(channel, sock):
    """The polling window ``channel.recv()`` chose for its next message (0.0: it sleeps).

    Observed through the read it makes, not through CPU time, so a loaded machine cannot change
    the answer.
    """
    chosen = []
    real_read = channel._read

    def spy(size, poll_s):
        chosen.append(poll_s)
        return real_read(size, poll_s)

    channel._read = spy
    try:
        _wire.SocketChannel(sock).send(_messages.NEXT_MESSAGE)
        assert channel.recv() == _messages.NEXT_MESSAGE
    finally:
        del channel._read
    return chosen[0]


def test_channel_polls_only_while_messages_come_within_the_window():
    left, right = socket.socketpair()
    with left, right:
        receiver = _wire.SocketChannel(right, poll_s=0.5)
        # Fresh channel: messages are assumed to come fast, so it polls until one does.
        assert _poll_window_of_next_recv(receiver, left) == 0.5
        # Once waits are usually longer than the window, it sleeps instead of polling.
        receiver._typical_wait_s = 1.0
        assert _poll_window_of_next_recv(receiver, left) == 0.0
        # A run of quick exchanges brings polling back (a moving average, not a one-off switch).
        for _ in range(40):
            receiver.send(_messages.ASK_MESSAGE)
            _wire.SocketChannel(left).send(_messages.Cancelled([True]))
            assert receiver.recv() == _messages.Cancelled([True])
        assert receiver._typical_wait_s < 0.5
        assert _poll_window_of_next_recv(receiver, left) == 0.5
        # Polling off: it never polls, however fast messages come.
        assert _poll_window_of_next_recv(_wire.SocketChannel(right), left) == 0.0


def test_a_polling_read_still_returns_a_late_message():
    left, right = socket.socketpair()
    with left, right:
        receiver = _wire.SocketChannel(right, poll_s=0.01)  # the window runs out before the message comes
        timer = threading.Timer(0.05, lambda: _wire.SocketChannel(left).send(Welcome("late")))
        timer.start()
        try:
            assert receiver.recv() == Welcome("late")
        finally:
            timer.join(5)


def test_views_keep_their_mapping_alive(arena):
    owner, reader = arena
    data = np.arange(100_000, dtype=np.float64)
    segment, metas = _tensors.write_tensors(owner, [[("x", data)]])
    view = _tensors.read_tensor(reader.attach(segment), metas[0][0], copy=False)
    reader.close()  # the reader lets go, but the view must stay readable (no unmap under it)
    owner.close()
    assert view.sum() == data.sum()


def test_outputs_lying_in_the_receivers_arena_are_referenced_not_copied(arena):
    """An input returned as is (or a contiguous slice of it) goes back as an offset into the sender's arena."""
    owner, reader = arena
    data = np.arange(50_000, dtype=np.float32).reshape(2, 25_000)
    segment, metas = _tensors.write_tensors(owner, [[("x", data)]])
    view = _tensors.read_tensor(reader.attach(segment), metas[0][0], copy=False)  # what the callable gets
    answer = _arena.SharedArena(f"pytriton-{os.getpid()}-unittest-answer")
    try:
        outputs = [("same", view), ("row", view[1]), ("strided", view[:, ::2]), ("fresh", view * 2)]
        answer_segment, answer_metas = _tensors.write_tensors(answer, [outputs], peer=reader)
        where = {meta.name: (meta.place, meta.offset, meta.nbytes) for meta in answer_metas[0]}
        start = metas[0][0].offset
        assert where["same"] == (_messages.RECEIVER, start, data.nbytes)
        assert where["row"] == (_messages.RECEIVER, start + data.nbytes // 2, data.nbytes // 2)
        # copied into the answer arena
        assert where["strided"][0] == _messages.SENDER and where["fresh"][0] == _messages.SENDER
        assert answer_segment == answer.name
        # The original writer resolves the references against its own arena.
        own = owner.buffer
        back = {m.name: _tensors.read_tensor(answer.buffer, m, copy=True, own=own) for m in answer_metas[0]}
        np.testing.assert_array_equal(back["same"], data)
        np.testing.assert_array_equal(back["row"], data[1])
        np.testing.assert_array_equal(back["strided"], data[:, ::2])
        np.testing.assert_array_equal(back["fresh"], data * 2)
        del view, outputs, back
    finally:
        answer.close()


def _allocated(fd):
    return os.fstat(fd).st_blocks * 512


def test_arena_release_gives_pages_back_and_stays_usable(arena):
    owner, reader = arena
    data = np.arange(2 << 20, dtype=np.float32)  # 8 MiB
    segment, metas = _tensors.write_tensors(owner, [[("x", data)]])
    fd = os.open(os.path.join(_arena.SHM_DIR, segment), os.O_RDONLY)  # to watch the segment after unlinking
    try:
        buffer = reader.attach(segment)  # the reader unlinks the name
        assert _allocated(fd) >= data.nbytes
        assert owner.release(1 << 20) >= data.nbytes - (1 << 20)
        assert _allocated(fd) <= (1 << 20) + 4096
        np.testing.assert_array_equal(_tensors.read_tensor(buffer, metas[0][0], copy=True)[: 1 << 18], data[: 1 << 18])
        # The segment is reused as before: new data arrives intact, pages are faulted in again.
        segment_again, metas = _tensors.write_tensors(owner, [[("x", data * 2)]])
        assert segment_again == segment and _allocated(fd) >= data.nbytes
        np.testing.assert_array_equal(_tensors.read_tensor(buffer, metas[0][0], copy=True), data * 2)
        # The reader can release the peer's pages too (between messages), for both processes.
        assert reader.release(0) >= data.nbytes
        assert _allocated(fd) == 0
    finally:
        os.close(fd)
    assert owner.release(owner.size) == 0  # nothing past the end


def test_idle_releaser_waits_for_idleness(arena):
    owner, reader = arena
    data = np.ones(1 << 20, dtype=np.float64)  # 8 MiB
    releaser = _arena.IdleReleaser(lambda: (owner, reader), idle_s=0.05, keep=1 << 20)
    try:
        releaser.enter()
        segment, _ = _tensors.write_tensors(owner, [[("x", data)]])
        reader.attach(segment)
        time.sleep(0.3)
        assert releaser.released == 0  # a message in flight: never released under it
        releaser.leave()
        assert wait_for(lambda: releaser.released > 0, timeout_s=10)
        # One pass releases the two arenas one after the other, under the releaser's lock: read the
        # count once that pass is over (a read between the two, likelier under load, saw it grow after).
        with releaser._lock:
            released = releaser.released
        time.sleep(0.3)
        assert releaser.released == released  # nothing used since: no second release
        releaser.enter()
        _tensors.write_tensors(owner, [[("x", data)]])
        releaser.leave()
        assert wait_for(lambda: releaser.released > released, timeout_s=10)
    finally:
        releaser.close()


# -- messages -------------------------------------------------------------------------------------
def test_every_final_reply_carries_a_retire_flag_and_a_duration():
    for final in (Ok(None, []), Error("boom"), End()):
        assert final.retire is False and final.duration_s is None
        kept = final.settled(True, 0.25)
        assert type(kept) is type(final) and kept.retire is True and kept.duration_s == 0.25
        assert final.retire is False  # settled() builds a new record
    assert Error("boom").settled(True, None).text == "boom"
    # A text that happens to be truthy is never read as the flag (the old positional layout did).
    assert Error("True").retire is False


def _through_a_channel(message):
    left, right = socket.socketpair()
    with left, right:
        _wire.SocketChannel(left).send(message)
        return _wire.SocketChannel(right).recv()


META = TensorMeta("y", "<f4", (1,), _messages.INLINE, b"\0\0\0\0", 0, 4)


@pytest.mark.parametrize(
    "message",
    [
        Hello(1234, 7),
        Welcome("m-0"),
        Infer(None, []),
        Infer("in", [Entry([META], None, ["y"])]),
        Infer("in", [Entry([META], {"p": 1, "q": "s"}, None, (7, True, False), 2.5)], (123, ["{}", None])),
        Ok("segment-name", [[META, TensorMeta("z", "<i8", (2, 3), _messages.SENDER, None, 64, 48)]], True),
        Ok(None, [], False, 0.5),
        Error("boom", True, 1.0),
        Chunk(None, [[META]]),
        End(True),
        _messages.Cancelled([True, False]),
        _messages.NEXT_MESSAGE,
        _messages.CANCEL_MESSAGE,
        _messages.BYE_MESSAGE,
        _messages.ASK_MESSAGE,
    ],
    ids=lambda message: type(message).__name__,
)
def test_every_message_kind_survives_the_channel_with_its_fields(message):
    received = _through_a_channel(message)
    assert type(received) is type(message) and received == message


def test_every_kind_has_a_fixed_arity():
    """Absent optional fields travel as None (or 0): no reader tells fields apart by tuple length."""
    assert Infer(None, []).encode() == (_messages.INFER, None, [], None)
    assert Entry([META]).encode() == ([META.encode()], None, None, None, 0.0)
    assert Ok("out", []).encode() == (_messages.OK, "out", [], False, None)
    assert Error("x").encode() == (_messages.ERROR, "x", False, None)
    assert End().encode() == (_messages.END, False, None)
    assert len(META.encode()) == 7


@pytest.mark.parametrize(
    "frame",
    [
        (),
        [1, 2],
        (99,),
        (_messages.HELLO, 1),
        (_messages.HELLO, "1", 2),
        (_messages.INFER, None, [([("x", "<f4", (1,), 0, b"", 0)], None, None, None, 0.0)], None),
        (_messages.INFER, None, [], ("not", "a", "trace")),
        (_messages.OK, 5, [], False, None),
        (_messages.NEXT, 1),
    ],
)
def test_decode_refuses_what_is_not_a_message(frame):
    with pytest.raises((TypeError, ValueError)):
        _messages.decode(frame)


def test_the_stream_window_rule():
    inline, in_arena = Chunk(None, []), Chunk("segment", [])
    # A chunk in the arena is acknowledged at once: its memory is reused for the next one.
    assert _messages.must_acknowledge(in_arena, 1)
    # Inline chunks run ahead up to the window, then wait for NEXT or CANCEL.
    assert not any(_messages.must_acknowledge(inline, count) for count in range(1, _messages.STREAM_WINDOW))
    assert _messages.must_acknowledge(inline, _messages.STREAM_WINDOW)


def test_owner_pid_reads_both_naming_schemes():
    assert _segments._owner_pid("pytriton-123-m0-arena") == 123
    assert _segments._owner_pid("pytriton-inproc-456-1-region") == 456
    for foreign in ("other-123-x", "pytriton-abc-x", "pytriton-inproc-x-1", "pytriton-1"):
        assert _segments._owner_pid(foreign) is None, foreign


def test_sweep_dead_owners_removes_regions_of_dead_in_process_servers():
    # A pid that cannot be running: beyond the kernel's pid_max.
    dead = int(pathlib.Path("/proc/sys/kernel/pid_max").read_text()) + 1
    names = [f"pytriton-inproc-{dead}-1-unittest", f"pytriton-inproc-{os.getpid()}-1-unittest"]
    for name in names:
        with open(os.path.join(_arena.SHM_DIR, name), "wb"):
            pass
    try:
        assert names[0] in _segments.sweep_dead_owners()
        assert not os.path.exists(os.path.join(_arena.SHM_DIR, names[0]))
        assert os.path.exists(os.path.join(_arena.SHM_DIR, names[1]))  # ours: alive
    finally:
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(_arena.SHM_DIR, name))


@pytest.mark.parametrize("code", ["|O", "O", "O,<i4"])
@pytest.mark.parametrize("copy", [False, True])
def test_an_inline_tensor_of_python_objects_is_refused(code, copy):
    """Raw bytes read as object pointers would crash the reader (or worse): a peer's code is checked."""
    meta = _messages.TensorMeta("x", code, (1,), _messages.INLINE, b"\x01" * 16, 0, 16)
    with pytest.raises(ValueError, match="Python objects"):
        _tensors.read_tensor(None, meta, copy)


@pytest.mark.parametrize("copy", [False, True])
@pytest.mark.parametrize("shape", [(1,), (3,), ("a",), (10**18,)])
def test_an_inline_tensor_whose_bytes_do_not_match_its_shape_is_refused(shape, copy):
    meta = _messages.TensorMeta("x", "<f4", shape, _messages.INLINE, b"\x00" * 8, 0, 8)
    with pytest.raises(ValueError, match="do not hold shape"):
        _tensors.read_tensor(None, meta, copy)


def test_an_inline_copy_is_writable_memory_of_its_own():
    data = np.arange(6, dtype=">i2").reshape(2, 3)  # a non-native byte order keeps its own dtype string
    _, (metas,) = _tensors.write_tensors(None, [[("x", data)]])
    assert metas[0].dtype == ">i2"
    view = _tensors.read_tensor(None, metas[0], False)
    copy = _tensors.read_tensor(None, metas[0], True)
    assert not view.flags.writeable and copy.flags.writeable and copy.dtype == data.dtype
    copy[0, 0] = 99
    np.testing.assert_array_equal(view, data)  # the message's bytes are untouched
    np.testing.assert_array_equal(_tensors.read_tensor(None, metas[0], True), data)


def test_a_polling_read_sees_the_peer_close():
    left, right = socket.socketpair()
    with right:
        receiver = _wire.SocketChannel(right, poll_s=5.0)
        threading.Timer(0.05, left.close).start()
        started = time.monotonic()
        with pytest.raises(EOFError):
            receiver.recv()
        assert time.monotonic() - started < 4.0  # seen while polling, not after the window
