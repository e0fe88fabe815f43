"""The transport between the proxy model (in Triton's stub) and the user's process: the ``Channel``
protocol and its Unix-socket framing.

This module is imported on both sides. Inside the stub only the standard library and numpy (1.x,
or 2 on Python 3.13) are available, so it imports nothing outside its package
(``stubside/__init__.py``). The encoding does not depend on either version: numeric tensors travel
as raw bytes with their dtype string, string tensors in Triton's serialized layout
(``_tensors.serialize_bytes``).

Transport: one Unix stream socket per model instance, one message each way per batch (the stub
asks, the user's worker answers; a streamed batch gets one reply per yielded result, see
``_messages.STREAM_WINDOW``). A message (a ``_messages`` record) is a 4-byte length followed by
the ``marshal`` encoding of its plain tuple (``encode``) (both ends run the same Python version, so the format matches, and it is
several times faster than JSON). A plain socket is used rather than ZeroMQ because ZeroMQ routes
every message through its I/O threads: on the 2-core reference machine a ZeroMQ ``ipc://`` round
trip took 88 us against 24 us for the socket, and 188 us against 58 us after 600 us of idleness
(a one-off benchmark, ``bench/history.md``; docs/architecture.md).

The rest of the protocol lives beside this module in the package: ``_messages`` (one record per
message kind, with its encoding), ``_tensors`` (how a tensor is described and encoded), ``_arena``
(the shared-memory arenas and their idle release) and ``_segments`` (segment names and sweeping
the leftovers of dead processes).

Each tensor is described by a ``_messages.TensorMeta``. Small tensors (up to 64 KiB) carry their
bytes inside the message: measured inside the stub, that is cheaper than any shared-memory
bookkeeping. Larger tensors are written into a shared-memory *arena* owned by the sending side, and
the header gives their offset and size in it.

Arenas are reused for every message, so steady-state traffic creates no segments. An arena grows
by replacing its segment with a bigger one; after a pause in traffic its pages past the first MiB
are given back to the system (``_arena.IdleReleaser``), so one large request does not pin its
memory. A segment is unlinked by the *reader* as soon as it has mapped it, so nothing stays in
``/dev/shm`` even if a process is later killed; the names
(``pytriton-<user pid>-<token>-...``) also let the user's process sweep leftovers of processes
that died in between.
"""

from __future__ import annotations

import marshal
import os
import select
import socket
import stat
import struct
import time
from typing import Optional, Protocol, TypeVar

from ._messages import Message, decode

# Written 0600 by Triton.bind next to the stub's model.py: what the stub needs to find its worker
# (pids, socket paths, segment prefixes), kept out of the model config that any client can read.
PRIVATE_FILE = "pytriton_private.json"


