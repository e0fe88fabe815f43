"""The TCP transport between the proxy model (in Triton's stub) and the user's process, on ZeroMQ.

Used when the Triton server and the user's process share no filesystem and no memory (another pod
or host; ``RemoteTriton(transport="tcp")``, docs/remote.md). Every message of ``_messages`` travels as
one ZeroMQ frame holding its ``marshal`` encoding, tensors included: nothing goes through shared
memory (:class:`InlineArena`).

This file is imported on both sides. It is part of the stub-side package
(``stubside/__init__.py``); inside the stub only the standard library, numpy and (for this
transport) pyzmq are available, so nothing else from pytriton is imported here.

Topology and why: the user's process binds ONE ``ROUTER`` socket per ``RemoteTriton``
(:class:`Hub`, ``tcp://<address>:<port>``; one port to open in a firewall or a Kubernetes
Service), each stub instance connects one ``DEALER`` socket to it. ``REQ``/``REP`` cannot carry
a streamed batch (several replies to one request) and ``PAIR`` accepts a single peer per port
and never notices a reconnect, while a slot sees a second connection whenever its stub reconnects
after an execution timeout or a new model generation loads next to the old one. ``ROUTER``
addresses every peer by its identity. The end of a connection ends it for the worker like the end of
a Unix socket: a stub that closes (unload, reconnect after an execution timeout) sends an empty frame
first; a stub killed outright is seen by a socket monitor (``EVENT_ACCEPTED`` and
``EVENT_DISCONNECTED`` name the file descriptor, which the hub matches to the peer's identity
through the greeting's ``SRCFD``; ZeroMQ may report a closing before the connection's last frames
are read, see ``Hub._connection_events``), or, if its host vanished, by ZeroMQ heartbeats.
(``ROUTER_NOTIFY``, which would report disconnections directly, is a draft option that the libzmq
in pyzmq's wheels leaves out.)

Authentication: the first frame of a peer must be ``PYTRITON1 <token> <route>``. The token is a
random secret written only into the model's private file (``pytriton_private.json``, mode 0600,
never in the public model config); a wrong token or unknown route is refused, and nothing else
such a peer sends is decoded (``marshal`` is not safe against hostile input, so only
authenticated peers reach it). With ``encrypt`` (``RemoteTriton``'s default) the hub is a CURVE
server: every connection is encrypted, and the stubs know the hub by its public key, written
beside the token in the private file.

Threads in the user's process (:class:`Hub`): one dispatcher thread owns the ``ROUTER`` socket
(ZeroMQ sockets are not thread-safe). It hands each authenticated connection to the listener of
its route (one per model instance slot) and each incoming frame to that connection's queue; the
worker thread serving a connection sends its replies through a private ``PUSH`` socket
(``inproc://``) that the dispatcher forwards to the peer.

Unit tests: tests/unit/test_zmq_channel.py (a loopback hub and stub channel, no server).
"""

from __future__ import annotations

import enum
import hmac
import itertools
import logging
import marshal
import mmap
import os
import queue
import socket
import threading
from typing import Any, Dict, Optional, Tuple, Union

from ._messages import INLINE, Infer, Message, decode

LOGGER = logging.getLogger("pytriton.proxy")

SCHEME = "zmq-route:"  # worker paths of this transport: "zmq-route:<hub id>/<route>"
_AUTH = b"PYTRITON1"
_OK = b"OK"
_REFUSED = b"REFUSED"
AUTH_TIMEOUT_S = 10.0
_MAX_GREETING = 4096  # a greeting is "PYTRITON1 <token> <route>": anything longer is not one
_MAX_REFUSED = 4096  # refused peers remembered at most (each is forgotten when it disconnects)


class _Unnamed(enum.Enum):
    """What the hub's descriptor table holds for a connection none of whose frames was read yet."""

    ACCEPTED = "accepted"  # open
    CLOSED = "closed"  # closed before its first frame was read


_STOP = b"stop"
_hub_ids = itertools.count(1)
_HUBS: Dict[int, Hub] = {}
_HUBS_LOCK = threading.Lock()
_LARGE = 1 << 62
HEARTBEAT_MS = 2000


