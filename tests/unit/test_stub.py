"""The proxy model (``pytriton/proxy/stubside/_stub.py``) driven through a fake ``triton_python_backend_utils``.

No tritonserver: the module is imported with a fake ``triton_python_backend_utils`` in
``sys.modules``, and its ``initialize``/``execute``/``finalize`` talk over a real Unix socket to a
fake worker played by the test itself with ``_wire``'s message builders. Covers the handshake and
slot claim, OK (inline and through both arenas), ERROR, a stream with its acknowledgement window,
CANCEL once every client cancelled, a client whose responses Triton refuses, the retire flag, the
size limit, the execution timeout and the user's process going away (mid-batch, mid-stream, and
while waiting for a busy slot).

Both numpy paths of the stub run with these fakes (the ``setup`` fixture runs each test on both):
numpy 1.x hands arrays to ``Tensor(name, array)``, numpy 2 (``_stub._NUMPY2``) goes through DLPack
(``np.from_dlpack(tensor)`` and ``Tensor.from_dlpack``), which the fake tensor supports. String
(BYTES) tensors are covered by test_stub_bytes.py.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import importlib
import json
import os
import queue
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types

import numpy as np
import pytest

from pytriton.proxy.stubside import _arena, _messages, _segments, _tensors, _wire
from tests.unit.test_stub_dlpack import consume_capsule, release

FINAL = 1  # the fake TRITONSERVER_RESPONSE_COMPLETE_FINAL
TIMEOUT_S = 10.0  # every wait in this file is bounded by this


# -- the fake triton_python_backend_utils -------------------------------------------------------


class FakeTensor:
    """``pb_utils.Tensor``: keeps a private copy, as the stub's tensors do."""

    def __init__(self, name, array):
        self._name = name
        self._array = np.array(array, copy=True)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array

    def __dlpack__(self, stream=None):  # the stub's signature: no max_version, no copy (python_backend 2.51)
        return self._array.__dlpack__(stream=stream)

    def to_dlpack(self):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()

    @classmethod
    def from_dlpack(cls, name, owner):
        if hasattr(owner, "__dlpack__"):
            return cls(name, np.from_dlpack(owner))
        # A capsule, consumed as the stub consumes one (tests/unit/test_stub_dlpack.py); its managed
        # tensor is released at once since the copy is made.
        array, managed = consume_capsule(owner)
        release(managed)
        return cls(name, array)


class FakeError:
    def __init__(self, message):
        self._message = message

    def message(self):
        return self._message


class FakeResponse:
    def __init__(self, output_tensors=None, error=None):
        self.output_tensors = output_tensors or []
        self.error = error

    def outputs(self):
        return {tensor.name(): tensor.as_numpy() for tensor in self.output_tensors}


class FakeModelException(Exception):
    pass


class FakeSender:
    """A request's response sender; ``cancelled`` is what ``is_cancelled()`` answers."""

    def __init__(self, cancelled=False):
        self.cancelled = cancelled
        self.sent = []  # (response or None, flags)
        self.cancel_checks = 0

    def send(self, response=None, flags=0):
        if self.sent and self.sent[-1][1] == FINAL:
            raise RuntimeError("sent after the final flag")
        self.sent.append((response, flags))

    def is_cancelled(self):
        self.cancel_checks += 1
        return self.cancelled

    @property
    def responses(self):
        return [response for response, _ in self.sent if response is not None]


class RefusingSender(FakeSender):
    """A sender whose client Triton already dropped: every send fails."""

    def send(self, response=None, flags=0):
        raise RuntimeError("closed by Triton")


class FakeRequest:
    def __init__(self, inputs, parameters=None, requested=None, sender=None, timeout_us=0, correlation_id=0):
        self._inputs = [FakeTensor(name, array) for name, array in inputs.items()]
        self._parameters = json.dumps(parameters or {})
        self._requested = requested or []
        self.sender = sender or FakeSender()
        self._timeout_us = timeout_us
        self._correlation_id = correlation_id
        self.cancelled = False

    def timeout(self):
        return self._timeout_us

    def correlation_id(self):
        return self._correlation_id

    def is_cancelled(self):
        return self.cancelled

    def inputs(self):
        return self._inputs

    def parameters(self):
        return self._parameters

    def requested_output_names(self):
        return self._requested

    def get_response_sender(self):
        return self.sender