def read_owned(path: str) -> bytes:
    """The content of ``path``, a file only this process's user could have written; raises ``PermissionError`` otherwise.

    For what the stub loads from its version directory (``PRIVATE_FILE``, ``pytriton_backend.pkl``):
    opened without following a symlink, and checked on the open descriptor (so nothing can be
    swapped between check and read): a regular file owned by the stub's effective uid, not writable
    by group or other. Another local user's file renamed into place fails the model's load with
    this error instead of running as the server's user (docs/security.md).
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise PermissionError(f"pytriton: refusing {path}: it is a symlink; bind the model again") from None
        raise exc
    with os.fdopen(descriptor, "rb") as file:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise PermissionError(
                f"pytriton: refusing {path} (owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}): "
                f"the stub loads only regular files of its own user (uid {os.geteuid()}) that group and other "
                "cannot write; another user may have put it there. Bind the model again into a repository "
                "only the serving user can change."
            )
        return file.read()


_UINT32 = struct.Struct("<I")  # frame lengths
M = TypeVar("M")


class Channel(Protocol[M]):
    """A connection that carries whole messages of type ``M`` each way.

    Implemented for the proxy's messages (``Channel[_messages.Message]``) by :class:`SocketChannel`
    (Unix socket, tensors in shared memory), ``_zmq_channel.StubChannel`` and
    ``_zmq_channel.ConnectionChannel`` (TCP, every tensor inline), and for a process instance's
    control messages by ``pytriton.proxy._process``'s link. ``recv`` raises ``EOFError`` when the peer
    is gone (or, for an untrusted peer, sent something that is not a message); both raise
    ``OSError`` for a broken connection and ``socket.timeout`` after a timeout the transport was given.
    Neither is thread-safe: one sending and one receiving thread at most.
    """

    def send(self, message: M) -> None: ...

    def recv(self) -> M: ...


class SocketChannel:
    """``Channel[Message]`` over a connected stream socket: length-prefixed ``marshal`` frames.

    Bytes read past the end of a frame are kept for the next :meth:`recv`, so any number of
    frames may be in flight (streamed chunks are sent back to back). Not thread-safe: one
    reader and one writer thread at most.

    ``poll_s`` > 0 lets :meth:`recv` poll for up to that long before it sleeps, so that a message
    arriving within the window is picked up without paying for a wake-up of this thread. It
    polls only while messages usually come that fast (a moving average of the time from this
    side's previous send or receive to the next message), so a peer that is slow or idle costs
    no CPU spent polling in vain. Each poll is a ``poll(0)`` that releases the GIL.
    """

    def __init__(self, sock: socket.socket, poll_s: float = 0.0):
        self.sock = sock
        self.poll_s = poll_s
        self._buffer = bytearray()
        self._last_activity = 0.0  # perf_counter() at the previous send or completed receive
        self._typical_wait_s = 0.0
        self._poller: Optional[select.poll] = None  # made at the first polling read

    def send(self, message: Message) -> None:
        """Send one message as one frame."""
        payload = marshal.dumps(message.encode())
        self.sock.sendall(_UINT32.pack(len(payload)) + payload)
        if self.poll_s:  # the clock is read only for the polling decision (recv)
            self._last_activity = time.perf_counter()

    def recv(self) -> Message:
        """Receive one message; raise ``EOFError`` if the peer closed the connection."""
        poll_s = self.poll_s if self._typical_wait_s < self.poll_s else 0.0
        buffer = self._buffer
        if not buffer:
            # The common case: nothing left over, and one read brings exactly one whole frame, which
            # is decoded straight from the bytes read (no copy into the buffer and out again).
            data = self._read(1 << 16, poll_s)
            if len(data) >= 4 and len(data) == 4 + _UINT32.unpack_from(data)[0]:
                with memoryview(data) as view:
                    frame = marshal.loads(view[4:])
                self._note_arrival()
                return decode(frame)
            buffer += data
        while True:
            if len(buffer) >= 4:
                end = 4 + _UINT32.unpack_from(buffer)[0]
                if len(buffer) >= end:
                    with memoryview(buffer) as view:
                        frame = marshal.loads(view[4:end])
                    del buffer[:end]
                    self._note_arrival()
                    return decode(frame)
                wanted = end - len(buffer)
            else:
                wanted = 4 - len(buffer)
            buffer += self._read(max(wanted, 1 << 16), poll_s)

    def _note_arrival(self) -> None:
        if not self.poll_s:
            return
        now = time.perf_counter()
        if self._last_activity:
            self._typical_wait_s = 0.9 * self._typical_wait_s + 0.1 * (now - self._last_activity)
        self._last_activity = now

    def _read(self, size: int, poll_s: float) -> bytes:
        if poll_s > 0.0:
            # poll(0) rather than a non-blocking recv: a recv that finds nothing raises an OSError
            # whose message is looked up in the C library's locale tables, which made each round
            # about 4x as long (and filled the caches the reply is then handled with).
            poller = self._poller
            if poller is None:
                poller = self._poller = select.poll()
                poller.register(self.sock, select.POLLIN)
            deadline = time.perf_counter() + poll_s
            while time.perf_counter() < deadline:
                if poller.poll(0):
                    break  # readable, closed or failed: recv says which
        data = self.sock.recv(size)
        if not data:
            raise EOFError("peer closed the connection")
        return data