def _zmq() -> Any:
    """Import pyzmq, or fail with what to install where."""
    try:
        import zmq
    except ImportError:
        import sys

        raise RuntimeError(
            "pytriton's TCP transport needs pyzmq, which this Python environment cannot import "
            f"({sys.executable}). In the user's process: pip install 'pytriton[remote]'. In the Triton server's "
            "stub environment (the python3 first on the server's PATH): pip install --target "
            "<its site-packages> pyzmq (docs/remote.md, 'The stub environment')."
        ) from None
    return zmq


class InlineArena:
    """An arena that holds nothing: with it, ``_tensors.write_tensors`` puts every tensor in the message.

    An ``_arena.Arena`` whose ``reserve`` is never reached, because no tensor exceeds ``inline_limit``.
    """

    inline_limit = _LARGE
    name = None
    buffer = None

    def reserve(self, nbytes: int) -> mmap.mmap:
        raise AssertionError("InlineArena never holds a tensor")

    def release(self, keep: int) -> int:
        return 0

    def close(self) -> None:
        pass


# -- the stub's side -------------------------------------------------------------------------
class StubChannel:
    """A ``DEALER`` connection from one stub instance to the user's hub, with a ``Channel``'s interface.

    ``send``/``recv`` exchange ``_messages`` records; ``recv`` waits for at most :meth:`settimeout`'s
    value (raising ``socket.timeout``, like the Unix channel) and raises ``EOFError`` as soon as
    the connection to the hub drops (a socket monitor reports it: ZeroMQ itself would silently
    reconnect and wait forever). ``close`` releases the sockets.
    """

    def __init__(
        self,
        *,  # three strings in a row: named at every call, so they cannot be swapped
        endpoint: str,
        token: str,
        route: str,
        server_key: Optional[str] = None,
        auth_timeout_s: float = AUTH_TIMEOUT_S,
    ):
        zmq = _zmq()
        self._zmq = zmq
        self.poll_s = 0.0
        self._timeout_ms: Optional[int] = None
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 1000)  # a goodbye still reaches the hub when we close
        # A hub on a host that vanished (no FIN, no RST) is noticed within seconds, not hours.
        self._socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        self._socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_MS)
        if server_key is not None:
            _check_curve(zmq)
            public, secret = zmq.curve_keypair()  # this connection's own, throwaway key pair
            self._socket.setsockopt(zmq.CURVE_PUBLICKEY, public)
            self._socket.setsockopt(zmq.CURVE_SECRETKEY, secret)
            self._socket.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode())
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._socket.connect(endpoint)
        self._socket.send(b" ".join([_AUTH, token.encode(), route.encode()]))
        events = dict(self._poller.poll(int(auth_timeout_s * 1000)))
        if self._socket not in events:
            self.close()
            raise ConnectionError(
                f"pytriton: no answer from the pytriton process at {endpoint} within {auth_timeout_s:g} s; check that "
                "it runs and that this address is reachable from the Triton server (RemoteTriton's tcp_address / "
                "tcp_advertised_address)"
            )
        answer = self._socket.recv()
        if answer != _OK:
            self.close()
            raise ConnectionError(f"pytriton: the pytriton process at {endpoint} refused this stub: {answer.decode()}")

    def settimeout(self, timeout_s: Optional[float]) -> None:
        """Bound every later :meth:`recv` (``None``: wait as long as the connection lasts)."""
        self._timeout_ms = None if timeout_s is None else max(1, int(timeout_s * 1000))

    def send(self, message: Message) -> None:
        self._socket.send(marshal.dumps(message.encode()), copy=False)

    def recv(self) -> Message:
        events = dict(self._poller.poll(self._timeout_ms))
        if self._socket in events:
            frame = self._socket.recv(copy=False)
            return decode(marshal.loads(frame.buffer))
        if self._monitor in events:
            raise EOFError("the connection to the pytriton process dropped")
        raise socket.timeout("timed out")

    def close(self) -> None:
        try:
            self._socket.send(b"")  # ends this connection at the hub (see the module doc)
        except Exception:  # noqa: BLE001 - nothing to tell a hub we cannot reach
            pass
        try:
            self._socket.disable_monitor()
        except Exception:  # noqa: BLE001 - already closed
            pass
        self._monitor.close(linger=0)
        self._socket.close()
        self._context.term()


def connect(endpoint: str, token: str, route: str, server_key: Optional[str] = None) -> StubChannel:
    """The stub's connection to ``route`` of the hub at ``endpoint`` (``tcp://host:port``).

    ``server_key``: the hub's CURVE public key (Z85) when the hub encrypts, else None.
    """
    return StubChannel(endpoint=endpoint, token=token, route=route, server_key=server_key)


