"""The proxy model that runs inside Triton's Python-backend stub.

``Triton.bind`` copies this package (``stubside``) whole into the model repository, beside a
``model.py`` shim that loads it (see ``stubside/__init__.py``). Only the standard library and
numpy are available here (the stub's own environment), so nothing outside this package may be
imported.

Per model instance (one stub process each) the proxy claims a free *slot* of the model by taking
an exclusive ``flock`` on ``slot-<n>-g<generation>.lock``; the kernel releases it when the stub
exits, however it exits, so a restarted instance finds its slot free again without any handshake
timeout. The generation (a model parameter) grows each time pytriton reloads the model to replace
a dead stub: the new generation's stubs then pick their slots among their own lock files while the
old generation still holds its locks. The stub talks to its slot's worker thread in the user's
process over one Unix stream socket; if the user's process dies, the socket closes and pending
requests fail at once.

With an execution timeout (``ModelConfig.execution_timeout_s``) the stub waits that long for each
reply. When it expires, the batch fails with an error naming the timeout, and the stub drops the
connection (and its arena, which the hung call may still read) and connects again: the worker
serves the new connection on a fresh thread and discards the hung call's late result.

When the connection breaks under a batch (the worker *process* of a process instance died), that
batch fails; the next batch first connects again, with fresh arenas: the user's process keeps the
slot's socket listening while it starts a new worker process (``proxy/_process.py``). A connection
found closed when a batch is sent (the worker died while idle) is made again and the batch sent
there, once: nothing of it had reached a worker.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import triton_python_backend_utils as pb_utils

from . import (
    _arena,
    _messages,
    _segments,
    _sequences,
    _stub_bytes,
    _stub_cancel,
    _stub_dlpack,
    _stub_exit,
    _stub_metrics,
    _stub_slow,
    _stub_trace,
    _tensors,
    _wire,
    _zmq_channel,
)
from ._messages import Chunk, Entry, Error, Infer, Message, Ok, SequenceFields, SequenceId, TensorMeta, TraceFields
from ._pb_types import PbRequest, PbResponseSender, PbTensor

if TYPE_CHECKING:
    import numpy.typing as npt

    # An input as _read_input gives it: numeric as numpy, BYTES still serialized.
    InputValue = Union[npt.NDArray[np.generic], _tensors.SerializedBytes]
    Inputs = List[Tuple[str, InputValue]]

# The stub is compiled against numpy 1.x. pytriton gives it a numpy 1.x environment where one
# exists; on Python 3.13 (no numpy 1.x build) it runs with numpy 2, whose ABI breaks the stub's
# own numpy conversions of numeric tensors (empty outputs), while DLPack still works. String
# (BYTES) tensors are passed through serialized, with either numpy (_stub_bytes).
_NUMPY2 = int(np.__version__.split(".")[0]) >= 2

# Claiming a slot (TritonPythonModel._claim_slot): how long a stub waits for a slot held by an
# instance that is exiting before it takes the next set of lock files, and how many sets there are
# (one per load of the same generation that can overlap: a repository-API reload overlaps twice at most).
SLOT_GRACE_S = 1.0
_SLOT_ROUNDS = 4


def _read_input(tensor: PbTensor) -> InputValue:
    """An input as numpy (numeric) or as the serialized tensor (BYTES, see _stub_bytes)."""
    array = tensor.as_numpy()
    if array.dtype.kind == "O":  # a 0-d array holding the tensor's _tensors.SerializedBytes
        return _stub_bytes.input_payload(array)
    return _stub_dlpack.array(tensor) if _NUMPY2 else array


def _dlpack_output(name: str, array: npt.NDArray[np.generic]) -> object:
    if not (array.flags.writeable and array.flags.c_contiguous):
        array = np.array(array, copy=True, order="C")  # DLPack exports writable, contiguous arrays only
    if array.size == 0:
        array = _empty_with_c_strides(array)
    return _stub_dlpack.tensor(pb_utils, name, array)


def _empty_with_c_strides(array: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
    """numpy 2 gives empty arrays all-zero strides, which the stub rejects as not C-ordered."""
    strides: List[int] = []
    step = array.itemsize
    for dim in reversed(array.shape):
        strides.insert(0, step)
        step *= dim
    base = np.empty(1, dtype=array.dtype)
    return np.lib.stride_tricks.as_strided(base, shape=array.shape, strides=strides, writeable=True)


def _bytes_output(meta: TensorMeta, buffer: Optional[_tensors.Buffer]) -> object:
    """A BYTES output straight from its serialized form on the wire (nothing parsed)."""
    return _stub_bytes.output_tensor(pb_utils, meta.name, _tensors.bytes_payload(buffer, meta), meta.shape)


def _errors(message: str, requests: Sequence[object]) -> List[object]:
    """One error response per request; the retryable refusals (a draining worker, a call failed by the
    unresponsive-model watch: ``_messages.RETRYABLE_TEXTS``) carry the UNAVAILABLE code."""
    code = getattr(pb_utils.TritonError, "UNAVAILABLE", None) if message in _messages.RETRYABLE_TEXTS else None
    if code is not None:  # HTTP 503, gRPC UNAVAILABLE (Triton 2.51 maps the code so)
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)) for _ in requests]
    return [pb_utils.InferenceResponse(error=pb_utils.TritonError(message)) for _ in requests]


def _cancelled_response() -> object:
    """The answer to a request whose client cancelled before its batch started (Triton's CANCELLED code)."""
    code = getattr(pb_utils.TritonError, "CANCELLED", None)
    if code is None:
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(_stub_cancel.CANCELLED_TEXT))
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(_stub_cancel.CANCELLED_TEXT, code))


