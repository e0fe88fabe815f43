"""The in-process server against a repository the tests write: the spec's examples, adapted only by
``import pytriton.inprocess as tritonserver``, plus every fault of issue 13.

One module-scoped server holds the plain models; the model-control tests start their own. At the
end nothing may remain: no stub process, no shared-memory region with the server's prefix, no
request bookkeeping.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import queue
import shutil
import tempfile
import threading
from typing import List

import numpy as np
import pytest

import pytriton.inprocess as tritonserver
from pytriton.inprocess import _request
from pytriton.server import versions
from tests.conftest import needs_stub_strings, shm_entries, wait_for
from tests.e2e.inprocess_models import write_repository


def child_stubs(prefix: str = "") -> List[int]:
    """Backend stub processes whose parent is this process (and whose shm region has ``prefix``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if int(fields[1]) == os.getpid() and "triton_python" in stat:
            try:
                cmdline = pathlib.Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if prefix.encode() in cmdline:
                found.append(int(entry))
    return found


def _i32(value: int) -> np.ndarray:
    return np.array([value], dtype=np.int32)


def stream_inputs(count: int, fail_at: int = -1, delay: float = 0.0) -> dict:
    return {"COUNT": _i32(count), "FAIL_AT": _i32(fail_at), "DELAY": np.array([delay], dtype=np.float32)}


@pytest.fixture(scope="module")
def repository():
    root = pathlib.Path(tempfile.mkdtemp(prefix="pytriton-inproc-test-"))
    try:
        yield write_repository(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def server(repository):
    server = tritonserver.Server(model_repository=str(repository))
    server.start(wait_until_ready=True, timeout=120)
    try:
        yield server
    finally:
        prefix = server.shm_region_prefix
        assert child_stubs(prefix)  # the check below can see this server's stubs
        server.stop()
        assert wait_for(lambda: not child_stubs(prefix), 20), f"stubs left: {child_stubs(prefix)}"
        assert shm_entries(prefix) == []
        assert _request.inflight_count() == 0
        assert _request._BUFFERS == {}  # every output buffer was released by Triton


# -- the spec's examples -------------------------------------------------------------------------------
def test_server_queries(server):
    assert server.live() and server.ready()
    metadata = server.metadata()
    assert metadata["name"] == "triton" and metadata["version"] == versions.selected_version()
    models = server.models()
    assert set(models) >= {("identity", 1), ("add_sub", 1), ("strings", 1), ("stream", 1), ("faulty", 1)}
    assert all(model.state == "READY" for model in models.values())
    assert set(server.models(exclude_not_ready=True)) == set(models)
    assert "nv_inference_count" in server.metrics()
    assert "nv_inference_count" in server.metrics(tritonserver.MetricFormat.PROMETHEUS)


def test_model_queries(server):
    model = server.model("add_sub")
    assert repr(model) == "{'name': 'add_sub', 'version': -1, 'state': None}"
    assert model.ready()
    metadata = model.metadata()
    assert metadata["name"] == "add_sub" and metadata["platform"] == "python"
    assert [entry["name"] for entry in metadata["inputs"]] == ["INPUT0", "INPUT1"]
    config = model.config()
    assert config["backend"] == "python" and config["max_batch_size"] == 0
    assert "model_stats" in model.statistics()
    assert server.model("identity").batch_properties() == tritonserver.ModelBatchFlag.FIRST_DIM
    assert model.transaction_properties() == tritonserver.ModelTxnPropertyFlag.ONE_TO_ONE
    assert server.model("stream").transaction_properties() == tritonserver.ModelTxnPropertyFlag.DECOUPLED


def test_infer_explicit_request_zero_copy(server):
    request = server.model("add_sub").create_request()
    request.inputs["INPUT0"] = np.arange(4, dtype=np.float32)
    request.inputs["INPUT1"] = np.ones(4, dtype=np.float32)
    responses = list(server.model("add_sub").infer(request))
    assert len(responses) == 1 and responses[0].final and responses[0].error is None
    total = responses[0].outputs["OUTPUT0"]
    assert total.data_type == tritonserver.DataType.FP32 and list(total.shape) == [4]
    assert total.memory_type == tritonserver.MemoryType.CPU
    view = np.from_dlpack(total)
    assert view.ctypes.data == total.data_ptr  # the allocator's memory, not a copy
    np.testing.assert_array_equal(view, [1, 2, 3, 4])
    np.testing.assert_array_equal(np.from_dlpack(responses[0].outputs["OUTPUT1"]), [-1, 0, 1, 2])


def test_infer_implicit_request_inputs_of_every_form(server):
    model = server.model("identity")
    data = np.array([[1.5, 2.5, 3.5], [4.5, 5.5, 6.5]], dtype=np.float32)
    for value in (data, tritonserver.Tensor.from_dlpack(data), np.asfortranarray(data), data[:, ::-1][:, ::-1]):
        (response,) = model.infer(inputs={"INPUT0": value})
        np.testing.assert_array_equal(np.from_dlpack(response.outputs["OUTPUT0"]), data)
    # a list becomes numpy's default dtype (FP64 here), which Triton refuses by name
    with pytest.raises(tritonserver.InvalidArgumentError, match="FP64"):
        model.infer(inputs={"INPUT0": data.tolist()})


def test_response_ids_and_callback_threads_keep_their_state(server, monkeypatch):
    """A response carries its request's id (None without one). Triton's callback threads keep their
    Python thread state between callbacks, so each keeps one set of response-reading out-parameters."""
    seen = []
    original = _request._out_params

    def recording():
        params = original()
        seen.append((threading.get_native_id(), params))  # (params referenced: ids are not reused)
        return params

    monkeypatch.setattr(_request, "_out_params", recording)
    model = server.model("identity")
    value = np.ones((1, 2), np.float32)
    (named,) = model.infer(inputs={"INPUT0": value}, request_id="req-7")
    assert named.request_id == "req-7"
    for _ in range(5):
        (response,) = model.infer(inputs={"INPUT0": value})
        assert response.request_id is None
    by_thread: dict = {}
    for thread, params in seen:
        by_thread.setdefault(thread, set()).add(id(params))
    assert len(seen) == 6 and all(len(ids) == 1 for ids in by_thread.values())


def test_released_requests_are_reused_without_their_inputs(server, monkeypatch):
    """Plain calls reuse released requests (no InferenceRequestNew) and never carry earlier inputs."""
    lib = server._library()
    created = []
    original_new = lib.TRITONSERVER_InferenceRequestNew
    monkeypatch.setattr(lib, "TRITONSERVER_InferenceRequestNew", lambda *args: created.append(1) or original_new(*args))
    model = server.model("add_sub")
    key = (b"add_sub", -1)  # the pool's key: name and version
    ones = np.ones(4, np.float32)
    for index in range(5):
        # (the release callback comes just after the response: wait for it, so the call must reuse)
        assert index == 0 or wait_for(lambda: server._requests.idle_count(key) >= 1, 10)
        (response,) = model.infer(inputs={"INPUT0": np.full(4, index, np.float32), "INPUT1": ones})
        np.testing.assert_array_equal(np.from_dlpack(response.outputs["OUTPUT0"]), np.full(4, index + 1))
    assert len(created) <= 1  # one at most (none if an earlier test left one idle)
    assert wait_for(lambda: server._requests.idle_count(key) >= 1, 10)
    with pytest.raises(tritonserver.InvalidArgumentError, match="INPUT1"):  # INPUT1 of the last call is gone
        model.infer(inputs={"INPUT0": ones})
    before = len(created)
    with_id = model.create_request(inputs={"INPUT0": ones, "INPUT1": ones}, request_id="not-pooled")
    (response,) = model.infer(with_id)
    assert response.request_id == "not-pooled" and len(created) == before + 1  # never reused: ids stay


@needs_stub_strings
def test_bytes_tensors(server):
    for tensor in (
        tritonserver.Tensor.from_string_array(["hello", "wörld"]),
        tritonserver.Tensor.from_bytes_array([b"hello", "wörld"]),
    ):
        (response,) = server.model("strings").infer(inputs={"text_input": tensor})
        output = response.outputs["text_output"]
        assert output.data_type == tritonserver.DataType.BYTES
        assert output.to_string_array().tolist() == ["HELLO", "WöRLD"]
        assert output.to_bytes_array().tolist() == [b"HELLO", "WöRLD".encode()]
    (response,) = server.model("strings").infer(inputs={"text_input": ["plain list"]})
    assert response.outputs["text_output"].to_string_array().tolist() == ["PLAIN LIST"]


def test_decoupled_one_response_per_send(server):
    responses = list(server.model("stream").infer(inputs=stream_inputs(4)))
    assert [int(np.from_dlpack(r.outputs["OUT"])[0]) for r in responses] == [0, 1, 2, 3]
    assert [r.final for r in responses] == [False, False, False, True]


def test_user_response_queue(server):
    user_queue: queue.SimpleQueue = queue.SimpleQueue()
    responses = list(server.model("stream").infer(inputs=stream_inputs(2), response_queue=user_queue))
    assert [user_queue.get(timeout=5) for _ in range(2)] == responses


def test_async_infer_delivers_into_the_loop(server):
    async def main():
        loop_thread = threading.get_ident()
        seen = []
        user_queue: asyncio.Queue = asyncio.Queue()
        async for response in server.model("stream").async_infer(inputs=stream_inputs(3), response_queue=user_queue):
            assert threading.get_ident() == loop_thread
            seen.append(int(np.from_dlpack(response.outputs["OUT"])[0]))
        assert user_queue.qsize() == 3
        many = [
            server.model("identity").async_infer(inputs={"INPUT0": np.full((1, 2), i, np.float32)}) for i in range(8)
        ]
        values = []
        for iterator in many:
            async for response in iterator:
                values.append(float(np.from_dlpack(response.outputs["OUTPUT0"])[0, 0]))
        return seen, values

    seen, values = asyncio.run(main())
    assert seen == [0, 1, 2] and values == [float(i) for i in range(8)]


def test_threads_get_their_own_responses_and_are_batched(server):
    errors: List[BaseException] = []

    def worker(index: int) -> None:
        try:
            for round_ in range(5):
                value = np.full((1, 3), index * 100 + round_, dtype=np.float32)
                (response,) = server.model("identity").infer(inputs={"INPUT0": value})
                np.testing.assert_array_equal(np.from_dlpack(response.outputs["OUTPUT0"]), value)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    stats = server.model("identity").statistics()["model_stats"][0]
    assert max(entry["batch_size"] for entry in stats["batch_stats"]) > 1  # the dynamic batcher batched


def test_concurrent_streams_and_cancellations_leave_nothing_in_flight(server):
    errors: List[BaseException] = []

    def worker(index: int) -> None:
        try:
            for round_ in range(3):
                responses = server.model("stream").infer(inputs=stream_inputs(4, delay=0.005), raise_on_error=False)
                if (index + round_) % 3 == 0:
                    next(responses)
                    responses.cancel()
                    assert list(responses)[-1].final
                else:
                    values = [int(np.from_dlpack(r.outputs["OUT"])[0]) for r in responses]
                    assert values == [0, 1, 2, 3]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert wait_for(lambda: _request.inflight_count() == 0, 10)
    assert wait_for(lambda: _request._BUFFERS == {}, 10)


# -- bad input and faults ---------------------------------------------------------------------------
def test_unknown_model_and_version(server):
    with pytest.raises(tritonserver.NotFoundError, match="no_such_model"):
        server.model("no_such_model").infer(inputs={"INPUT0": np.zeros((1, 1), np.float32)})
    with pytest.raises(tritonserver.NotFoundError, match="'identity' version 7"):
        server.model("identity", 7).infer(inputs={"INPUT0": np.zeros((1, 1), np.float32)})
    with pytest.raises(tritonserver.NotFoundError):
        server.model("no_such_model").metadata()
    assert not server.model("no_such_model").ready()


def test_wrong_input_name_dtype_and_shape(server):
    model = server.model("add_sub")
    good = np.zeros(4, dtype=np.float32)
    with pytest.raises(tritonserver.InvalidArgumentError, match="INPUTX|INPUT1"):
        model.infer(inputs={"INPUT0": good, "INPUTX": good})
    with pytest.raises(tritonserver.InvalidArgumentError, match="(?i)data.?type|INT32|FP32"):
        model.infer(inputs={"INPUT0": good, "INPUT1": np.zeros(4, dtype=np.int32)})
    with pytest.raises(tritonserver.InvalidArgumentError, match="(?i)shape"):
        model.infer(inputs={"INPUT0": good, "INPUT1": np.zeros(5, dtype=np.float32)})
    with pytest.raises(tritonserver.InvalidArgumentError):
        model.infer(inputs={"INPUT0": good, "INPUT1": good}, parameters={"bad": object()})
    # nothing leaked by the refused requests, and the model still works
    (response,) = model.infer(inputs={"INPUT0": good, "INPUT1": good})
    assert response.error is None


def test_model_error_raised_or_returned(server):
    model = server.model("faulty")
    with pytest.raises(tritonserver.TritonError, match="negative input refused"):
        list(model.infer(inputs={"INPUT0": np.array([-1], np.float32)}))
    (response,) = model.infer(inputs={"INPUT0": np.array([-1], np.float32)}, raise_on_error=False)
    assert isinstance(response.error, tritonserver.TritonError) and response.final
    (response,) = model.infer(inputs={"INPUT0": np.array([5], np.float32)})
    assert float(np.from_dlpack(response.outputs["OUTPUT0"])[0]) == 5


def test_model_fails_mid_stream(server):
    seen = []
    with pytest.raises(tritonserver.TritonError, match="failed at 2"):
        for response in server.model("stream").infer(inputs=stream_inputs(5, fail_at=2)):
            seen.append(int(np.from_dlpack(response.outputs["OUT"])[0]))
    assert seen == [0, 1]


def test_cancelled_request(server):
    responses = server.model("stream").infer(inputs=stream_inputs(200, delay=0.02), raise_on_error=False)
    first = next(responses)
    assert not first.final
    responses.cancel()
    rest = list(responses)  # bounded: the model stops at the cancellation
    assert len(rest) < 199
    assert rest[-1].final and isinstance(rest[-1].error, tritonserver.CancelledError)
    responses.cancel()  # after release: harmless


def test_gpu_memory_is_unsupported(server):
    tensor = tritonserver.Tensor.from_dlpack(np.zeros(3, np.float32))
    with pytest.raises(tritonserver.UnsupportedError, match="GPU"):
        tensor.to_device("gpu:0")
    with pytest.raises(tritonserver.UnsupportedError):
        server.model("identity").infer(inputs={"INPUT0": np.ones((1, 1), np.float32)}, output_memory_type="gpu")


def test_custom_allocator(server):
    calls = []

    class Allocator(tritonserver.MemoryAllocator):
        def allocate(self, size, memory_type, memory_type_id):
            calls.append((size, memory_type))
            return tritonserver.MemoryBuffer.from_dlpack(np.zeros(size, dtype=np.uint8))

    (response,) = server.model("identity").infer(
        inputs={"INPUT0": np.ones((1, 4), np.float32)}, output_memory_allocator=Allocator()
    )
    assert calls and calls[0][0] == 16
    np.testing.assert_array_equal(np.from_dlpack(response.outputs["OUTPUT0"]), np.ones((1, 4)))


# -- ModelClient-shaped calls ------------------------------------------------------------------------
def test_model_client_shaped_calls(server):
    with tritonserver.InProcessModelClient(server, "add_sub") as client:
        client.wait_for_model(30)
        a, b = np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)
        result = client.infer_sample(a, b)
        np.testing.assert_array_equal(result["OUTPUT0"], a + b)
        np.testing.assert_array_equal(client.infer_sample(INPUT0=a, INPUT1=b)["OUTPUT1"], a - b)
        with pytest.raises(tritonserver.InvalidArgumentError, match="does not batch"):
            client.infer_batch(a, b)
    with pytest.raises(tritonserver.InvalidArgumentError, match="closed"):
        client.infer_sample(a, b)
    identity = tritonserver.InProcessModelClient(server, "identity")
    sample = identity.infer_sample(np.array([1.0, 2.0], np.float32))
    assert sample["OUTPUT0"].shape == (2,)  # the batch axis was added and removed
    batch = identity.infer_batch(np.ones((3, 2), np.float32))
    assert batch["OUTPUT0"].shape == (3, 2)
    with pytest.raises(tritonserver.InvalidArgumentError, match="decoupled"):
        tritonserver.InProcessModelClient(server, "stream").infer_sample(
            COUNT=_i32(1), FAIL_AT=_i32(-1), DELAY=np.zeros(1, np.float32)
        )


@needs_stub_strings
def test_model_client_shaped_bytes(server):
    result = tritonserver.InProcessModelClient(server, "strings").infer_sample(np.array([b"abc", b"de"], dtype=object))
    assert result["text_output"].tolist() == [b"ABC", b"DE"]


def test_backend_regions_are_private(server):
    """The Python backend creates them in this process, 0600 from the start (a confined start thread, _platform/launch.py).

    tests/e2e/test_local_users.py shows that another user never opens one.
    """
    prefix = server.shm_region_prefix
    names = shm_entries(prefix)
    assert names
    modes = {name: os.stat(os.path.join("/dev/shm", name)).st_mode & 0o777 for name in names}
    assert set(modes.values()) == {0o600}, {name: oct(mode) for name, mode in modes.items()}


def test_only_the_servers_threads_are_confined_and_no_machine_code_is_written(server):
    """The threads Triton started (and the stubs they forked) have umask 077 and the chmod filter; the rest does not.

    Under the default hardening (auto) nothing is patched into this process: its main thread (the
    application) keeps its umask and runs unfiltered, and may still widen a file's mode; the stubs,
    forked by the backend's confined threads, run as a launched server's do.
    """
    from pytriton._platform import proc

    stubs = [
        pid
        for pid in proc.children(os.getpid(), running_only=True)
        if proc.program_is(pid, "triton_python_backend_stub")
    ]
    assert stubs
    for pid in stubs:
        assert (proc.status_field(pid, "Umask"), proc.status_int(pid, "Seccomp")) == ("0077", 2), pid
    threads = proc.tasks() or frozenset()
    confined = [tid for tid in threads if proc.status_int(f"self/task/{tid}", "Seccomp") == 2]
    assert confined and len(confined) < len(threads)  # Triton's threads; not this one
    assert proc.status_int(f"self/task/{threading.get_native_id()}", "Seccomp") == 0
    with tempfile.NamedTemporaryFile() as plain:  # healthy traffic beside it: the application may widen a mode
        os.fchmod(plain.fileno(), 0o644)
        assert os.fstat(plain.fileno()).st_mode & 0o777 == 0o644
    (response,) = server.model("identity").infer(inputs={"INPUT0": np.array([[5]], np.float32)})
    assert float(np.from_dlpack(response.outputs["OUTPUT0"]).flat[0]) == 5