def _check_curve(zmq: Any) -> None:
    if not zmq.has("curve"):
        raise RuntimeError(
            "pytriton's TCP transport encrypts with ZeroMQ's CURVE, which this pyzmq/libzmq lacks (no libsodium); "
            "install pyzmq's wheels (they include it), or use RemoteTriton(tcp_encryption=False) on a trusted network"
        )


# -- the user's side -------------------------------------------------------------------------
class Connection:
    """One authenticated stub connection, served by one worker thread.

    Has what the worker uses of a connected socket: ``shutdown`` (wakes a waiting :meth:`recv`),
    ``close``, and :meth:`channel`. Only the serving thread may send (its ``PUSH`` socket is
    created on its first send and closed by :meth:`close`, on that thread).
    """

    inline_only = True

    def __init__(self, hub: Hub, identity: bytes):
        self._hub = hub
        self.hub_port = hub.port
        self.identity = identity
        self._inbox: queue.SimpleQueue[Optional[bytes]] = queue.SimpleQueue()
        self._push: Any = None

    def deliver(self, frame: Optional[bytes]) -> None:
        """Called by the dispatcher: one incoming frame, or ``None`` for the end of the connection."""
        self._inbox.put(frame)

    def recv_frame(self) -> bytes:
        frame = self._inbox.get()
        if frame is None:
            self._inbox.put(None)  # every later receive sees the end too
            raise EOFError("the stub disconnected")
        return frame

    def send_frame(self, data: bytes) -> None:
        if self._push is None:
            self._push = self._hub.outbox()
        self._push.send_multipart([self.identity, data], copy=False)

    def shutdown(self, how: int = socket.SHUT_RDWR) -> None:
        self.deliver(None)

    def close(self) -> None:
        self.deliver(None)
        if self._push is not None:
            self._push.close(linger=1000)
            self._push = None
        self._hub.forget(self.identity)

    def channel(self, poll_s: float = 0.0) -> ConnectionChannel:
        return ConnectionChannel(self)


class ConnectionChannel:
    """A ``_wire.Channel`` over a :class:`Connection` (``poll_s`` is accepted and unused)."""

    poll_s = 0.0

    def __init__(self, connection: Connection):
        self.sock = connection
        self._connection = connection

    def send(self, message: Message) -> None:
        self._connection.send_frame(marshal.dumps(message.encode()))

    def recv(self) -> Message:
        """The next message of the stub; ``EOFError`` at the end of the connection or for a malformed message.

        A malformed message ends the connection (the peer holds the token, yet it is broken or
        hostile): anything ``marshal`` cannot decode, anything but a tuple starting with a message
        kind, and an INFER naming a shared-memory segment (over TCP every tensor travels in the
        message, so such a name could only make this process map a segment it was never given).
        """
        frame = self._connection.recv_frame()
        try:
            raw = marshal.loads(frame)
        except Exception as exc:  # noqa: BLE001 - ValueError, EOFError, TypeError: all mean "not ours"
            raise self._malformed(f"undecodable ({type(exc).__name__})") from None
        if type(raw) is not tuple or not raw or type(raw[0]) is not int:
            raise self._malformed("not a pytriton message")
        try:
            message = decode(raw)
        except Exception as exc:  # noqa: BLE001 - a wrong arity or field type: not a message of ours
            raise self._malformed(f"not a pytriton message ({type(exc).__name__})") from None
        if type(message) is Infer and (
            message.segment is not None or any(m.place != INLINE for e in message.entries for m in e.tensors)
        ):
            raise self._malformed("an INFER message that is not inline")
        return message

    def _malformed(self, what: str) -> EOFError:
        LOGGER.warning(
            "pytriton TCP hub on port %d closed an authenticated connection after a malformed message: %s",
            self._connection.hub_port,
            what,
        )
        return EOFError(f"malformed message from the stub: {what}")