def _rejection(text: str) -> object:
    """The error of a request refused before the callable: INVALID_ARG (HTTP 400) for a refused sequence id,
    UNAVAILABLE (HTTP 503) for a start beyond the open-sequence bound (retry once sequences ended)."""
    code = None
    if _sequences.is_refusal(text):
        code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    elif _sequences.is_bound(text):
        code = getattr(pb_utils.TritonError, "UNAVAILABLE", None)
    return pb_utils.TritonError(text) if code is None else pb_utils.TritonError(text, code)


def _input_bytes(tensors: Inputs) -> int:
    """Bytes of one request's inputs, strings counted as Triton serialises them (4-byte length + data)."""
    total = 0
    for _, array in tensors:
        if isinstance(array, _tensors.SerializedBytes):  # already in that layout (see _read_input)
            data = array.data
            total += len(data) if isinstance(data, bytes) else data.nbytes
        elif array.dtype.kind == "O":
            total += 4 * array.size + sum(map(len, array.flat))  # type: ignore[arg-type]  # items: bytes
        else:
            total += array.nbytes
    return total


def _own_backend_region(cmdline: str = "/proc/self/cmdline") -> Optional[str]:
    """This stub's Python-backend region: the second argument Triton starts the stub with, or None.

    A server started by hand (RemoteTriton) names its regions with a prefix pytriton did not
    choose, so the prefix in the private file does not match them; the stub's own argument does.
    None outside a real stub (its program is ``triton_python_backend_stub``), e.g. in unit tests.
    """
    try:
        with open(cmdline, "rb") as file:
            argv = file.read().split(b"\0")
    except OSError:
        return None
    if len(argv) < 3 or os.path.basename(argv[0]) != b"triton_python_backend_stub" or not argv[2]:
        return None
    return argv[2].decode(errors="replace")


def _size_text(nbytes: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit} ({nbytes} bytes)"
    return f"{nbytes} bytes"


# How long a stub of a model with an execution timeout waits for the welcome at least (see _connect).
_HELLO_TIMEOUT_S = 30.0

# The answer to a null request of the sequence batcher (see _sequence_fields); Triton discards it.
_NULL_REQUEST = "pytriton: null request of the sequence batcher"


class RequestsTooLarge(Exception):
    """Some requests of a batch exceed the size limit: ``rejected`` maps their index to the error text."""

    def __init__(self, rejected: Dict[int, str]):
        super().__init__(rejected)
        self.rejected = rejected


class UserProcessGone(RuntimeError):
    """The process that bound the model is no longer running (or its connection ended).

    ``unsent``: the connection had already ended when a message was sent, so the worker never
    received it (e.g. a worker process that died while idle, since replaced).
    """

    unsent = False


