"""The legacy ``tensorrtserver.api`` layer against real servers, over HTTP and gRPC.

Two servers per module: a plain ``tritonserver`` serving a Python-backend repository this test
writes (sequence batching, a classification output with labels, BYTES, no-batching, a model to
load and unload; management and shared-memory endpoints), and a ``Triton`` with bound models
(inference, health, metadata and model configuration only).
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import textwrap
import threading

import numpy as np
import pytest

import tensorrtserver.shared_memory as shm
from pytriton._serving.launched import server_environment as _server_environment
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy._binding import copy_stub_package
from pytriton.server import versions
from pytriton.server.distribution import find_server, shared_libpython_dir, stub_environment
from pytriton.server.process import TritonServerProcess, http_ready_probe
from pytriton.triton import Triton, TritonConfig
from tensorrtserver.api import (
    DataType,
    InferContext,
    InferenceServerException,
    InferRequestHeader,
    ModelControlContext,
    ModelReadyState,
    ModelRepositoryContext,
    ProtocolType,
    ServerHealthContext,
    ServerReadyState,
    ServerStatusContext,
    SharedMemoryControlContext,
)
from tests.conftest import free_ports, shm_entries, triton_ports
from tests.e2e.kind_models import add_sub, params_echo

RAW = InferContext.ResultFormat.RAW
CLASS = InferContext.ResultFormat.CLASS
START = InferRequestHeader.FLAG_SEQUENCE_START
END = InferRequestHeader.FLAG_SEQUENCE_END
LABELS = ["cat", "dog", "bird", "fish", "frog"]

# -- the plain repository -------------------------------------------------------------------------
# The stub of Triton 2.51 is built against numpy 1.x; on Python 3.13 it runs with numpy 2, where its
# own conversions lose data unless the project's stub helpers are installed (they fix how the stub
# reads strings, see pytriton/proxy/stubside/_stub_bytes.py). So every model installs them, as the proxy model
# of ``Triton.bind`` does, and, like it, moves numeric tensors through DLPack under numpy 2.
_HEADER = textwrap.dedent("""\
    import numpy as np
    import triton_python_backend_utils as pb_utils

    from _pytriton_stubside import _stub_bytes as stub_bytes
    from _pytriton_stubside import _stub_dlpack as stub_dlpack
    from _pytriton_stubside import _tensors as tensors

    stub_bytes.install(pb_utils)  # before the stub first converts a tensor


    def _in(request, name):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if stub_bytes.NUMPY2:  # the tensor owns the memory that DLPack exports: copy while it lives
            return np.from_dlpack(tensor).copy()
        return tensor.as_numpy()


    def _out(name, array):
        if stub_bytes.NUMPY2:  # the stub cannot read numpy 2 arrays itself (as in pytriton's proxy)
            return stub_dlpack.tensor(pb_utils, name, np.array(array, order="C"))
        return pb_utils.Tensor(name, array)


    class TritonPythonModel:
    """)

MODELS = {
    "simple": (
        _HEADER
        + textwrap.indent(
            textwrap.dedent("""\
            def execute(self, requests):
                responses = []
                for r in requests:
                    a, b = _in(r, "INPUT0"), _in(r, "INPUT1")
                    responses.append(pb_utils.InferenceResponse([_out("OUTPUT0", a + b), _out("OUTPUT1", a - b)]))
                return responses
            """),
            "    ",
        ),
        """
        max_batch_size: 8
        input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [16] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [16] }]
        output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [16] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [16] }]
        """,
    ),
    "strings": (
        _HEADER
        + textwrap.indent(
            textwrap.dedent("""\
            def execute(self, requests):
                responses = []
                for r in requests:
                    carrier = stub_bytes.input_payload(pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())
                    x = tensors.deserialize_bytes(carrier.data, 0, len(carrier.data), carrier.shape)
                    y = np.array([v.upper() for v in x.ravel()], dtype=object).reshape(x.shape)
                    out = stub_bytes.output_tensor(pb_utils, "OUTPUT", tensors.serialize_bytes(y), y.shape)
                    responses.append(pb_utils.InferenceResponse([out]))
                return responses
            """),
            "    ",
        ),
        """
        max_batch_size: 8
        input [{ name: "INPUT" data_type: TYPE_STRING dims: [-1] }]
        output [{ name: "OUTPUT" data_type: TYPE_STRING dims: [-1] }]
        """,
    ),
    "classifier": (
        _HEADER
        + textwrap.indent(
            textwrap.dedent("""\
            def execute(self, requests):
                return [pb_utils.InferenceResponse([_out("SCORES", _in(r, "INPUT"))]) for r in requests]
            """),
            "    ",
        ),
        """
        max_batch_size: 8
        input [{ name: "INPUT" data_type: TYPE_FP32 dims: [5] }]
        output [{ name: "SCORES" data_type: TYPE_FP32 dims: [5] label_filename: "labels.txt" }]
        """,
    ),
    # Running sum per sequence; START resets it. Requests of several sequences share a batch.
    "accumulate": (
        _HEADER
        + textwrap.indent(
            textwrap.dedent("""\
            def initialize(self, args):
                self.sums = {}

            def execute(self, requests):
                responses = []
                for r in requests:
                    corrid = int(_in(r, "CORRID").flat[0])
                    if corrid == 0:  # a filler the sequence batcher adds for an idle slot: arbitrary input
                        responses.append(pb_utils.InferenceResponse([_out("OUTPUT", np.zeros((1, 1), np.int32))]))
                        continue
                    if int(_in(r, "START").flat[0]):
                        self.sums[corrid] = 0
                    self.sums[corrid] = self.sums.get(corrid, 0) + int(_in(r, "INPUT").flat[0])
                    out = np.array([[self.sums[corrid]]], dtype=np.int32)
                    if int(_in(r, "END").flat[0]):
                        del self.sums[corrid]
                    responses.append(pb_utils.InferenceResponse([_out("OUTPUT", out)]))
                return responses
            """),
            "    ",
        ),
        """
        max_batch_size: 8
        sequence_batching {
          max_sequence_idle_microseconds: 30000000
          control_input [
            { name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] },
            { name: "END" control [{ kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1] }] },
            { name: "CORRID" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }] }
          ]
        }
        input [{ name: "INPUT" data_type: TYPE_INT32 dims: [1] }]
        output [{ name: "OUTPUT" data_type: TYPE_INT32 dims: [1] }]
        """,
    ),
    "nobatch": (
        _HEADER
        + textwrap.indent(
            textwrap.dedent("""\
            def execute(self, requests):
                return [pb_utils.InferenceResponse([_out("OUTPUT", _in(r, "INPUT") * 2)]) for r in requests]
            """),
            "    ",
        ),
        """
        max_batch_size: 0
        input [{ name: "INPUT" data_type: TYPE_FP32 dims: [3] }]
        output [{ name: "OUTPUT" data_type: TYPE_FP32 dims: [3] }]
        """,
    ),
}
MODELS["spare"] = (MODELS["nobatch"][0], MODELS["nobatch"][1])
LOADED_AT_START = ["simple", "strings", "classifier", "accumulate", "nobatch"]


def write_repository(root: pathlib.Path) -> None:
    for name, (source, config) in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        body = textwrap.dedent(config).strip()
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\n{body}\ninstance_group [{{ kind: KIND_CPU count: 1 }}]\n'
        )
    (root / "classifier" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    for name in MODELS:  # Triton puts the version directory on the stub's sys.path
        copy_stub_package(root / name / "1")


@pytest.fixture(scope="module")
def plain():
    server = find_server()
    env = _server_environment(stub_environment().bin_dir, [shared_libpython_dir(), *server.library_dirs])
    http_port, grpc_port, metrics_port = free_ports(3)
    with tempfile.TemporaryDirectory(prefix="legacy-repo-") as repo:
        write_repository(pathlib.Path(repo))
        argv = [
            str(server.binary), f"--model-repository={repo}", f"--backend-directory={server.backend_dir}",
            f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
            "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
            "--model-control-mode=explicit", "--disable-auto-complete-config",
            f"--backend-config=python,shm-region-prefix-name=legacy-test-{os.getpid()}-",
            *[f"--load-model={name}" for name in LOADED_AT_START],
        ]  # fmt: skip
        process = TritonServerProcess(argv, env)
        process.start()
        try:
            process.wait_until(http_ready_probe("127.0.0.1", http_port), 120, "plain tritonserver failed to start")
            yield {"http": f"127.0.0.1:{http_port}", "grpc": f"127.0.0.1:{grpc_port}"}
        finally:
            # Triton 2.51 delays its exit up to its exit timeout (30 s) after a gRPC stream carried a
            # request it refused (test_streaming does that on purpose; raw tritonclient does the same):
            # give it a short grace, then the group is killed and its Python-backend regions removed.
            process.stop(grace_s=5)
            for name in shm_entries(f"legacy-test-{os.getpid()}-"):
                os.unlink(f"/dev/shm/{name}")


PROTOCOLS = {"http": ProtocolType.HTTP, "grpc": ProtocolType.GRPC}


@pytest.fixture(params=["http", "grpc"])
def proto(request, plain):
    """(url, protocol) of the plain server for one protocol."""
    return plain[request.param], PROTOCOLS[request.param]


def _pair(seed: int):
    rng = np.random.default_rng(seed)
    return rng.integers(-100, 100, 16).astype(np.int32), rng.integers(-100, 100, 16).astype(np.int32)


# -- inference ------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_size", [1, 8])
def test_run_raw(proto, batch_size):
    url, protocol = proto
    pairs = [_pair(seed) for seed in range(batch_size)]
    with InferContext(url, protocol, "simple") as ctx:
        results = ctx.run(
            {"INPUT0": [a for a, _ in pairs], "INPUT1": [b for _, b in pairs]},
            {"OUTPUT0": RAW, "OUTPUT1": InferContext.ResultFormat.RAW},
            batch_size,
        )
        assert sorted(results) == ["OUTPUT0", "OUTPUT1"]
        assert len(results["OUTPUT0"]) == batch_size and len(results["OUTPUT1"]) == batch_size
        for (a, b), total, diff in zip(pairs, results["OUTPUT0"], results["OUTPUT1"]):
            assert total.shape == (16,) and total.dtype == np.int32
            np.testing.assert_array_equal(total, a + b)
            np.testing.assert_array_equal(diff, a - b)
        assert ctx.get_last_request_id() == 1
        assert ctx.get_last_request_model_name() == "simple"
        assert ctx.get_last_request_model_version() == 1
        ctx.run({"INPUT0": [pairs[0][0]], "INPUT1": [pairs[0][1]]}, {"OUTPUT1": RAW})
        assert ctx.get_last_request_id() == 2
        stat = ctx.get_stat()
        assert stat["completed_request_count"] == 2
        assert (
            stat["cumulative_total_request_time_ns"]
            >= stat["cumulative_send_time_ns"] + stat["cumulative_receive_time_ns"]
            > 0
        )


def test_explicit_model_version(proto):
    url, protocol = proto
    a, b = _pair(3)
    with InferContext(url, protocol, "simple", model_version=1) as ctx:
        np.testing.assert_array_equal(ctx.run({"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT0": RAW})["OUTPUT0"][0], a + b)
    with pytest.raises(InferenceServerException) as info:
        InferContext(url, protocol, "simple", model_version=7)
    assert "simple" in info.value.message()


@pytest.mark.parametrize("batch_size", [1, 3])
def test_run_class_with_labels(proto, batch_size):
    url, protocol = proto
    samples = [np.roll(np.array([0.1, 0.9, 0.5, 0.3, 0.7], dtype=np.float32), shift) for shift in range(batch_size)]
    with InferContext(url, protocol, "classifier") as ctx:
        results = ctx.run({"INPUT": samples}, {"SCORES": (CLASS, 3)}, batch_size)
    assert len(results["SCORES"]) == batch_size
    for sample, top in zip(samples, results["SCORES"]):
        expected = np.argsort(-sample)[:3]
        assert [index for index, _, _ in top] == list(expected)
        assert [label for _, _, label in top] == [LABELS[i] for i in expected]
        np.testing.assert_allclose([value for _, value, _ in top], sample[expected], rtol=1e-5)


def test_run_class_and_raw_together(proto):
    url, protocol = proto
    a, b = _pair(5)
    with InferContext(url, protocol, "simple") as ctx:
        results = ctx.run({"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT0": (CLASS, 2), "OUTPUT1": RAW})
    top = results["OUTPUT0"][0]
    total = a + b
    assert [value for _, value, _ in top] == sorted(total.astype(float), reverse=True)[:2]
    assert all(total[index] == value for index, value, _ in top)
    assert all(label == "" for _, _, label in top)  # no labels file for this output
    np.testing.assert_array_equal(results["OUTPUT1"][0], a - b)


def test_bytes_tensors(proto):
    url, protocol = proto
    samples = [np.array([f"word{i}", "ünï", "x" * i], dtype=object) for i in range(8)]
    samples[3] = np.array([b"raw", b"bytes", b"\x00\x01"], dtype=np.bytes_)
    with InferContext(url, protocol, "strings") as ctx:
        results = ctx.run({"INPUT": samples}, {"OUTPUT": RAW}, batch_size=8)
    assert len(results["OUTPUT"]) == 8
    for sample, out in zip(samples, results["OUTPUT"]):
        expected = [(v if isinstance(v, bytes) else v.encode()).upper() for v in sample]
        assert list(out) == expected


def test_async_run_32_in_flight(proto):
    url, protocol = proto
    pairs = {seed: _pair(seed) for seed in range(32)}
    called = []
    lock = threading.Lock()

    def callback(ctx, request_id):
        with lock:
            called.append(request_id)

    with InferContext(url, protocol, "simple") as ctx:
        ids = {
            ctx.async_run(callback, {"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT0": RAW, "OUTPUT1": RAW}, 1): seed
            for seed, (a, b) in pairs.items()
        }
        assert len(ids) == 32
        seen = set()
        for _ in range(32):
            request_id = ctx.get_ready_async_request(True)
            results = ctx.get_async_run_results(request_id, True)
            a, b = pairs[ids[request_id]]
            np.testing.assert_array_equal(results["OUTPUT0"][0], a + b)
            np.testing.assert_array_equal(results["OUTPUT1"][0], a - b)
            assert ctx.get_last_request_id() == request_id
            seen.add(request_id)
        assert seen == set(ids)
        assert sorted(called) == sorted(ids)
        assert ctx.get_stat()["completed_request_count"] == 32
        with pytest.raises(InferenceServerException, match="no async_run request is outstanding"):
            ctx.get_ready_async_request(False)
        # get_async_run_results by id, in send order, without get_ready_async_request.
        first = ctx.async_run(None, {"INPUT0": [pairs[0][0]], "INPUT1": [pairs[0][1]]}, {"OUTPUT0": RAW})
        np.testing.assert_array_equal(ctx.get_async_run_results(first)["OUTPUT0"][0], pairs[0][0] + pairs[0][1])
        with pytest.raises(InferenceServerException, match="not an outstanding"):
            ctx.get_async_run_results(first)
    # close() joined the HTTP workers (each closed its own client).
    assert not [t for t in threading.enumerate() if t.name == "legacy-http-client"]


def test_async_callback_may_read_results(proto):
    url, protocol = proto
    a, b = _pair(9)
    got = []
    finished = threading.Event()

    def callback(ctx, request_id):
        got.append(ctx.get_async_run_results(request_id, False))
        finished.set()

    with InferContext(url, protocol, "simple") as ctx:
        ctx.async_run(callback, {"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT0": RAW})
        assert finished.wait(30)
    np.testing.assert_array_equal(got[0]["OUTPUT0"][0], a + b)


def _sequence_steps(ctx, corr_id, values, use_async=False):
    """Send one sequence; returns the running sums the model reported."""
    sums = []
    for position, value in enumerate(values):
        flags = (START if position == 0 else 0) | (END if position == len(values) - 1 else 0)
        inputs = {"INPUT": [np.array([value], dtype=np.int32)]}
        if use_async:
            request_id = ctx.async_run(None, inputs, {"OUTPUT": RAW}, 1, flags, corr_id)
            sums.append(int(ctx.get_async_run_results(request_id, True)["OUTPUT"][0][0]))
        else:
            sums.append(int(ctx.run(inputs, {"OUTPUT": RAW}, 1, flags, corr_id)["OUTPUT"][0][0]))
    return sums


def test_sequences_interleaved(proto):
    url, protocol = proto
    with (
        InferContext(url, protocol, "accumulate", correlation_id=1001) as first,
        InferContext(url, protocol, "accumulate") as second,
    ):
        assert first.correlation_id() == 1001 and second.correlation_id() == 0
        # Interleave two sequences: each keeps its own running sum.
        assert first.run({"INPUT": [np.array([5], np.int32)]}, {"OUTPUT": RAW}, 1, START)["OUTPUT"][0][0] == 5
        assert (
            second.run({"INPUT": [np.array([100], np.int32)]}, {"OUTPUT": RAW}, 1, START, 2002)["OUTPUT"][0][0] == 100
        )
        assert second.correlation_id() == 2002  # a corr_id argument sticks to the context
        assert first.run({"INPUT": [np.array([6], np.int32)]}, {"OUTPUT": RAW})["OUTPUT"][0][0] == 11
        assert second.run({"INPUT": [np.array([1], np.int32)]}, {"OUTPUT": RAW}, 1, END)["OUTPUT"][0][0] == 101
        assert first.run({"INPUT": [np.array([-1], np.int32)]}, {"OUTPUT": RAW}, 1, END)["OUTPUT"][0][0] == 10
        # A new sequence on the same id starts from zero again; async requests work the same.
        assert _sequence_steps(first, 1001, [1, 2, 3], use_async=True) == [1, 3, 6]


def test_sequence_without_correlation_id_is_refused(proto):
    url, protocol = proto
    with InferContext(url, protocol, "accumulate") as ctx:
        with pytest.raises(InferenceServerException) as info:
            ctx.run({"INPUT": [np.array([1], np.int32)]}, {"OUTPUT": RAW})
        assert ctx.get_last_request_id() is None
    assert (
        "needs a non-zero correlation id" in info.value.message()
        or "need a non-zero correlation id" in info.value.message()
    )
    assert info.value.request_id() == 1


def test_server_side_error(proto):
    url, protocol = proto
    with InferContext(url, protocol, "classifier") as ctx, pytest.raises(InferenceServerException) as info:
        # Valid on the client, refused by the server: a shared memory region it does not know.
        handle = shm.create_shared_memory_region("never_registered", f"/legacy{os.getpid()}_unreg", 64)
        try:
            ctx.run({"INPUT": handle}, {"SCORES": RAW})
        finally:
            shm.destroy_shared_memory_region(handle)
    assert "never_registered" in info.value.message()
    assert info.value.server_id() == url and info.value.request_id() == 1


def test_streaming(plain):
    url = plain["grpc"]
    with InferContext(url, ProtocolType.GRPC, "simple", streaming=True) as ctx:
        a, b = _pair(11)
        np.testing.assert_array_equal(ctx.run({"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT0": RAW})["OUTPUT0"][0], a + b)
        pairs = {seed: _pair(seed) for seed in range(32)}
        ids = {ctx.async_run(None, {"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT1": RAW}): s for s, (a, b) in pairs.items()}
        for request_id, seed in ids.items():
            a, b = pairs[seed]
            np.testing.assert_array_equal(ctx.get_async_run_results(request_id, True)["OUTPUT1"][0], a - b)
        # run() inside a callback would wait on the thread that delivers the stream's responses.
        refused = []
        finished = threading.Event()

        def callback(context, request_id):
            try:
                context.run({"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT0": RAW})
            except InferenceServerException as error:
                refused.append(error.message())
            finally:
                finished.set()

        first = ctx.async_run(callback, {"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT0": RAW})
        assert finished.wait(30) and "use async_run there" in refused[0]
        np.testing.assert_array_equal(ctx.get_async_run_results(first)["OUTPUT0"][0], a + b)
    with InferContext(url, ProtocolType.GRPC, "accumulate", correlation_id=77, streaming=True) as ctx:
        assert _sequence_steps(ctx, 77, [4, 4, 2]) == [4, 8, 10]
        assert _sequence_steps(ctx, 78, [1, 1], use_async=True) == [1, 2]
    with InferContext(url, ProtocolType.GRPC, "classifier", streaming=True) as ctx:
        # A request the server refuses fails alone; the stream goes on.
        handle = shm.create_shared_memory_region("never_registered", f"/legacy{os.getpid()}_unreg", 64)
        try:
            with pytest.raises(InferenceServerException, match="never_registered"):
                ctx.run({"INPUT": handle}, {"SCORES": RAW})
        finally:
            shm.destroy_shared_memory_region(handle)
        top = ctx.run({"INPUT": [np.array([0, 0, 3, 0, 0], np.float32)]}, {"SCORES": (CLASS, 1)})["SCORES"][0]
        assert top == [(2, 3.0, "bird")]


def test_streaming_needs_grpc(plain):
    with pytest.raises(InferenceServerException, match="gRPC"):
        InferContext(plain["http"], ProtocolType.HTTP, "simple", streaming=True)


def test_non_batching_model(proto):
    url, protocol = proto
    x = np.array([1.0, 2.0, 3.0], np.float32)
    with InferContext(url, protocol, "nobatch") as ctx:
        out = ctx.run({"INPUT": [x]}, {"OUTPUT": RAW})["OUTPUT"]
        assert len(out) == 1 and out[0].shape == (3,)
        np.testing.assert_array_equal(out[0], x * 2)
        with pytest.raises(InferenceServerException, match="does not support batching"):
            ctx.run({"INPUT": [x, x]}, {"OUTPUT": RAW}, 2)


# -- errors ---------------------------------------------------------------------------------------
def test_errors(proto):
    url, protocol = proto
    a, b = _pair(1)
    with pytest.raises(InferenceServerException) as info:
        InferContext(url, protocol, "no_such_model")
    assert type(info.value) is InferenceServerException and "no_such_model" in info.value.message()
    assert info.value.server_id() == url
    with InferContext(url, protocol, "simple") as ctx:
        cases = [
            (({"INPUT0": [a]}, {"OUTPUT0": RAW}), "missing ['INPUT1']"),
            (({"INPUT0": [a], "INPUT1": [b], "INPUT9": [a]}, {"OUTPUT0": RAW}), "unknown input"),
            (({"INPUT0": [a[:5]], "INPUT1": [b]}, {"OUTPUT0": RAW}), "expected 16 elements"),
            (({"INPUT0": [a], "INPUT1": [b]}, {"OUTPUTX": RAW}), "unknown output 'OUTPUTX'"),
            (({"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT0": CLASS}), "format must be"),
            (({"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT0": (CLASS, 0)}), "positive integer k"),
            (({"INPUT0": [a.astype(np.float32)], "INPUT1": [b]}, {"OUTPUT0": RAW}), "expected INT32"),
            (({"INPUT0": a, "INPUT1": b}, {"OUTPUT0": RAW}), "list of 1 per-sample"),
        ]
        for args, expected in cases:
            with pytest.raises(InferenceServerException) as info:
                ctx.run(*args)
            assert type(info.value) is InferenceServerException
            assert expected in info.value.message(), info.value.message()
            assert info.value.request_id() > 0
            assert ctx.get_last_request_id() is None
        with pytest.raises(InferenceServerException, match="2 value"):
            ctx.run({"INPUT0": [a, a], "INPUT1": [b, b]}, {"OUTPUT0": RAW}, 3)
        with pytest.raises(InferenceServerException, match="exceeds the max_batch_size 8"):
            ctx.run({"INPUT0": [a] * 9, "INPUT1": [b] * 9}, {"OUTPUT0": RAW}, 9)
        with pytest.raises(InferenceServerException, match="correlation id"):
            ctx.run({"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT0": RAW}, 1, START)
        with pytest.raises(InferenceServerException, match="request id 999"):
            ctx.get_async_run_results(999, True)
    # The spec: after close(), any call on the context is an error.
    for call in (
        lambda: ctx.run({"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT0": RAW}),
        ctx.correlation_id,
        ctx.get_last_request_id,
        ctx.get_last_request_model_name,
        ctx.get_last_request_model_version,
        ctx.get_stat,
    ):
        with pytest.raises(InferenceServerException, match="closed"):
            call()
    with pytest.raises(InferenceServerException, match="Header:Value"):
        InferContext(url, protocol, "simple", http_headers=["no-colon"])


def test_server_down_is_an_inference_server_exception(proto):
    _, protocol = proto
    (port,) = free_ports(1)
    for make in (
        lambda: InferContext(f"127.0.0.1:{port}", protocol, "simple"),
        lambda: ServerHealthContext(f"127.0.0.1:{port}", protocol).is_live(),
        lambda: ServerStatusContext(f"127.0.0.1:{port}", protocol).get_server_status(),
    ):
        with pytest.raises(InferenceServerException) as info:
            make()
        assert type(info.value) is InferenceServerException and info.value.message()


# -- health, status, control, repository ----------------------------------------------------------
def test_health(proto):
    url, protocol = proto
    with ServerHealthContext(url, protocol) as ctx:
        assert ctx.get_last_request_id() is None
        assert ctx.is_live() is True and ctx.is_ready() is True
        assert ctx.get_last_request_id() == 2


def test_server_status(proto):
    url, protocol = proto
    a, b = _pair(2)
    with InferContext(url, protocol, "simple") as infer:
        infer.run({"INPUT0": [a] * 4, "INPUT1": [b] * 4}, {"OUTPUT0": RAW}, 4)
    with ServerStatusContext(url, protocol) as ctx:
        status = ctx.get_server_status()
        assert ctx.get_last_request_id() == 1
    assert status.id == "triton" and status.version == versions.selected_version()  # make test-triton-older
    assert status.ready_state == ServerReadyState.SERVER_READY
    assert set(LOADED_AT_START) | {"spare"} <= set(status.model_status)
    simple = status.model_status["simple"]
    assert simple.config.name == "simple" and simple.config.max_batch_size == 8
    assert [i.name for i in simple.config.input] == ["INPUT0", "INPUT1"]
    assert simple.config.input[0].data_type == DataType.TYPE_INT32 and simple.config.input[0].dims == [16]
    assert simple.config.output[1].name == "OUTPUT1"
    version = simple.version_status[1]
    assert version.ready_state == ModelReadyState.MODEL_READY
    assert version.model_inference_count >= 4 and version.model_execution_count >= 1
    assert version.infer_stats[4].success.count >= 1 and version.infer_stats[4].success.total_time_ns > 0
    assert status.model_status["classifier"].config.output[0].label_filename == "labels.txt"
    assert status.model_status["accumulate"].config.sequence_batching is not None
    with ServerStatusContext(url, protocol, "classifier") as ctx:
        assert list(ctx.get_server_status().model_status) == ["classifier"]
    with ServerStatusContext(url, protocol, "no_such_model") as ctx, pytest.raises(InferenceServerException) as info:
        ctx.get_server_status()
    assert "no_such_model" in info.value.message() and ctx.get_last_request_id() is None


def test_load_unload_and_repository_index(plain):
    x = np.array([1.0, 2.0, 3.0], np.float32)
    for name in ("http", "grpc"):
        url, protocol = plain[name], PROTOCOLS[name]
        with ModelRepositoryContext(url, protocol) as repo:
            names = [entry.name for entry in repo.get_model_repository_index().models]
            assert names == sorted(MODELS)
        with ModelControlContext(url, protocol) as control, ServerStatusContext(url, protocol, "spare") as status:
            control.load("spare")
            assert control.get_last_request_id() == 1
            assert (
                status.get_server_status().model_status["spare"].version_status[1].ready_state
                == ModelReadyState.MODEL_READY
            )
            with InferContext(url, protocol, "spare") as ctx:
                np.testing.assert_array_equal(ctx.run({"INPUT": [x]}, {"OUTPUT": RAW})["OUTPUT"][0], x * 2)
                control.unload("spare")
                assert status.get_server_status().model_status["spare"].version_status[1].ready_state in (
                    ModelReadyState.MODEL_UNAVAILABLE,
                    ModelReadyState.MODEL_UNLOADING,
                )
                with pytest.raises(InferenceServerException):
                    ctx.run({"INPUT": [x]}, {"OUTPUT": RAW})
            with pytest.raises(InferenceServerException) as info:
                control.load("no_such_model")
            assert "no_such_model" in info.value.message() and control.get_last_request_id() is None
        control.close()
        with pytest.raises(InferenceServerException, match="closed"):
            control.load("spare")


# -- shared memory --------------------------------------------------------------------------------
def test_shared_memory_inputs_and_outputs(proto):
    url, protocol = proto
    tag = f"legacy{os.getpid()}{protocol.name.lower()}"
    batch_size = 2
    pairs = [_pair(20 + i) for i in range(batch_size)]
    size = batch_size * 16 * 4
    handles = {
        name: shm.create_shared_memory_region(f"{tag}_{name}", f"/{tag}_{name}", size)
        for name in ("in0", "in1", "out0", "out1")
    }
    try:
        shm.set_shared_memory_region(handles["in0"], [a for a, _ in pairs])
        shm.set_shared_memory_region(handles["in1"], [b for _, b in pairs])
        with SharedMemoryControlContext(url, protocol) as control:
            for handle in handles.values():
                control.register(handle)
            regions = control.get_shared_memory_status().shared_memory_region
            assert [r.name for r in regions] == sorted(f"{tag}_{n}" for n in handles)
            assert {r.system_shared_memory.shared_memory_key for r in regions} == {f"/{tag}_{n}" for n in handles}
            assert all(r.byte_size == size for r in regions)
            with InferContext(url, protocol, "simple") as ctx:
                results = ctx.run(
                    {"INPUT0": handles["in0"], "INPUT1": handles["in1"]},
                    {"OUTPUT0": (RAW, handles["out0"]), "OUTPUT1": (RAW, handles["out1"])},
                    batch_size,
                )
            for i, (a, b) in enumerate(pairs):
                np.testing.assert_array_equal(results["OUTPUT0"][i], a + b)
                np.testing.assert_array_equal(results["OUTPUT1"][i], a - b)
            in_region = shm.get_contents_as_numpy(handles["out0"], np.int32, [batch_size, 16])
            np.testing.assert_array_equal(in_region, np.stack([a + b for a, b in pairs]))
            control.unregister(handles["in0"])
            assert len(control.get_shared_memory_status().shared_memory_region) == 3
            with pytest.raises(InferenceServerException, match="(?i)cuda"):
                control.cuda_register(object())
            control.unregister_all()
            assert control.get_shared_memory_status().shared_memory_region == []
            with pytest.raises(InferenceServerException):
                control.register("not a handle")
    finally:
        for handle in handles.values():
            shm.destroy_shared_memory_region(handle)
    assert shm_entries(tag) == []


# -- a Triton-bound model -------------------------------------------------------------------------
@batch
def shout(text):
    return {"loud": np.array([[v.upper() for v in row] for row in text], dtype=object)}


@pytest.fixture(scope="module")
def bound():
    ports = triton_ports()
    config = TritonConfig(http_header_forward_pattern="x-.*", grpc_header_forward_pattern="x-.*", **ports)
    with Triton(config=config) as triton:
        f32 = np.float32
        triton.bind(
            "AddSub",
            add_sub,
            [Tensor(name="a", shape=(4,), dtype=f32), Tensor(name="b", shape=(4,), dtype=f32)],
            [Tensor(name="add", shape=(4,), dtype=f32), Tensor(name="sub", shape=(4,), dtype=f32)],
            config=ModelConfig(max_batch_size=16),
        )
        triton.bind(
            "Shout",
            shout,
            [Tensor(name="text", shape=(-1,), dtype=bytes)],
            [Tensor(name="loud", shape=(-1,), dtype=bytes)],
            config=ModelConfig(max_batch_size=8),
        )
        triton.bind(
            "Params",
            params_echo,
            [Tensor(name="x", shape=(1,), dtype=np.float32)],
            [Tensor(name="params", shape=(1,), dtype=bytes)],
            config=ModelConfig(max_batch_size=8),
        )
        for version in (1, 2):  # version v multiplies by v

            def scale(requests, factor=np.float32(version)):
                return [{"y": request["x"] * factor} for request in requests]

            triton.bind(
                "Versioned",
                scale,
                [Tensor(name="x", shape=(1,), dtype=np.float32)],
                [Tensor(name="y", shape=(1,), dtype=np.float32)],
                config=ModelConfig(max_batch_size=8),
                model_version=version,
            )
        triton.run()
        yield {
            "http": f"127.0.0.1:{ports['http_port']}",
            "grpc": f"127.0.0.1:{ports['grpc_port']}",
            "token": triton.get_access_token(),
        }


@pytest.mark.parametrize("name", ["http", "grpc"])
def test_documented_token_header_opens_a_restricted_server(bound, name):
    # docs/legacy-client.md: http_headers=["triton-access-token:<token>"] over either protocol. Over
    # gRPC Triton reads the token only under its own metadata key; the transport renames it.
    url, protocol = bound[name], PROTOCOLS[name]
    with ModelRepositoryContext(url, protocol) as repo, pytest.raises(InferenceServerException):
        repo.get_model_repository_index()  # restricted: refused without the token
    headers = [f"triton-access-token:{bound['token']}"]
    with ModelRepositoryContext(url, protocol, http_headers=headers) as repo:
        names = [entry.name for entry in repo.get_model_repository_index().models]
    assert names == ["AddSub", "Params", "Shout", "Versioned"]
    with ServerStatusContext(url, protocol, "AddSub", http_headers=headers) as status:
        assert list(status.get_server_status().model_status) == ["AddSub"]


@pytest.mark.parametrize("name", ["http", "grpc"])
def test_model_version_none_means_the_latest(bound, name):
    url, protocol = bound[name], PROTOCOLS[name]
    x = [np.full(1, 3.0, np.float32)]
    for version, expected in ((None, 6.0), (2, 6.0), (1, 3.0)):
        with InferContext(url, protocol, "Versioned", model_version=version) as ctx:
            assert ctx.run({"x": x}, {"y": RAW})["y"][0][0] == expected, version
            assert ctx.get_last_request_model_name() == "Versioned"
            assert ctx.get_last_request_model_version() == (version or 2)


@pytest.mark.parametrize("name", ["http", "grpc"])
def test_http_headers_reach_the_server(bound, name):
    # Over gRPC too (as metadata): that is how old code passes an access token to a restricted server.
    url, protocol = bound[name], PROTOCOLS[name]
    with InferContext(url, protocol, "Params", http_headers=["X-Legacy-Token: abc:def", "Other:no"]) as ctx:
        out = ctx.run({"x": [np.ones(1, np.float32)]}, {"params": RAW})["params"][0]
    # HTTP keeps the header's case, gRPC metadata is lower case.
    assert {key.lower(): value for key, value in json.loads(out[0]).items()} == {"x-legacy-token": "abc:def"}


@pytest.mark.parametrize("name", ["http", "grpc"])
def test_bound_model(bound, name):
    url, protocol = bound[name], PROTOCOLS[name]
    with ServerHealthContext(url, protocol) as health:
        assert health.is_live() and health.is_ready()
    rng = np.random.default_rng(0)
    with InferContext(url, protocol, "AddSub", http_headers=["X-Legacy-Client:1"]) as ctx:
        for batch_size in (1, 8):
            a = [rng.random(4, dtype=np.float32) for _ in range(batch_size)]
            b = [rng.random(4, dtype=np.float32) for _ in range(batch_size)]
            results = ctx.run({"a": a, "b": b}, {"add": RAW, "sub": (CLASS, 2)}, batch_size)
            for i in range(batch_size):
                np.testing.assert_allclose(results["add"][i], a[i] + b[i], rtol=1e-6)
                diff = a[i] - b[i]
                assert [index for index, _, _ in results["sub"][i]] == list(np.argsort(-diff)[:2])
        inputs = {seed: ([np.full(4, seed, np.float32)], [np.ones(4, np.float32)]) for seed in range(32)}
        ids = {ctx.async_run(None, {"a": a, "b": b}, {"add": RAW}): seed for seed, (a, b) in inputs.items()}
        for _ in range(32):
            request_id = ctx.get_ready_async_request(True)
            np.testing.assert_array_equal(
                ctx.get_async_run_results(request_id, True)["add"][0], np.full(4, ids[request_id] + 1, np.float32)
            )
    with InferContext(url, protocol, "Shout") as ctx:
        words = [np.array([b"abc", b"de"], dtype=object), np.array(["fg", "hi"], dtype=object)]
        out = ctx.run({"text": words}, {"loud": RAW}, 2)["loud"]
        assert [list(v) for v in out] == [[b"ABC", b"DE"], [b"FG", b"HI"]]


def test_bound_model_streaming(bound):
    with InferContext(bound["grpc"], ProtocolType.GRPC, "AddSub", streaming=True) as ctx:
        a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
        ids = [ctx.async_run(None, {"a": [a * i], "b": [b]}, {"sub": RAW}) for i in range(8)]
        for i, request_id in enumerate(ids):
            np.testing.assert_array_equal(ctx.get_async_run_results(request_id)["sub"][0], a * i - b)


def test_run_inside_async_callback(proto):
    # Old code sometimes chained requests from the callback: that must not deadlock the transport.
    url, protocol = proto
    a, b = _pair(4)
    chained = []
    finished = threading.Event()

    def callback(ctx, request_id):
        try:
            chained.append(ctx.run({"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT1": RAW})["OUTPUT1"][0])
        finally:
            finished.set()

    with InferContext(url, protocol, "simple") as ctx:
        first = ctx.async_run(callback, {"INPUT0": [a], "INPUT1": [b]}, {"OUTPUT0": RAW})
        assert finished.wait(30), "run() inside an async_run callback did not finish"
        np.testing.assert_array_equal(ctx.get_async_run_results(first)["OUTPUT0"][0], a + b)
    np.testing.assert_array_equal(chained[0], a - b)