def _fake_pb_utils():
    module = types.ModuleType("triton_python_backend_utils")
    module.Tensor = FakeTensor
    module.InferenceResponse = FakeResponse
    module.TritonError = FakeError
    module.TritonModelException = FakeModelException
    module.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
    module.serialize_byte_tensor = lambda array: pytest.fail("no BYTES tensors in these tests")
    module.deserialize_bytes_tensor = lambda array: pytest.fail("no BYTES tensors in these tests")
    return module


@pytest.fixture(scope="module")
def stub():
    """``pytriton.proxy.stubside._stub`` imported against the fake utils; every global it touches is restored."""
    saved_modules = {name: sys.modules.get(name) for name in ("numpy.core.multiarray", "pytriton.proxy.stubside._stub")}
    saved_path = list(sys.path)
    from pytriton.proxy.stubside import _stub_bytes

    saved_unavailable = _stub_bytes.UNAVAILABLE
    sys.modules["triton_python_backend_utils"] = _fake_pb_utils()
    sys.modules.pop("pytriton.proxy.stubside._stub", None)
    try:
        yield importlib.import_module("pytriton.proxy.stubside._stub")
    finally:
        sys.modules.pop("triton_python_backend_utils", None)
        for name, module in saved_modules.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        sys.path[:] = saved_path  # the stub puts its own directory first
        import pytriton.proxy

        if hasattr(pytriton.proxy, "_stub"):
            delattr(pytriton.proxy, "_stub")
        _stub_bytes.UNAVAILABLE = saved_unavailable


# -- the fake worker ----------------------------------------------------------------------------


class FakeWorker:
    """Listens on ``slot-<n>.sock`` and answers each stub's HELLO; the test plays the rest."""

    welcome = staticmethod(_messages.Welcome)  # its answer to HELLO

    def __init__(self, path, slot=0):
        self.slot = slot
        self.hellos = []
        self.connections: queue.Queue = queue.Queue()
        self.channels = []  # every connection, to close them all at the end
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(4)
        self._server.settimeout(0.05)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while not self._closed.is_set():
            try:
                sock, _ = self._server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            sock.settimeout(TIMEOUT_S)
            channel = _wire.SocketChannel(sock)
            self.channels.append(channel)
            hello = channel.recv()
            self.hellos.append(hello)
            channel.send(self.welcome(self.slot))
            self.connections.put(channel)

    def channel(self):
        return self.connections.get(timeout=TIMEOUT_S)

    def close(self):
        self._closed.set()
        self._thread.join(TIMEOUT_S)
        self._server.close()
        for channel in self.channels:
            channel.sock.close()