class Listener:
    """The connections of one route (a model instance slot), with what the worker uses of a listening socket."""

    def __init__(self, hub: Hub, route: str):
        self._hub = hub
        self.route = route
        self._pending: queue.SimpleQueue[Optional[Connection]] = queue.SimpleQueue()

    def offer(self, connection: Connection) -> None:
        self._pending.put(connection)

    def accept(self) -> Tuple[Connection, str]:
        connection = self._pending.get()
        if connection is None:
            self._pending.put(None)
            raise OSError("listener closed")
        return connection, self.route

    def shutdown(self, how: int = socket.SHUT_RDWR) -> None:
        self._pending.put(None)

    def close(self) -> None:
        self._hub.unregister(self.route)
        self.shutdown()


class Hub:
    """The user process's TCP endpoint: one ``ROUTER`` socket and its dispatcher thread.

    Lifetime: binds at construction (``port`` 0 picks a free port; :attr:`port` tells which);
    :meth:`close` stops the thread and releases the sockets. Connections still open then see the
    end of their stream.
    """

    def __init__(self, address: str, port: int, token: str, advertised: Optional[str] = None, encrypt: bool = False):
        zmq = _zmq()
        self._zmq = zmq
        self.id = next(_hub_ids)
        self.token = token
        self._context = zmq.Context()
        self._router = self._context.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        # CURVE: every connection encrypted and the hub authenticated to the stubs by its key, which
        # travels with the token in the private file. Stubs are authenticated by the token, not by key.
        self.public_key: Optional[str] = None
        if encrypt:
            _check_curve(zmq)
            public, secret = zmq.curve_keypair()
            self._router.setsockopt(zmq.CURVE_SERVER, 1)
            self._router.setsockopt(zmq.CURVE_SECRETKEY, secret)
            self.public_key = public.decode()
        self._router.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        self._router.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_MS)
        # Connections accepted and closed, so that a peer is forgotten when its connection ends.
        self._monitor = self._router.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        # file descriptor -> the identity whose frames arrive on it, or an _Unnamed state for a
        # connection none of whose frames was read yet (see _connection_events).
        self._fds: Dict[int, Union[bytes, _Unnamed]] = {}
        self._router.bind(f"tcp://{address}:{port}")
        bound = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port = int(bound.rsplit(":", 1)[1])
        # Where the stubs connect: the bound address, unless the server reaches us by another name.
        self.endpoint = f"tcp://{advertised or address}:{self.port}"
        self._outbox_endpoint = f"inproc://pytriton-hub-{os.getpid()}-{self.id}"
        self._pull = self._context.socket(zmq.PULL)
        self._pull.bind(self._outbox_endpoint)
        self._lock = threading.Lock()
        self._routes: Dict[str, Listener] = {}
        self._peers: Dict[bytes, Connection] = {}
        self._refused: Dict[bytes, bool] = {}
        self._closed = False
        with _HUBS_LOCK:
            _HUBS[self.id] = self
        self._thread = threading.Thread(target=self._run, name=f"pytriton-tcp-hub-{self.port}", daemon=True)
        self._thread.start()

    def path(self, route: str) -> str:
        """The worker path of ``route`` (``InstanceWorker(path=...)``), resolved by :func:`listen`."""
        return f"{SCHEME}{self.id}/{route}"

    def register(self, route: str) -> Listener:
        with self._lock:
            listener = self._routes[route] = Listener(self, route)
        return listener

    def unregister(self, route: str) -> None:
        with self._lock:
            self._routes.pop(route, None)

    def forget(self, identity: bytes) -> None:
        with self._lock:
            self._peers.pop(identity, None)

    def outbox(self) -> Any:
        """A new ``PUSH`` socket into the dispatcher (for one sending thread)."""
        push = self._context.socket(self._zmq.PUSH)
        push.connect(self._outbox_endpoint)
        return push

    def _run(self) -> None:
        zmq = self._zmq
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if self._pull in events:
                    identity, data = self._pull.recv_multipart(copy=False)
                    if identity.bytes == b"" and data.bytes == _STOP:
                        return
                    try:
                        self._router.send_multipart([identity, data], copy=False)
                    except zmq.ZMQError:  # the peer is gone (ROUTER_MANDATORY is off: rarely raised)
                        pass
                if self._monitor in events:
                    self._connection_events()
                if self._router in events:
                    self._receive()
        except Exception:  # noqa: BLE001 - log whatever ends this thread
            LOGGER.exception("pytriton TCP hub on port %d failed", self.port)
        finally:
            with self._lock:
                peers = list(self._peers.values())
                listeners = list(self._routes.values())
            for peer in peers:
                peer.deliver(None)
            for listener in listeners:
                listener.shutdown()

    def _connection_events(self) -> None:
        """Take in every connection accepted or closed so far (monitor events, read without waiting).

        ZeroMQ reports a connection's acceptance before any of its frames can be read, but may
        report its closing before its last (or only) frames are read. So each descriptor's entry
        says which connection it is at: ``ACCEPTED`` from the acceptance until the first frame names
        the identity (:meth:`_track`), ``CLOSED`` if it closed before that (the first frame then
        finds its peer gone), the identity after. A closing ends that identity's connection and
        forgets a refusal of it; an acceptance on a descriptor still held by an identity does too.
        """
        from zmq.utils.monitor import parse_monitor_message

        zmq = self._zmq
        while True:
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = parse_monitor_message(frames)
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._gone(self._fds.get(fd))
                self._fds[fd] = _Unnamed.ACCEPTED
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                state = self._fds.pop(fd, None)
                if state is _Unnamed.ACCEPTED:
                    self._fds[fd] = _Unnamed.CLOSED
                else:
                    self._gone(state)

    def _gone(self, identity: Union[bytes, _Unnamed, None]) -> None:
        """The connection of ``identity`` is closed: end it, and forget a refusal of it."""
        if not isinstance(identity, bytes):  # no identity named yet: nothing to end or forget
            return
        self._refused.pop(identity, None)
        with self._lock:
            peer = self._peers.pop(identity, None)
        if peer is not None:
            peer.deliver(None)

    def _receive(self) -> None:
        """Take one message from the ``ROUTER`` socket; nothing a peer sends may end the dispatcher.

        A peer decides what arrives here: any number of frames of any content, before or after it
        authenticated. A message that is not exactly one frame (ZeroMQ puts the peer's identity in
        front) is a protocol violation: the peer is refused (an authenticated one loses its
        connection) and everything it sends later is dropped unread. An error while handling one
        message ends that peer only, never this thread.
        """
        frames = self._router.recv_multipart(copy=False)
        identity = frames[0].bytes
        try:
            if len(frames) != 2:
                self._refuse(identity, frames[-1], "a pytriton message is one frame")
                return
            self._incoming(identity, frames[1])
        except Exception as exc:  # noqa: BLE001 - a hostile or broken peer costs its own connection only
            LOGGER.warning(
                "pytriton TCP hub on port %d dropped a peer after a message it could not handle (%s: %s)",
                self.port,
                type(exc).__name__,
                exc,
            )
            self._refuse(identity, frames[-1], f"unexpected message ({type(exc).__name__})")

    def _refuse(self, identity: bytes, frame: object, reason: str) -> None:
        """Refuse ``identity`` for good: its connection (if any) ends and its later frames are dropped unread.

        ``frame`` is one of its frames, whose source descriptor lets a disconnection forget the peer;
        None when that is unknown or already recorded. Once its closing is taken in, the refusal is
        forgotten (a bounded memory); a frame of it read after that is refused again, without a
        second log line or reply (see :meth:`_track`).
        """
        with self._lock:
            peer = self._peers.pop(identity, None)
        if peer is not None:
            peer.deliver(None)
        if identity in self._refused:
            return
        self._refused[identity] = True
        if frame is not None:
            self._connection_events()  # as for a new peer: this frame's connection was accepted already
            if self._track(identity, frame):
                # A later frame of a connection that closed after it was refused (its refusal was
                # forgotten then): it was logged and answered once, and nobody reads a reply now.
                return
        # After _track, which may have forgotten this refusal again: such a frame evicts no other.
        while len(self._refused) > _MAX_REFUSED:  # a hard bound, whatever ZeroMQ reports or not
            self._refused.pop(next(iter(self._refused)))  # the oldest: its later frames are refused again
        LOGGER.warning("pytriton TCP hub on port %d refused a connection: %s", self.port, reason)
        try:
            self._router.send_multipart([identity, _REFUSED + b" " + reason.encode()], flags=self._zmq.NOBLOCK)
        except self._zmq.ZMQError:  # the peer is gone or does not read: nothing to tell it
            pass

    def _track(self, identity: bytes, frame: Any) -> bool:
        """Remember which descriptor ``identity`` arrives on, so that its disconnection forgets it.

        Called after :meth:`_connection_events`, so the descriptor's entry is this frame's
        connection or a later one:

        - no entry, for a refused ``identity``: the closing of the connection on it was taken in and
          no connection was accepted on it since. A frame of a closed connection can still be read
          after its closing was reported, so this one's connection is closed and the refusal is
          forgotten. Returns True: the frame is a late one, its connection dealt with already.
          (For an authenticated peer, no entry is taken as a live connection whose acceptance was
          not reported: the monitor drops events when it falls behind, and a stub's connection is
          never ended on that evidence.)
        - ``CLOSED``: the connection on it closed after its acceptance and before any of its frames
          was read, so this frame's connection is closed, whichever it was; ``identity`` is gone.
        - another identity: one of the two connections is closed (a frame can be read after its
          connection's closing was reported, even after the descriptor's next acceptance), but which
          is not known here, so only a refusal of that identity is forgotten; a live peer's
          connection is never ended on this evidence.

        Returns False except in the first case.
        """
        try:
            fd = int(frame.get(self._zmq.SRCFD))
        except Exception:  # noqa: BLE001 - a frame without a source descriptor: kept until the hub closes
            return False
        previous = self._fds.get(fd)
        if previous is None and identity in self._refused:
            self._refused.pop(identity, None)
            return True
        if previous is _Unnamed.CLOSED:
            del self._fds[fd]
            self._gone(identity)
            return False
        if isinstance(previous, bytes) and previous != identity:
            self._refused.pop(previous, None)
        self._fds[fd] = identity
        return False

    def _incoming(self, identity: bytes, data: Any) -> None:
        with self._lock:
            peer = self._peers.get(identity)
        if peer is not None:
            if len(data) == 0:  # the peer's goodbye: it closes its connection
                self.forget(identity)
                peer.deliver(None)
            else:
                peer.deliver(data.bytes)
            return
        if len(data) == 0:
            self._refused.pop(identity, None)
            return
        if identity in self._refused:
            return  # nothing from a refused peer is decoded
        # A new peer. Its descriptor may be a reused one: take in every connection event reported so
        # far (the closing of its previous user and this connection's acceptance came before this frame).
        self._connection_events()
        reason = self._authenticate(data.bytes)
        if reason is not None:
            self._refuse(identity, data, reason)
            return
        route = data.bytes.split(b" ")[2].decode("ascii")
        connection = Connection(self, identity)
        with self._lock:
            listener = self._routes.get(route)
            if listener is not None:
                self._peers[identity] = connection
        if listener is None:
            # Not for good: the stub of a model still loading may ask again (a fresh connection).
            self._send(identity, _REFUSED + b" no model instance is served under that route")
            return
        self._track(identity, data)
        self._send(identity, _OK)
        listener.offer(connection)

    def _send(self, identity: bytes, data: bytes) -> None:
        """A reply of the dispatcher itself; dropped when the peer does not read (never blocks this thread)."""
        try:
            self._router.send_multipart([identity, data], flags=self._zmq.NOBLOCK)
        except self._zmq.ZMQError:
            pass

    def _authenticate(self, frame: bytes) -> Optional[str]:
        """None if ``frame`` is a valid greeting, else why it is refused."""
        if len(frame) > _MAX_GREETING:
            return "not a pytriton greeting"
        parts = frame.split(b" ")
        if len(parts) != 3 or parts[0] != _AUTH:
            return "not a pytriton greeting"
        if not hmac.compare_digest(parts[1], self.token.encode()):
            return "wrong token"
        if not parts[2].isascii() or not parts[2].decode("ascii").isprintable():
            return "not a pytriton greeting"
        return None

    def close(self) -> None:
        """Stop the dispatcher and release the sockets. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        stopper = self.outbox()
        stopper.send_multipart([b"", _STOP])
        self._thread.join(5.0)
        stopper.close(linger=0)
        # destroy, not term: a worker thread left behind with a hung callable may still own a PUSH
        # socket, and term() would wait for it forever.
        self._context.destroy(linger=0)
        with _HUBS_LOCK:
            _HUBS.pop(self.id, None)


def listen(path: str) -> Listener:
    """The listener for a worker path made by :meth:`Hub.path`."""
    hub_id, route = path[len(SCHEME) :].split("/", 1)
    with _HUBS_LOCK:
        hub = _HUBS.get(int(hub_id))
    if hub is None:
        raise OSError(f"no pytriton TCP hub {hub_id} (closed?)")
    return hub.register(route)