class ExecutionTimedOut(RuntimeError):
    """The worker did not reply within the model's execution timeout."""


class TritonPythonModel:
    """Forwards every batch to the bound callable in the user's process."""

    def initialize(self, args: Dict[str, str]) -> None:
        """Claim an instance slot, connect to its worker and say hello.

        Claiming waits at most 60 s for a free slot (one held by an instance that is still being
        unloaded), and stops waiting as soon as the user's process is gone. The answer to the hello
        is awaited like any reply (``_call``: bounded only by the model's execution timeout). An
        initialize that runs for long reports where it is in the server's log (``_stub_slow``).
        """
        instance = args.get("model_instance_name") or args["model_name"]
        with _stub_slow.reporting(f"model {args['model_name']!r}, instance {instance!r}"):
            self._initialize(args)

    def _initialize(self, args: Dict[str, str]) -> None:
        """The work of :meth:`initialize` (a backend instance's model extends it)."""
        # Before the stub first builds an array (the first request): numpy 2's table fix only for a
        # model with string tensors, sequence controls included (_stub_bytes.install).
        _stub_bytes.install(pb_utils, strings='"TYPE_STRING"' in args["model_config"])
        config = json.loads(args["model_config"])
        # What locates the worker lives in a 0600 file, not in the model config clients can read.
        private = os.path.join(args["model_repository"], args["model_version"], _wire.PRIVATE_FILE)
        params = json.loads(_wire.read_owned(private))  # a file only this user could have written
        # The backend created this instance's region 0644 just before starting us; no request has
        # used it yet. Close it (and any sibling's) to other users before the model can be ready.
        _segments.make_private(params["backend_shm_prefix"])
        region = _own_backend_region()
        if region is not None:  # also under a server whose region prefix pytriton did not choose
            _segments.make_private(region)
        self._user_pid = int(params["user_pid"])
        self._endpoint_dir = params["endpoint_dir"]
        # The TCP transport (RemoteTriton(transport="tcp"), stubside/_zmq_channel.py): the user's process
        # may run on another host, so slots are claimed in this version's own directory, its pid is
        # not checked, and every tensor travels in the messages.
        self._tcp: Optional[Dict[str, str]] = params.get("tcp")
        if self._tcp is not None:
            self._endpoint_dir = os.path.join(args["model_repository"], args["model_version"])
        slots = int(params["slots"])
        self._decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        # With one declared output there is nothing to filter (Triton rejects unknown names before
        # execute), so the per-request call for the requested names can be skipped.
        self._single_output = len(config.get("output", [])) == 1
        self._model_name = args["model_name"]
        self._max_request_bytes = int(params.get("max_request_bytes", 0))  # 0: no limit
        # The server traces in OpenTelemetry mode: forward each request's trace context (_stub_trace).
        self._trace = bool(params.get("trace", False))
        # A sequence model (docs/sequences.md): the names of the control inputs Triton adds to each
        # request; they become the request's sequence fields on the wire and are not forwarded.
        self._sequence: Optional[Dict[str, str]] = params.get("sequence")
        # string_ids=False: a string id, which Triton 2.51 lets through, is refused here (_sequences).
        self._integer_ids = _sequences.integer_ids(config)
        # SequenceBatcher.max_open_sequences; 0: no bound, as for the direct strategy (_sequences.open_limit).
        limit = _sequences.open_limit(config, int(params.get("max_open_sequences", 0)))
        self._open_sequences = _sequences.OpenSequences(limit, _sequences.idle_s(config), self._model_name)
        # SequenceBatcher.owner_header: only the caller that started a sequence may use it (_sequences).
        owner_header = params.get("owner_header")
        self._owners = (
            _sequences.SequenceOwners(owner_header, _sequences.idle_s(config), self._model_name)
            if owner_header
            else None
        )
        self._owner_log_at = -1e9  # when the last owner refusal was logged (_log_owner_refusal)
        # The generation is in the public config on purpose: a new value makes Triton reload the
        # model, which is how a dead stub is replaced (Triton.bind's healing, docs/architecture.md).
        public = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self._generation = int(public.get("pytriton.generation", "0"))
        # Once finalize begins, this process ends within this many seconds however it goes (_stub_exit).
        self._exit_deadline_s = float(params.get("exit_deadline_s", 0.0))
        timeout_s = float(params.get("execution_timeout_s", 0.0))
        self._timeout_s: Optional[float] = timeout_s if timeout_s > 0 else None
        # Poll for replies instead of sleeping (only while they usually come within the window): a
        # fast callable then answers without paying for a wake-up of this process.
        self._poll_s = float(params.get("spin_us", 0)) / 1e6
        self._lock_fd = self._claim_slot(slots)
        self._arena: _arena.Arena = (
            _zmq_channel.InlineArena() if self._tcp else _arena.SharedArena(f"{params['shm_prefix']}-s{self._slot}")
        )
        self._reader = _arena.ArenaReader()
        # After a large request, both arenas give their memory back once this instance is idle.
        self._releaser = _arena.IdleReleaser(lambda: (self._arena, self._reader))
        self._metrics: _stub_metrics.NullMetrics = _stub_metrics.NULL
        self._broken = False  # the connection ended under a batch: connect again before the next one
        self._batch: List[PbRequest] = []  # the requests of the batch in flight
        # Requests cancelled while they queued are answered without running (_stub_cancel).
        self._cancel_gate = _stub_cancel.Gate()
        self._connect()
        # Counted here, pushed to Triton's /metrics by a thread of their own (docs/metrics.md).
        self._metrics = _stub_metrics.create(
            pb_utils,
            bool(params.get("metrics", False)),
            model=self._model_name,
            version=args["model_version"],
            instance=self._slot,
            generation=self._generation,
            max_batch_size=int(config.get("max_batch_size", 0)),
        )

    def _connect(self) -> None:
        """Connect to the slot's worker and say hello."""
        # The Unix socket and its _wire.SocketChannel, or the ZeroMQ StubChannel as both.
        self._socket: Union[socket.socket, _zmq_channel.StubChannel]
        self._channel: _wire.Channel[Message]
        if self._tcp is not None:
            route = f"{self._tcp['route']}/{self._slot}"
            tcp = self._tcp
            self._socket = _zmq_channel.connect(tcp["endpoint"], tcp["token"], route, tcp.get("server_key"))
        else:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._socket.connect(os.path.join(self._endpoint_dir, f"slot-{self._slot}.sock"))
        if self._timeout_s is not None:
            # The welcome may have to wait for a new worker process to start (one replaced after an
            # execution timeout takes a second or two): the hello gets at least _HELLO_TIMEOUT_S.
            self._socket.settimeout(max(self._timeout_s, _HELLO_TIMEOUT_S))
        if isinstance(self._socket, _zmq_channel.StubChannel):
            self._channel = self._socket
        else:
            self._channel = _wire.SocketChannel(self._socket, poll_s=self._poll_s)
        reply = self._call(_messages.Hello(os.getpid(), self._generation))
        if self._timeout_s is not None:
            # With a timeout every receive waits in poll() first, so the reply polling of Channel
            # turns into a plain bounded wait: no spinning, and a late reply raises socket.timeout.
            self._socket.settimeout(self._timeout_s)
        if type(reply) is not _messages.Welcome:
            raise pb_utils.TritonModelException(f"pytriton: unexpected handshake reply {reply.KIND}")

    def _abandon(self) -> str:
        """After an execution timeout: drop the connection and the arenas, connect again; returns the error text."""
        message = (
            f"pytriton: model {self._model_name!r} did not answer within its execution timeout of "
            f"{self._timeout_s:g} s (ModelConfig.execution_timeout_s); the request was abandoned."
        )
        self._reconnect()
        return message

    def _reconnect(self) -> bool:
        """Drop the connection and both arenas, connect again; False if that failed (the next batch tries again)."""
        self._metrics.reconnected()
        self._broken = True
        self._socket.close()
        self._arena.close()  # the peer may still read it (or has unlinked its name): the next batch gets a fresh segment
        self._reader.close()
        try:
            self._connect()
        except Exception:  # noqa: BLE001 - the next batch reports the user's process as gone
            return False
        self._broken = False
        return True

    def _claim_slot(self, slots: int) -> int:
        """Lock a free slot of this generation; returns the lock's descriptor (held until this process exits).

        A slot whose lock is held belongs to a live stub. Usually that is an instance of this very
        load, but it may be the previous load's: Triton's repository API reloads a model by starting
        the new instances while the old ones still serve, and unloads those only once the new ones
        are ready. So after :data:`SLOT_GRACE_S` of waiting (an old instance that is merely exiting
        frees its slot within that) the claim moves on to a further set of lock files
        (``-r1``, ``-r2``, ...): the new instance shares its slot's worker with the old one until
        the old one is unloaded, as a new generation does. Before, the reload waited 60 s for a
        slot that could not come free, failed, and left its stub behind.
        """
        started = time.monotonic()
        while True:
            rounds = 1 + min(_SLOT_ROUNDS - 1, int((time.monotonic() - started) / SLOT_GRACE_S))
            for round_number in range(rounds):
                for slot in range(slots):
                    suffix = f"-r{round_number}" if round_number else ""
                    lock_name = f"slot-{slot}-g{self._generation}{suffix}.lock"
                    fd = os.open(os.path.join(self._endpoint_dir, lock_name), os.O_RDWR | os.O_CREAT, 0o600)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        os.close(fd)
                        continue
                    self._slot = slot
                    return fd
            # Every slot is held: an instance being unloaded has not exited yet. Wait for it.
            if time.monotonic() > started + 60.0:
                raise pb_utils.TritonModelException(f"pytriton: all {slots} instance slots stay busy")
            self._check_user_alive()
            time.sleep(0.01)

    def _check_user_alive(self) -> None:
        if self._tcp is not None:
            return  # its pid is on another host, perhaps
        try:
            os.kill(self._user_pid, 0)
        except ProcessLookupError:
            raise UserProcessGone(
                f"the pytriton process (pid {self._user_pid}) that bound this model is gone"
            ) from None
        except PermissionError:
            pass

    def _call(self, message: Message) -> Message:
        """Send one message and wait for the reply.

        The wait is bounded only by the model's execution timeout, if it has one: a callable may
        legitimately run for a long time, and if the user's process dies the kernel closes the
        socket, which ends the wait at once.
        """
        try:
            self._channel.send(message)
        except socket.timeout:
            raise ExecutionTimedOut() from None
        except OSError:
            gone = self._gone()
            gone.unsent = True
            raise gone from None
        return self._receive()

    def _receive(self) -> Message:
        """The next reply of the worker; ASK messages on the way are answered (``_answer``).

        The execution timeout bounds the whole wait, ASKs included.
        """
        started = time.monotonic() if self._timeout_s is not None else 0.0
        shortened = False
        try:
            while True:
                message = self._channel.recv()
                if type(message) is not _messages.Ask:
                    return message
                self._answer()
                if self._timeout_s is not None:
                    remaining = self._timeout_s - (time.monotonic() - started)
                    if remaining <= 0:
                        raise ExecutionTimedOut()
                    self._socket.settimeout(remaining)
                    shortened = True
        except socket.timeout:
            raise ExecutionTimedOut() from None
        except (EOFError, OSError):
            raise self._gone() from None
        finally:
            if shortened:
                with contextlib.suppress(OSError):
                    self._socket.settimeout(self._timeout_s)

    def _answer(self) -> None:
        """Tell the worker which requests of the batch in flight Triton cancelled (Request.is_cancelled)."""
        flags = []
        for request in self._batch:
            try:
                flags.append(bool(request.is_cancelled()))
            except Exception:  # noqa: BLE001 - a request Triton already released: nobody waits for it
                flags.append(True)
        self._channel.send(_messages.Cancelled(flags))

    def _gone(self) -> UserProcessGone:
        self._broken = True
        return UserProcessGone(f"the pytriton process (pid {self._user_pid}) closed the connection")

    def _encode(
        self, requests: List[PbRequest], requested: List[Optional[List[str]]], trace: Optional[TraceFields] = None
    ) -> Infer:
        """The INFER message for a batch; raises ``RequestsTooLarge`` (before any copy) if needed."""
        groups = []
        entries = []
        sequences: List[Optional[_messages.SequenceFields]] = []
        limit = self._max_request_bytes
        rejected: Dict[int, str] = {}
        for index, (request, names) in enumerate(zip(requests, requested)):
            tensors = [(tensor.name(), _read_input(tensor)) for tensor in request.inputs()]
            raw_parameters = request.parameters()
            parameters = json.loads(raw_parameters) if raw_parameters != "{}" else None
            if self._sequence is not None:
                tensors, sequence, parameters = self._sequence_fields(request, tensors, parameters)
                if isinstance(sequence, str):  # a null request or a refused id: answered here
                    rejected[index] = sequence
                    continue
                sequences.append(sequence)
            if limit:
                nbytes = _input_bytes(tensors)
                if nbytes > limit:
                    rejected[index] = self._too_large(nbytes)
            groups.append(tensors)
            # The request's timeout is the client's ``timeout`` parameter, in microseconds (0: none).
            entries.append((parameters, names, request.timeout() / 1e6))
        if rejected:
            raise RequestsTooLarge(rejected)
        segment, metas = _tensors.write_tensors(self._arena, groups)
        sequence_of = sequences or [None] * len(requests)
        bodies = [Entry(m, p, n, q, t) for m, (p, n, t), q in zip(metas, entries, sequence_of)]
        return Infer(segment, bodies, trace)

    def _sequence_fields(
        self, request: PbRequest, tensors: Inputs, parameters: Optional[Dict[str, object]]
    ) -> Tuple[Inputs, Union[SequenceFields, str], Optional[Dict[str, object]]]:
        """The request's inputs without the sequence controls, its ``(id, start, end)`` and its parameters
        (without the owner credential, ``SequenceBatcher.owner_header``).

        In place of the fields, the text that answers the request without calling the callable: for
        a null request (the direct strategy fills idle batch slots with them, READY false), for a
        string id sent to a model with integer ids (``_sequences.refusal``), for a request of a
        sequence another caller owns (``_sequences.SequenceOwners``) and beyond the open bound.
        """
        assert self._sequence is not None
        controls = {name: key for key, name in self._sequence.items()}
        flags: Dict[str, bool] = {}
        kept = []
        for name, array in tensors:
            key = controls.get(name)
            if key is None:
                kept.append((name, array))
            elif key != "corrid":
                flags[key] = bool(np.asarray(array).reshape(-1)[0])
        if not flags.get("ready", True):
            return kept, _NULL_REQUEST, parameters
        raw_id = request.correlation_id()
        # An int or str, or a CorrelationId-like object in some backends, whose value() is one (an object
        # without value() is passed on as it is, which the SequenceId type does not cover).
        sequence_id: SequenceId = (
            raw_id if isinstance(raw_id, (int, str)) else getattr(raw_id, "value", lambda: raw_id)()  # type: ignore[assignment]
        )
        start, end = flags.get("start", False), flags.get("end", False)
        refused = _sequences.refusal(sequence_id, self._integer_ids, self._model_name)
        if refused is None and self._owners is not None:  # checked first: a stranger's request counts nowhere
            credential, parameters = _sequences.credential(parameters, self._owners.header)
            refused = self._owners.check(sequence_id, start, end, credential, time.monotonic())
            if refused is not None:
                self._log_owner_refusal(refused)
        if refused is None:
            refused = self._open_sequences.admit(sequence_id, start, end, time.monotonic())
        if refused is not None:
            return kept, refused, parameters
        return kept, (sequence_id, start, end), parameters

    def _log_owner_refusal(self, text: str) -> None:
        """One log line per refusal of a stranger's request, at most one a second (the rest are counted in it)."""
        assert self._owners is not None
        now = time.monotonic()
        if now - self._owner_log_at < 1.0:
            return
        self._owner_log_at = now
        _stub_metrics.log(
            pb_utils,
            f"pytriton: {self._owners.refused} sequence requests of model {self._model_name!r} refused so far "
            f"by the owner check; the latest: {text}",
        )

    def _too_large(self, nbytes: int) -> str:
        return (
            f"pytriton: the request to model {self._model_name!r} holds {_size_text(nbytes)} of inputs, more than "
            f"the server's limit of {_size_text(self._max_request_bytes)}; send smaller requests "
            "(the limit is TritonConfig.max_request_bytes on the server)"
        )

    def _reject(self, requests: List[PbRequest], rejected: Dict[int, str]) -> Optional[List[object]]:
        """Answer the oversized requests with their error and run the rest of the batch as usual."""
        kept = [request for index, request in enumerate(requests) if index not in rejected]
        errors = {index: pb_utils.InferenceResponse(error=_rejection(text)) for index, text in rejected.items()}
        if self._decoupled:
            for index, response in errors.items():
                requests[index].get_response_sender().send(
                    response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
            if kept:
                self._execute(kept)
            return None
        responses = iter(self._execute(kept) or []) if kept else iter([])
        return [errors[index] if index in errors else next(responses) for index in range(len(requests))]

    def _responses(self, reply: Union[Ok, Chunk], requested: List[Optional[List[str]]]) -> List[object]:
        """The responses of an OK or CHUNK reply."""
        segment = reply.segment
        buffer = self._reader.attach(segment) if segment is not None else None
        own = self._arena.buffer
        Tensor = _dlpack_output if _NUMPY2 else pb_utils.Tensor
        read = _tensors.read_tensor
        responses = []
        for metas, names in zip(reply.results, requested):
            tensors = [
                _bytes_output(m, buffer) if m.dtype == _messages.BYTES else Tensor(m.name, read(buffer, m, False, own))
                for m in metas
                if names is None or m.name in names
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def _settle(self, final: Message) -> None:
        """After the last reply of a batch: a fresh segment if the callable kept views of our arena."""
        self._metrics.settled(final)
        if isinstance(final, (Ok, Error, _messages.End)) and final.retire:
            self._arena.close()  # the next batch gets a fresh segment; the kept arrays keep the old one

    def execute(self, requests: List[PbRequest]) -> Optional[List[object]]:
        """Run one batch through the user's callable and return (or stream) the responses."""
        return self._gated(requests, self._run_batch)

    def _gated(
        self, requests: List[PbRequest], run: Callable[[List[PbRequest]], Optional[List[object]]]
    ) -> Optional[List[object]]:
        """``run(requests)``, less the requests whose client cancelled while they queued (_stub_cancel).

        Those are asked about only right after a long batch of this instance (``Gate``); each one
        found is answered with Triton's CANCELLED error and counted, and never reaches the callable.
        """
        gate = self._cancel_gate
        started = gate.clock()
        try:
            if started < gate.until and self._sequence is None:
                dropped = _stub_cancel.cancelled(requests)
                if dropped:
                    return self._drop(requests, dropped, run)
            return run(requests)
        finally:
            gate.ran(started, gate.clock())

    def _drop(
        self, requests: List[PbRequest], dropped: List[int], run: Callable[[List[PbRequest]], Optional[List[object]]]
    ) -> Optional[List[object]]:
        """Answer the ``dropped`` requests as cancelled, run the others with ``run``."""
        self._metrics.cancelled(len(dropped))
        self._cancel_gate.dropped()
        skip = set(dropped)
        kept = [request for index, request in enumerate(requests) if index not in skip]
        if self._decoupled:
            for index in dropped:
                try:  # Triton may refuse a response to a cancelled request: it needs none then
                    requests[index].get_response_sender().send(
                        _cancelled_response(), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                    )
                except Exception:  # noqa: BLE001
                    pass
            if kept:
                run(kept)
            return None
        return _stub_cancel.merge(len(requests), dropped, _cancelled_response, run(kept) if kept else None)

    def _run_batch(self, requests: List[PbRequest]) -> Optional[List[object]]:
        self._releaser.enter()  # no arena memory is released while a batch is in flight
        self._metrics.enter(len(requests))
        try:
            return self._execute(requests)
        finally:
            self._metrics.leave()
            self._releaser.leave()

    def _execute(self, requests: List[PbRequest]) -> Optional[List[object]]:
        self._batch = requests  # what an ASK is about (_answer)
        trace = _stub_trace.collect(requests) if self._trace else None
        if self._single_output:
            requested: List[Optional[List[str]]] = [None] * len(requests)
        else:
            # Triton gives a set of names (or an empty one): a list on the wire, None for "all of them".
            requested = [list(request.requested_output_names() or ()) or None for request in requests]
        for attempt in (1, 2):
            if self._broken and not self._reconnect():  # before _encode: reconnecting replaces the arena
                return self._fail(requests, f"the pytriton process (pid {self._user_pid}) is not accepting connections")
            try:
                message = self._encode(requests, requested, trace)
            except RequestsTooLarge as exc:
                return self._reject(requests, exc.rejected)
            except Exception as exc:  # malformed input we cannot forward
                return self._fail(requests, f"pytriton proxy could not read the request: {exc}")
            try:
                reply = self._call(message)
                break
            except UserProcessGone as exc:
                if exc.unsent and attempt == 1:
                    continue  # the connection had ended while idle: nothing of this batch ran, connect again
                return self._fail(requests, str(exc))
            except ExecutionTimedOut:
                return self._fail(requests, self._abandon())
        if not self._decoupled:
            try:
                if type(reply) is Ok:
                    return self._responses(reply, requested)
                text = reply.text if type(reply) is Error else "pytriton: unexpected reply"
                return self._fail(requests, text)
            finally:
                self._settle(reply)
        self._stream(requests, requested, reply)
        return None

    def _stream(self, requests: List[PbRequest], requested: List[Optional[List[str]]], reply: Message) -> None:
        """Send each streamed chunk to its clients as it arrives, then the final flag.

        A client that cancelled (checked at every acknowledgement, each ``STREAM_WINDOW`` chunks at
        most) or whose response Triton refused gets nothing more; once no client of the batch is
        left, the worker is told to stop the generator. Whatever happens, the stream's messages are
        read to the end, so the next batch starts in step.
        """
        senders = [request.get_response_sender() for request in requests]
        live = [True] * len(senders)
        try:
            unacknowledged = 0
            while type(reply) is Chunk:
                if any(live):
                    try:
                        responses = self._responses(reply, requested)
                    except Exception as exc:  # e.g. Triton could not allocate the output: end the stream
                        responses = _errors(f"pytriton proxy could not build a streamed response: {exc}", senders)
                        self._send(senders, live, responses)
                        live = [False] * len(senders)
                    else:
                        self._send(senders, live, responses)
                unacknowledged += 1
                if _messages.must_acknowledge(reply, unacknowledged):
                    unacknowledged = 0
                    for index, sender in enumerate(senders):
                        live[index] = live[index] and not sender.is_cancelled()
                    reply = self._call(_messages.NEXT_MESSAGE if any(live) else _messages.CANCEL_MESSAGE)
                else:
                    reply = self._receive()
            if type(reply) is Error:
                self._send(senders, live, _errors(reply.text, senders))
            self._settle(reply)
        except UserProcessGone as exc:
            self._send(senders, live, _errors(str(exc), senders))
        except ExecutionTimedOut:
            self._send(senders, live, _errors(self._abandon(), senders))
        for sender in senders:
            try:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception:  # already closed by Triton (e.g. cancelled); nothing left to release
                pass

    @staticmethod
    def _send(senders: List[PbResponseSender], live: List[bool], responses: Sequence[object]) -> None:
        """Send one response per live client; a client whose response Triton refuses is dropped."""
        for index, (sender, response) in enumerate(zip(senders, responses)):
            if live[index]:
                try:
                    sender.send(response)
                except Exception:
                    live[index] = False

    def _fail(self, requests: List[PbRequest], message: str) -> Optional[List[object]]:
        responses = _errors(message, requests)
        if not self._decoupled:
            return responses
        for request, response in zip(requests, responses):
            sender = request.get_response_sender()
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def finalize(self) -> None:
        """Tell the worker this instance is going away and release every resource."""
        _stub_exit.arm(self._exit_deadline_s)  # Triton waits for this process to exit with no limit
        self._metrics.close()  # pushes the last changes
        try:
            self._socket.settimeout(1.0)
            self._channel.send(_messages.BYE_MESSAGE)
            self._channel.recv()
        except (EOFError, OSError):
            pass
        self._socket.close()
        self._releaser.close()
        self._arena.close()
        self._reader.close()
        os.close(self._lock_fd)