class Setup:
    """A model repository with the private file, an endpoint directory, and the fake workers."""

    def __init__(self, stub_module):
        self.stub = stub_module
        # Short: a Unix socket path holds at most 108 bytes.
        self.root = tempfile.mkdtemp(prefix="pts-", dir="/tmp")
        self.endpoint_dir = os.path.join(self.root, "e")
        os.mkdir(self.endpoint_dir)
        self.shm_prefix = f"pytriton-{os.getpid()}-stubtest{secrets.token_hex(3)}"
        self.workers = []
        self.models = []

    def worker(self, slot=0):
        worker = FakeWorker(os.path.join(self.endpoint_dir, f"slot-{slot}.sock"), slot)
        self.workers.append(worker)
        return worker

    def model(
        self, *, decoupled=False, outputs=("y",), slots=1, generation=0, version="1", config_update=None, **private
    ):
        version_dir = os.path.join(self.root, "repo", version)
        os.makedirs(version_dir, exist_ok=True)
        params = {
            "user_pid": os.getpid(),
            "endpoint_dir": self.endpoint_dir,
            "slots": slots,
            "shm_prefix": self.shm_prefix,
            "backend_shm_prefix": f"{self.shm_prefix}-pb",
            "spin_us": 0,
            "max_request_bytes": 0,
            "execution_timeout_s": 0.0,
        }
        params.update(private)
        with open(os.path.join(version_dir, _wire.PRIVATE_FILE), "w") as file:
            json.dump(params, file)
        config = {
            "name": "Unit",
            "output": [{"name": name} for name in outputs],
            "model_transaction_policy": {"decoupled": decoupled},
            "parameters": {"pytriton.generation": {"string_value": str(generation)}},
        }
        config.update(config_update or {})
        model = self.stub.TritonPythonModel()
        model.initialize(
            {
                "model_config": json.dumps(config),
                "model_repository": os.path.join(self.root, "repo"),
                "model_version": version,
                "model_name": "Unit",
            }
        )
        self.models.append(model)
        return model

    def finalize(self, model):
        self.models.remove(model)
        model.finalize()

    def close(self):
        for worker in self.workers:  # first, so that each finalize's goodbye meets a closed connection
            worker.close()
        for model in self.models:
            with contextlib.suppress(Exception):
                model.finalize()
        shutil.rmtree(self.root, ignore_errors=True)
        leftovers = _segments.sweep_segments(self.shm_prefix)
        assert not leftovers, f"shared-memory segments left behind: {leftovers}"


@pytest.fixture(params=["numpy-of-this-process", "numpy1-path"])
def setup(stub, request, monkeypatch):
    # The stub converts tensors through DLPack under numpy 2 and directly under numpy 1.x; the
    # second run takes the numpy 1.x path whatever numpy this process has (both work on numpy 2).
    if request.param == "numpy1-path":
        monkeypatch.setattr(stub, "_NUMPY2", False)
    setup = Setup(stub)
    try:
        yield setup
    finally:
        setup.close()


@pytest.fixture()
def pool():
    with concurrent.futures.ThreadPoolExecutor(1) as executor:
        yield executor


def _inputs(message, reader=None):
    """The INFER message's requests as ``[(inputs dict, parameters, requested)]`` (copies)."""
    assert type(message) is _messages.Infer, message
    segment = message.segment
    buffer = reader.attach(segment) if segment is not None else None
    return [
        (
            {meta.name: _tensors.read_tensor(buffer, meta, True) for meta in entry.tensors},
            entry.parameters,
            entry.requested,
        )
        for entry in message.entries
    ]


def _results(arena, outputs_per_request):
    """An OK/CHUNK segment and results for ``[{name: array}]``."""
    return _tensors.write_tensors(arena, [list(outputs.items()) for outputs in outputs_per_request])


def _ok(arena, outputs_per_request, retire=False):
    segment, results = _results(arena, outputs_per_request)
    return _messages.Ok(segment, results, retire)


def _value_chunk(value, requests=1):
    segment, results = _tensors.write_tensors(None, [[("y", np.array([value], np.int32))]] * requests)
    return _messages.Chunk(segment, results)


# -- tests --------------------------------------------------------------------------------------


