"""The proxy's wire format and shared-memory arenas, without a server."""

import contextlib
import os
import pathlib
import socket
import threading
import time

import numpy as np
import pytest

from pytriton.proxy.stubside import _arena, _segments, _tensors, _wire
from tests.conftest import DTYPES, wait_for


@pytest.fixture()
def arena():
    owner = _arena.Arena(f"pytriton-{os.getpid()}-unittest", initial_size=4096)
    reader = _arena.ArenaReader()
    yield owner, reader
    owner.close()
    reader.close()
    assert not _segments.sweep_segments(f"pytriton-{os.getpid()}-unittest")


def _round_trip(arena, tensors):
    owner, reader = arena
    segment, metas = _tensors.write_tensors(owner, [list(tensors.items())])
    buffer = reader.attach(segment) if segment else None
    return {meta[0]: _tensors.read_tensor(buffer, meta, copy=True) for meta in metas[0]}


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
        sender, receiver = _wire.Channel(left), _wire.Channel(right, poll_s=0.001)
        big = ("x" * 3_000_000, [1, 2, (3, "y")], None)  # larger than the socket buffer
        thread = threading.Thread(target=sender.send, args=(big,))
        thread.start()
        assert receiver.recv() == big
        thread.join(5)
        # Several frames in flight at once are split correctly.
        for index in range(50):
            sender.send((index, b"z" * index))
        assert [receiver.recv() for _ in range(50)] == [(i, b"z" * i) for i in range(50)]
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
        _wire.Channel(sock).send(("message",))
        assert channel.recv() == ("message",)
    finally:
        del channel._read
    return chosen[0]


def test_channel_polls_only_while_messages_come_within_the_window():
    left, right = socket.socketpair()
    with left, right:
        receiver = _wire.Channel(right, poll_s=0.5)
        # Fresh channel: messages are assumed to come fast, so it polls until one does.
        assert _poll_window_of_next_recv(receiver, left) == 0.5
        # Once waits are usually longer than the window, it sleeps instead of polling.
        receiver._typical_wait_s = 1.0
        assert _poll_window_of_next_recv(receiver, left) == 0.0
        # A run of quick exchanges brings polling back (a moving average, not a one-off switch).
        for _ in range(40):
            receiver.send(("ping",))
            _wire.Channel(left).send(("pong",))
            assert receiver.recv() == ("pong",)
        assert receiver._typical_wait_s < 0.5
        assert _poll_window_of_next_recv(receiver, left) == 0.5
        # Polling off: it never polls, however fast messages come.
        assert _poll_window_of_next_recv(_wire.Channel(right), left) == 0.0


def test_a_polling_read_still_returns_a_late_message():
    left, right = socket.socketpair()
    with left, right:
        receiver = _wire.Channel(right, poll_s=0.01)  # the window runs out before the message comes
        timer = threading.Timer(0.05, lambda: _wire.Channel(left).send(("late",)))
        timer.start()
        try:
            assert receiver.recv() == ("late",)
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
    answer = _arena.Arena(f"pytriton-{os.getpid()}-unittest-answer")
    try:
        outputs = [("same", view), ("row", view[1]), ("strided", view[:, ::2]), ("fresh", view * 2)]
        answer_segment, answer_metas = _tensors.write_tensors(answer, [outputs], peer=reader)
        payloads = {meta[0]: meta[3] for meta in answer_metas[0]}
        assert payloads["same"] == (metas[0][0][3][0], data.nbytes, _tensors.IN_RECEIVER)
        assert payloads["row"] == (metas[0][0][3][0] + data.nbytes // 2, data.nbytes // 2, _tensors.IN_RECEIVER)
        assert len(payloads["strided"]) == 2 and len(payloads["fresh"]) == 2  # copied into the answer arena
        assert answer_segment == answer.name
        # The original writer resolves the references against its own arena.
        own = owner.buffer
        back = {m[0]: _tensors.read_tensor(answer.buffer, m, copy=True, own=own) for m in answer_metas[0]}
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
def test_every_final_reply_carries_a_retire_flag():
    for final in (_wire.ok(None, []), _wire.error("boom"), _wire.end()):
        assert final[_wire.KIND] in _wire.FINAL_KINDS
        assert _wire.retires(final) is False
        kept = _wire.with_retire(final, True)
        assert _wire.retires(kept) is True and kept[_wire.KIND] == final[_wire.KIND] and len(kept) == len(final)
    assert _wire.error("boom")[_wire.TEXT] == "boom"
    # A text that happens to be truthy is never read as the flag (the old positional layout did).
    assert _wire.retires(_wire.error("True")) is False


def test_messages_survive_the_channel_with_their_fields():
    left, right = socket.socketpair()
    try:
        sender, receiver = _wire.Channel(left), _wire.Channel(right)
        sender.send(_wire.hello(1234, 7))
        assert _wire.parse_hello(receiver.recv()) == (1234, 7)
        sender.send(_wire.ok("segment-name", [[("y", "<f4", (1,), b"\0\0\0\0")]], True))
        reply = receiver.recv()
        assert reply[_wire.KIND] == _wire.OK and reply[_wire.SEGMENT] == "segment-name"
        assert reply[_wire.BODY][0][0][0] == "y" and _wire.retires(reply)
        sender.send(_wire.infer(None, []))
        assert receiver.recv() == (_wire.INFER, None, [])
    finally:
        left.close()
        right.close()


def test_each_received_message_kind_has_a_parser_with_named_fields():
    assert _wire.parse_hello(_wire.hello(1234, 7)) == _wire.Hello(stub_pid=1234, generation=7)
    assert _wire.parse_welcome(_wire.welcome("m-0")).slot == "m-0"
    entries = [([("x", "<f4", (1,), b"\0\0\0\0")], None, ["y"])]
    assert _wire.parse_infer(_wire.infer("in", entries)) == _wire.Infer(segment="in", entries=entries)
    assert _wire.parse_ok(_wire.ok("out", [[]], True)) == _wire.Ok(segment="out", results=[[]], retire=True)
    assert _wire.parse_ok(_wire.ok(None, [])).retire is False
    assert _wire.parse_error(_wire.error("True")) == _wire.Error(text="True", retire=False)
    assert _wire.parse_error(_wire.with_retire(_wire.error("boom"), True)).retire is True
    assert _wire.parse_chunk(_wire.chunk(None, [[]])) == _wire.Chunk(segment=None, results=[[]])
    assert _wire.parse_end(_wire.end()).retire is False and _wire.parse_end(_wire.end(True)).retire is True
    # The builders still produce plain tuples (marshal refuses tuple subclasses): the wire is unchanged.
    assert _wire.ok("out", [], True) == (_wire.OK, "out", [], True) and _wire.end() == (_wire.END, False)


def test_the_stream_window_rule():
    inline, in_arena = _wire.chunk(None, []), _wire.chunk("segment", [])
    # A chunk in the arena is acknowledged at once: its memory is reused for the next one.
    assert _wire.must_acknowledge(in_arena, 1)
    # Inline chunks run ahead up to the window, then wait for NEXT or CANCEL.
    assert not any(_wire.must_acknowledge(inline, count) for count in range(1, _wire.STREAM_WINDOW))
    assert _wire.must_acknowledge(inline, _wire.STREAM_WINDOW)


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