def test_initialize_claims_a_free_slot_and_says_hello(setup):
    worker0, worker1 = setup.worker(0), setup.worker(1)
    first = setup.model(slots=2, generation=3)
    second = setup.model(slots=2, generation=3)
    assert (first._slot, second._slot) == (0, 1)
    assert worker0.hellos == [_messages.Hello(os.getpid(), 3)] and worker1.hellos == [_messages.Hello(os.getpid(), 3)]
    # The slot locks are held, per generation: another process (here another descriptor) cannot take them.
    for slot in (0, 1):
        fd = os.open(os.path.join(setup.endpoint_dir, f"slot-{slot}-g3.lock"), os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)

    # finalize says goodbye, and frees the slot for the next instance.
    channel = worker0.channel()
    done = threading.Event()

    def answer_bye():
        assert channel.recv() == _messages.BYE_MESSAGE
        channel.send(_messages.BYE_MESSAGE)
        done.set()

    thread = threading.Thread(target=answer_bye, daemon=True)
    thread.start()
    setup.finalize(first)
    thread.join(TIMEOUT_S)
    assert done.is_set()
    fd = os.open(os.path.join(setup.endpoint_dir, "slot-0-g3.lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
    finally:
        os.close(fd)
    third = setup.model(slots=2, generation=3)
    assert third._slot == 0


def test_a_reload_of_the_same_generation_shares_the_slots_after_a_grace(setup, monkeypatch):
    """Triton's repository API reloads a model while the old instances still hold their slots (issue 25)."""
    monkeypatch.setattr(setup.stub, "SLOT_GRACE_S", 0.05)
    setup.worker(0), setup.worker(1)
    old = [setup.model(slots=2, generation=0) for _ in range(2)]
    assert [model._slot for model in old] == [0, 1]
    started = time.monotonic()
    new = [setup.model(slots=2, generation=0) for _ in range(2)]
    assert [model._slot for model in new] == [0, 1]  # each slot once among the new instances too
    assert time.monotonic() - started < 5.0  # not the 60 s of before
    assert os.path.exists(os.path.join(setup.endpoint_dir, "slot-0-g0-r1.lock"))


def test_a_wrong_handshake_reply_fails_initialize(setup, monkeypatch):
    monkeypatch.setattr(FakeWorker, "welcome", staticmethod(lambda slot: _messages.Error("not a welcome")))
    setup.worker()
    with pytest.raises(FakeModelException, match="unexpected handshake reply"):
        setup.model()


def test_ok_reply_becomes_one_response_per_request(setup, pool):
    worker = setup.worker()
    model = setup.model()
    channel = worker.channel()
    requests = [
        FakeRequest({"x": np.array([[1, 2]], np.int32)}, parameters={"temperature": 0.5}),
        FakeRequest({"x": np.array([[3, 4]], np.int32)}),
    ]
    future = pool.submit(model.execute, requests)
    received = _inputs(channel.recv())
    assert [params for _, params, _ in received] == [{"temperature": 0.5}, None]
    assert [names for _, _, names in received] == [None, None]  # a single output: nothing to filter
    np.testing.assert_array_equal(received[1][0]["x"], [[3, 4]])
    arena = _arena.SharedArena(f"{setup.shm_prefix}-w")
    try:
        channel.send(_ok(arena, [{"y": inputs["x"] * 10} for inputs, _, _ in received]))
        responses = future.result(TIMEOUT_S)
    finally:
        arena.close()
    assert [response.error for response in responses] == [None, None]
    np.testing.assert_array_equal(responses[0].outputs()["y"], [[10, 20]])
    np.testing.assert_array_equal(responses[1].outputs()["y"], [[30, 40]])


def test_large_tensors_travel_through_both_arenas(setup, pool):
    worker = setup.worker()
    model = setup.model()
    channel = worker.channel()
    big = np.arange(1 << 16, dtype=np.float32).reshape(1, -1)  # 256 KiB: past the inline limit
    future = pool.submit(model.execute, [FakeRequest({"x": big})])
    message = channel.recv()
    assert message.segment is not None and message.segment.startswith(setup.shm_prefix)
    reader = _arena.ArenaReader()
    arena = _arena.SharedArena(f"{setup.shm_prefix}-w")
    try:
        inputs, _, _ = _inputs(message, reader)[0]
        np.testing.assert_array_equal(inputs["x"], big)
        reply = _ok(arena, [{"y": inputs["x"] + 1}])
        assert reply.segment is not None
        channel.send(reply)
        (response,) = future.result(TIMEOUT_S)
    finally:
        reader.close()
        arena.close()
    np.testing.assert_array_equal(response.outputs()["y"], big + 1)


def test_only_the_requested_outputs_are_returned(setup, pool):
    worker = setup.worker()
    model = setup.model(outputs=("a", "b"))
    channel = worker.channel()
    # Triton's requested_output_names() is a set; the wire carries a list (Entry.requested).
    requests = [FakeRequest({"x": np.ones((1, 1), np.int8)}, requested={"b"}), FakeRequest({"x": np.ones((1, 1))})]
    future = pool.submit(model.execute, requests)
    received = _inputs(channel.recv())
    assert [names for _, _, names in received] == [["b"], None]  # None: every output
    outputs = {"a": np.zeros((1, 1), np.int8), "b": np.ones((1, 1), np.int8)}
    channel.send(_ok(None, [outputs, outputs]))
    first, second = future.result(TIMEOUT_S)
    assert sorted(first.outputs()) == ["b"] and sorted(second.outputs()) == ["a", "b"]


def test_error_reply_fails_every_request_of_the_batch(setup, pool):
    worker = setup.worker()
    model = setup.model()
    channel = worker.channel()
    future = pool.submit(model.execute, [FakeRequest({"x": np.ones(1)}), FakeRequest({"x": np.ones(1)})])
    channel.recv()
    channel.send(_messages.Error("ValueError: bad input"))
    responses = future.result(TIMEOUT_S)
    assert [response.error.message() for response in responses] == ["ValueError: bad input"] * 2
    # The connection stays in step: the next batch is served normally.
    future = pool.submit(model.execute, [FakeRequest({"x": np.ones(1)})])
    channel.recv()
    channel.send(_ok(None, [{"y": np.full(1, 7.0)}]))
    (response,) = future.result(TIMEOUT_S)
    assert response.error is None and response.outputs()["y"][0] == 7.0


def test_retire_moves_the_stub_to_a_fresh_arena_segment(setup, pool):
    worker = setup.worker()
    model = setup.model()
    channel = worker.channel()
    big = np.zeros((1, 1 << 15), np.float32)  # 128 KiB: through the stub's arena
    segments = []
    for retire in (False, False, True, False):
        future = pool.submit(model.execute, [FakeRequest({"x": big})])
        message = channel.recv()
        segments.append(message.segment)
        with contextlib.suppress(FileNotFoundError):  # the worker side unlinks what it maps
            os.unlink(os.path.join(_arena.SHM_DIR, message.segment))
        channel.send(_ok(None, [{"y": np.zeros(1, np.float32)}], retire=retire))
        future.result(TIMEOUT_S)
        if retire:
            assert model._arena.name is None, "a retired arena must not be written again"
    # The same segment while nothing retires it; a new one for the batch after the retiring reply.
    assert segments[0] == segments[1] == segments[2] != segments[3]


def test_a_stream_waits_for_the_window_and_sends_every_chunk_as_it_arrives(setup, pool):
    worker = setup.worker()
    model = setup.model(decoupled=True)
    channel = worker.channel()
    request = FakeRequest({"x": np.ones(1, np.int32)})
    total = _messages.STREAM_WINDOW + 4
    future = pool.submit(model.execute, [request])
    channel.recv()
    for value in range(_messages.STREAM_WINDOW):
        channel.send(_value_chunk(value))
    # The window is full: the stub acknowledges before the worker may send more.
    assert channel.recv() == _messages.NEXT_MESSAGE
    assert len(request.sender.responses) == _messages.STREAM_WINDOW  # already sent, before the stream ended
    for value in range(_messages.STREAM_WINDOW, total):
        channel.send(_value_chunk(value))
    channel.send(_messages.End())
    assert future.result(TIMEOUT_S) is None
    values = [int(response.outputs()["y"][0]) for response in request.sender.responses]
    assert values == list(range(total))
    assert request.sender.sent[-1] == (None, FINAL)
    assert request.sender.cancel_checks == 1  # once per acknowledgement
    # Nothing else was sent: the next message the worker gets is the next batch's.
    future = pool.submit(model.execute, [FakeRequest({"x": np.ones(1, np.int32)})])
    assert type(channel.recv()) is _messages.Infer
    channel.send(_messages.End())
    future.result(TIMEOUT_S)


def test_an_arena_chunk_is_acknowledged_at_once(setup, pool):
    worker = setup.worker()
    model = setup.model(decoupled=True)
    channel = worker.channel()
    request = FakeRequest({"x": np.ones(1, np.int32)})
    arena = _arena.SharedArena(f"{setup.shm_prefix}-w")
    try:
        future = pool.submit(model.execute, [request])
        channel.recv()
        big = np.arange(1 << 15, dtype=np.float32)
        for _ in range(2):
            channel.send(_messages.Chunk(*_results(arena, [{"y": big}])))
            assert channel.recv() == _messages.NEXT_MESSAGE  # its memory is reused for the next chunk
        channel.send(_messages.End())
        future.result(TIMEOUT_S)
    finally:
        arena.close()
    assert len(request.sender.responses) == 2
    np.testing.assert_array_equal(request.sender.responses[1].outputs()["y"], big)


def test_a_stream_whose_clients_all_cancelled_is_cancelled(setup, pool):
    worker = setup.worker()
    model = setup.model(decoupled=True)
    channel = worker.channel()
    cancelled, live = FakeRequest({"x": np.ones(1)}), FakeRequest({"x": np.ones(1)})
    future = pool.submit(model.execute, [cancelled, live])
    channel.recv()
    for value in range(_messages.STREAM_WINDOW):
        if value == 3:
            cancelled.sender.cancelled = True
        channel.send(_value_chunk(value, requests=2))
    assert channel.recv() == _messages.NEXT_MESSAGE  # one client is still there
    for value in range(_messages.STREAM_WINDOW):
        if value == 5:
            live.sender.cancelled = True
        channel.send(_value_chunk(value, requests=2))
    assert channel.recv() == _messages.CANCEL_MESSAGE  # nobody is left: stop the generator
    channel.send(_messages.End())
    assert future.result(TIMEOUT_S) is None
    # The cancelled client got nothing after the acknowledgement that noticed it.
    assert len(cancelled.sender.responses) == _messages.STREAM_WINDOW
    assert len(live.sender.responses) == 2 * _messages.STREAM_WINDOW
    for request in (cancelled, live):
        assert request.sender.sent[-1] == (None, FINAL)


def test_an_error_ending_a_stream_reaches_every_live_client(setup, pool):
    worker = setup.worker()
    model = setup.model(decoupled=True)
    channel = worker.channel()
    request = FakeRequest({"x": np.ones(1)})
    future = pool.submit(model.execute, [request])
    channel.recv()
    channel.send(_value_chunk(1))
    channel.send(_messages.Error("RuntimeError: generator failed"))
    future.result(TIMEOUT_S)
    responses = request.sender.responses
    assert responses[0].error is None and responses[1].error.message() == "RuntimeError: generator failed"
    assert request.sender.sent[-1] == (None, FINAL)


def test_requests_over_the_size_limit_fail_alone(setup, pool):
    worker = setup.worker()
    model = setup.model(max_request_bytes=1024)
    channel = worker.channel()
    small, large = FakeRequest({"x": np.ones(8, np.int32)}), FakeRequest({"x": np.ones(1024, np.int32)})
    future = pool.submit(model.execute, [large, small])
    received = _inputs(channel.recv())
    assert len(received) == 1  # only the small one is forwarded
    channel.send(_ok(None, [{"y": np.ones(1, np.int32)}]))
    first, second = future.result(TIMEOUT_S)
    assert "holds 4.0 KiB (4096 bytes) of inputs, more than the server's limit of 1.0 KiB" in first.error.message()
    assert second.error is None


def test_user_process_going_away_fails_the_batch(setup, pool):
    worker = setup.worker()
    model = setup.model()
    channel = worker.channel()
    future = pool.submit(model.execute, [FakeRequest({"x": np.ones(1)}), FakeRequest({"x": np.ones(1)})])
    channel.recv()
    channel.sock.close()  # what the kernel does when the user's process dies
    responses = future.result(TIMEOUT_S)
    assert all("closed the connection" in response.error.message() for response in responses)
    assert all(str(os.getpid()) in response.error.message() for response in responses)


def test_user_process_going_away_mid_stream_ends_it_with_an_error(setup, pool):
    worker = setup.worker()
    model = setup.model(decoupled=True)
    channel = worker.channel()
    request = FakeRequest({"x": np.ones(1)})
    future = pool.submit(model.execute, [request])
    channel.recv()
    channel.send(_value_chunk(1))
    channel.sock.close()
    assert future.result(TIMEOUT_S) is None
    first, second = request.sender.responses
    assert first.error is None and "closed the connection" in second.error.message()
    assert request.sender.sent[-1] == (None, FINAL)


def test_execution_timeout_fails_the_batch_and_reconnects(setup, pool):
    worker = setup.worker()
    model = setup.model(execution_timeout_s=0.2)
    first = worker.channel()
    future = pool.submit(model.execute, [FakeRequest({"x": np.ones(1)})])
    first.recv()  # ... and never answered
    (response,) = future.result(TIMEOUT_S)
    assert "did not answer within its execution timeout of 0.2 s" in response.error.message()
    second = worker.channel()  # the stub connected again with the same pid
    assert worker.hellos == [_messages.Hello(os.getpid(), 0)] * 2
    future = pool.submit(model.execute, [FakeRequest({"x": np.ones(1)})])
    second.recv()
    second.send(_ok(None, [{"y": np.full(1, 2.0)}]))
    (response,) = future.result(TIMEOUT_S)
    assert response.error is None


def test_a_connection_broken_under_a_batch_is_made_again_for_the_next_one(setup, pool):
    # A process instance's worker process died mid-batch: that batch fails, the next one connects
    # again (the user's process kept the slot's socket listening) and is served.
    worker = setup.worker()
    model = setup.model()
    first = worker.channel()
    future = pool.submit(model.execute, [FakeRequest({"x": np.ones(1)})])
    first.recv()
    first.sock.close()
    (response,) = future.result(TIMEOUT_S)
    assert "closed the connection" in response.error.message()
    future = pool.submit(model.execute, [FakeRequest({"x": np.full(1, 3.0)})])
    second = worker.channel()
    assert worker.hellos == [_messages.Hello(os.getpid(), 0)] * 2
    ((inputs, _, _),) = _inputs(second.recv())
    np.testing.assert_array_equal(inputs["x"], np.full(1, 3.0))
    second.send(_ok(None, [{"y": np.full(1, 2.0)}]))
    (response,) = future.result(TIMEOUT_S)
    assert response.error is None


def test_a_connection_that_ended_while_idle_is_made_again_without_failing_the_batch(setup, pool):
    # A worker process died between batches and was replaced: the send fails, nothing of the batch
    # ran, so the stub connects again and sends it there.
    worker = setup.worker()
    model = setup.model()
    worker.channel().sock.close()
    future = pool.submit(model.execute, [FakeRequest({"x": np.full(1, 4.0)})])
    second = worker.channel()
    ((inputs, _, _),) = _inputs(second.recv())
    np.testing.assert_array_equal(inputs["x"], np.full(1, 4.0))
    second.send(_ok(None, [{"y": np.full(1, 5.0)}]))
    (response,) = future.result(TIMEOUT_S)
    assert response.error is None and len(worker.hellos) == 2


def test_finalize_survives_a_worker_that_is_already_gone(setup):
    worker = setup.worker()
    model = setup.model()
    worker.channel().sock.close()
    setup.finalize(model)  # no exception, every resource released (checked by the fixture)
    assert model._socket.fileno() == -1


def test_an_unexpected_reply_fails_the_batch(setup, pool):
    worker = setup.worker()
    model = setup.model()
    channel = worker.channel()
    future = pool.submit(model.execute, [FakeRequest({"x": np.ones(1)})])
    channel.recv()
    channel.send(_messages.End())  # a stream's end, for a model that is not decoupled
    (response,) = future.result(TIMEOUT_S)
    assert response.error.message() == "pytriton: unexpected reply"


def test_a_decoupled_batch_that_cannot_be_sent_fails_through_the_senders(setup, pool):
    worker = setup.worker()
    model = setup.model(decoupled=True, max_request_bytes=64)
    channel = worker.channel()
    large, small = FakeRequest({"x": np.ones(64, np.int32)}), FakeRequest({"x": np.ones(2, np.int32)})
    future = pool.submit(model.execute, [large, small])
    assert len(_inputs(channel.recv())) == 1  # the oversized request is answered at once, alone
    assert "more than the server's limit of 64 bytes" in large.sender.sent[0][0].error.message()
    assert large.sender.sent[0][1] == FINAL
    channel.sock.close()  # then the user's process goes away before the stream starts
    assert future.result(TIMEOUT_S) is None
    ((response, flags),) = small.sender.sent
    assert "closed the connection" in response.error.message() and flags == FINAL


def test_a_client_whose_response_is_refused_gets_nothing_more(setup, pool):
    worker = setup.worker()
    model = setup.model(decoupled=True)
    channel = worker.channel()
    refused, kept = FakeRequest({"x": np.ones(1)}), FakeRequest({"x": np.ones(1)})
    refused.sender = RefusingSender()
    future = pool.submit(model.execute, [refused, kept])
    channel.recv()
    for value in range(3):
        channel.send(_value_chunk(value, requests=2))
    channel.send(_messages.End())
    assert future.result(TIMEOUT_S) is None
    assert [int(response.outputs()["y"][0]) for response in kept.sender.responses] == [0, 1, 2]
    assert kept.sender.sent[-1] == (None, FINAL)


def test_waiting_for_a_busy_slot_ends_when_the_user_process_is_gone(setup, stub):
    setup.worker()
    setup.model()  # holds the only slot
    child = subprocess.Popen([sys.executable, "-c", "pass"])  # a pid that is gone
    child.wait()
    with pytest.raises(stub.UserProcessGone, match=rf"the pytriton process \(pid {child.pid}\) .* is gone"):
        setup.model(user_pid=child.pid)


def test_finalize_first_arms_the_exit_deadline_of_the_private_file(setup, monkeypatch):
    """The deadline is armed before anything of finalize can block (the real timers: test_stub_exit.py)."""
    worker = setup.worker()
    model = setup.model(exit_deadline_s=7.5)
    armed = []
    monkeypatch.setattr(setup.stub._stub_exit, "arm", armed.append)
    monkeypatch.setattr(model._metrics, "close", lambda: armed.append("metrics closed"))
    worker.channel().sock.close()
    setup.finalize(model)
    assert armed == [7.5, "metrics closed"]


def test_the_stub_finds_its_own_backend_region_in_its_arguments(stub, tmp_path):
    """Triton starts the stub as ``triton_python_backend_stub MODEL_PATH REGION ...``; nothing else counts."""
    cmdline = tmp_path / "cmdline"
    for argv, region in [
        (
            [
                b"/opt/tritonserver/backends/python/triton_python_backend_stub",
                b"/m/1/model.py",
                b"hand-pb_3",
                b"1048576",
            ],
            "hand-pb_3",
        ),
        ([b"python", b"-m", b"pytest", b"tests"], None),  # not a stub: no region
        ([b"/x/triton_python_backend_stub", b"/m/1/model.py", b""], None),
        ([b"/x/triton_python_backend_stub"], None),
    ]:
        cmdline.write_bytes(b"\0".join(argv) + b"\0")
        assert stub._own_backend_region(str(cmdline)) == region
    assert stub._own_backend_region(str(tmp_path / "missing")) is None
    assert stub._own_backend_region() is None  # this process is pytest


@pytest.mark.parametrize(
    ("update", "strings"),
    [
        ({}, False),
        ({"output": [{"name": "y", "data_type": "TYPE_STRING"}]}, True),
        (
            {"sequence_batching": {"control_input": [{"name": "CORRID", "control": [{"data_type": "TYPE_STRING"}]}]}},
            True,
        ),
    ],
)
def test_initialize_asks_for_numpy2s_table_fix_only_with_string_tensors(setup, monkeypatch, update, strings):
    from pytriton.proxy.stubside import _stub_bytes

    calls = []
    monkeypatch.setattr(_stub_bytes, "install", lambda utils, *, strings: calls.append(strings))
    setup.worker()
    setup.model(config_update=update)
    assert calls == [strings]
