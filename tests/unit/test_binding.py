"""``BoundModel`` (``pytriton/proxy/_binding.py``) with a temporary directory and no server.

Covers the resolved Triton config, the validation at bind, the repository files (config, the
stub's copies, the private file, warmup data), the generation written on rewrite, version
compatibility, and the workers: one per instance slot, reachable over their sockets with the
handshake a stub performs, all removed again by ``stop_workers``. (Private file permissions and
the secrets kept out of ``config.pbtxt`` are in test_security.py.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import secrets
import shutil
import socket
import tempfile

import numpy as np
import pytest

from pytriton.exceptions import PyTritonBadParameterError, PyTritonValidationError
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.model_config.common import ModelWarmup, WarmupInput
from pytriton.proxy import _binding
from pytriton.proxy._binding import (
    BindingContext,
    BoundModel,
    PollingWindows,
    poll_window_us,
    short_socket_dir,
    validate_model_name,
)
from pytriton.proxy.stubside import _messages, _tensors, _wire
from tests.conftest import shm_entries

X = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
Y = [Tensor(name="y", shape=(-1,), dtype=np.float32)]


def identity(requests):
    return [{"y": request["x"]} for request in requests]


@pytest.fixture()
def context():
    # Short: the worker sockets live in here, and a Unix socket path holds at most 108 bytes.
    socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="ptb-", dir="/tmp"))
    prefix = f"pytriton-{os.getpid()}-bindtest{secrets.token_hex(3)}"
    failures = []
    yield BindingContext(
        user_pid=os.getpid(), shm_prefix=prefix, socket_dir=socket_dir, on_unrecoverable=failures.append
    )
    shutil.rmtree(socket_dir, ignore_errors=True)
    assert not shm_entries(prefix)
    assert failures == []


def _model(context, **kwargs):
    arguments = {
        "index": 0,
        "model_name": "Identity",
        "model_version": 1,
        "infer_funcs": identity,
        "inputs": X,
        "outputs": Y,
        "config": ModelConfig(),
        "strict": False,
        "context": context,
    }
    arguments.update(kwargs)
    return BoundModel(**arguments)


def test_config_is_resolved_at_bind(context):
    model = _model(
        context,
        index=2,
        infer_funcs=[identity, identity, identity],
        inputs=[Tensor(shape=(2,), dtype=np.int32), Tensor(name="s", shape=(-1,), dtype=object, optional=True)],
        config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=2500)),
    )
    config = model.config
    assert [spec.name for spec in config.inputs] == ["INPUT_1", "s"]  # unnamed tensors get a positional name
    assert config.inputs[1].dtype is np.bytes_ and config.inputs[1].optional
    assert config.max_batch_size == 8 and model.max_queue_delay_s == 0.0025
    assert config.backend_parameters == {"pytriton.generation": "0"}
    assert model.has_bytes_tensors
    assert model.endpoint_dir == context.socket_dir / "m2"
    assert model.shm_prefix == f"{context.shm_prefix}-m2"
    assert model._private["slots"] == 3 and model._private["execution_timeout_s"] == 0.0


def test_a_model_without_batching(context):
    model = _model(context, config=ModelConfig(batching=False, execution_timeout_s=2))
    assert model.config.max_batch_size == 0 and model.config.batcher is None
    assert model.max_queue_delay_s == 0.0 and not model.has_bytes_tensors
    assert model.execution_timeout_s == 2.0 and model._private["execution_timeout_s"] == 2.0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"model_name": "a/b"}, PyTritonValidationError, "Invalid model name 'a/b'"),
        ({"model_name": ".."}, PyTritonValidationError, "Invalid model name"),
        ({"model_version": 0}, PyTritonValidationError, "model_version must be a positive int"),
        ({"model_version": True}, PyTritonValidationError, "model_version must be a positive int"),
        ({"infer_funcs": []}, PyTritonBadParameterError, "infer_func must be a callable or a non-empty list"),
        ({"infer_funcs": [identity, "f"]}, PyTritonBadParameterError, "infer_func must be a callable"),
        ({"config": {"max_batch_size": 4}}, PyTritonBadParameterError, "config must be a ModelConfig"),
        ({"config": ModelConfig(max_batch_size=0)}, PyTritonBadParameterError, "max_batch_size must be >= 1"),
        ({"inputs": ["x"]}, PyTritonBadParameterError, "inputs must be pytriton.model_config.Tensor objects"),
        (
            {"inputs": [Tensor(name="x", shape=(0,), dtype=np.float32)]},
            PyTritonBadParameterError,
            r"tensor 'x' has shape \(0,\)",
        ),
        ({"inputs": X + X}, PyTritonBadParameterError, r"duplicate input names \['x'\]"),
        (
            {"outputs": [Tensor(name="y", shape=(1,), dtype=np.float32, optional=True)]},
            PyTritonBadParameterError,
            "outputs cannot be optional",
        ),
    ],
)
def test_bind_refuses_bad_arguments_with_a_clear_message(context, kwargs, error, match):
    with pytest.raises(error, match=match):
        _model(context, **kwargs)


def test_a_model_without_inputs_or_outputs_binds(context):
    # NVIDIA PyTriton binds one (its life-cycle tests bind `lambda: None` with no tensors) and Triton loads it.
    model = _model(context, inputs=[], outputs=[])
    assert model.config.inputs == [] and model.config.outputs == []


def test_a_socket_directory_too_long_for_unix_sockets_is_refused(context):
    long_context = BindingContext(
        user_pid=os.getpid(),
        shm_prefix=context.shm_prefix,
        socket_dir=pathlib.Path("/tmp") / ("d" * 100),
        on_unrecoverable=print,
    )
    with pytest.raises(PyTritonValidationError, match="too long for a unix socket path"):
        _model(long_context)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        ".",
        "a b",
        "x/../y",
        3,
        None,
        "m\n",  # a final newline once slipped through a "$"-anchored pattern
    ],
)
def test_invalid_model_names_are_refused(bad):
    assert validate_model_name("resnet-50_v1.2") == "resnet-50_v1.2"
    with pytest.raises(PyTritonValidationError, match="Invalid model name"):
        validate_model_name(bad)


def test_poll_window_from_the_environment(monkeypatch):
    monkeypatch.delenv("PYTRITON_UNIT_SPIN_US", raising=False)
    assert poll_window_us("PYTRITON_UNIT_SPIN_US", 1000) == 1000
    for raw, value in ((" 250 ", 250), ("0", 0), ("1000000", 1_000_000), ("", 7)):
        monkeypatch.setenv("PYTRITON_UNIT_SPIN_US", raw)
        assert poll_window_us("PYTRITON_UNIT_SPIN_US", 7) == value
    for raw in ("-1", "1000001", "1.5", "fast"):
        monkeypatch.setenv("PYTRITON_UNIT_SPIN_US", raw)
        with pytest.raises(PyTritonValidationError, match=rf"PYTRITON_UNIT_SPIN_US='{raw}' is not a polling window"):
            poll_window_us("PYTRITON_UNIT_SPIN_US", 7)


def test_the_polling_windows_reach_the_stub_and_the_workers(context, monkeypatch):
    monkeypatch.setenv("PYTRITON_PROXY_SPIN_US", "40")
    monkeypatch.setenv("PYTRITON_WORKER_SPIN_US", "30")
    # Triton resolves them once, at construction, and hands them to each model in its context.
    model = _model(dataclasses.replace(context, polling=PollingWindows.from_env()))
    assert model._private["spin_us"] == 40 and model._worker_poll_s == pytest.approx(30e-6)


def test_repository_files(context, tmp_path):
    model = _model(context, model_version=3)
    repository = tmp_path / "repo"
    model.write_repository(repository)
    version_dir = repository / "Identity" / "3"
    assert sorted(path.name for path in (repository / "Identity").iterdir()) == ["3", "config.pbtxt"]
    assert sorted(path.name for path in version_dir.iterdir()) == sorted(
        [
            "model.py",
            "_pytriton_stubside",
            _wire.PRIVATE_FILE,
        ]
    )
    proxy = pathlib.Path(_binding.__file__).parent
    assert (version_dir / "model.py").read_bytes() == (proxy / "_stub_model.py").read_bytes()
    sources = sorted((proxy / "stubside").glob("*.py"))
    assert "_wire.py" in [source.name for source in sources] and "_stub.py" in [source.name for source in sources]
    copied = version_dir / "_pytriton_stubside"
    assert sorted(path.name for path in copied.iterdir()) == [source.name for source in sources]  # no bytecode_dir
    for source in sources:
        assert (copied / source.name).read_bytes() == source.read_bytes()
        assert (copied / source.name).stat().st_mode & 0o777 == 0o600
    assert copied.stat().st_mode & 0o777 == 0o700 and (version_dir / "model.py").stat().st_mode & 0o777 == 0o600
    pbtxt = (repository / "Identity" / "config.pbtxt").read_text()
    assert 'name: "Identity"' in pbtxt and 'backend: "python"' in pbtxt
    assert 'name: "x"' in pbtxt and 'name: "y"' in pbtxt and "TYPE_FP32" in pbtxt
    assert 'string_value: "0"' in pbtxt
    private = json.loads((version_dir / _wire.PRIVATE_FILE).read_text())
    assert private == model._private
    assert private["metrics"] is False  # the context's switch (Triton sets it from TritonConfig.callable_metrics)

    # A reload (a dead stub replaced) rewrites the files with the next generation.
    model.generation = 2
    model.write_repository(repository, versions=[1, 3])
    pbtxt = (repository / "Identity" / "config.pbtxt").read_text()
    assert 'string_value: "2"' in pbtxt
    assert model.config.versions == [1, 3]
    model.write_repository(repository, versions=[3])  # one version: no explicit version policy
    assert model.config.versions is None

    model.remove_version_files(repository)
    assert not version_dir.exists() and (repository / "Identity" / "config.pbtxt").exists()
    model.remove_files(repository)
    assert not (repository / "Identity").exists()


def test_warmup_data_files_are_written_privately(context, tmp_path):
    data = tmp_path / "sample.npy"
    np.save(data, np.arange(4, dtype=np.float32))
    model = _model(
        context,
        inputs=[Tensor(name="x", shape=(4,), dtype=np.float32)],
        config=ModelConfig(
            model_warmup=[
                ModelWarmup(
                    name="w",
                    batch_size=1,
                    inputs={"x": WarmupInput(dtype=np.float32, shape=(4,), input_data_file=data)},
                )
            ]
        ),
    )
    repository = tmp_path / "repo"
    model.write_repository(repository)
    files = list((repository / "Identity" / "warmup").iterdir())
    assert len(files) == 1 and files[0].read_bytes() == np.arange(4, dtype=np.float32).tobytes()
    assert files[0].stat().st_mode & 0o777 == 0o600
    assert "model_warmup" in (repository / "Identity" / "config.pbtxt").read_text()


def test_incompatibility_between_versions(context):
    base = _model(context)
    assert base.incompatibility(_model(context, model_version=2, index=1)) is None
    other = _model(
        context,
        model_version=2,
        index=1,
        config=ModelConfig(max_batch_size=16),
        outputs=[Y[0], Tensor(name="z", shape=(1,), dtype=np.int8)],
    )
    assert base.incompatibility(other) == "its max_batch_size, output differ"


def _hello(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(path))
    channel = _wire.SocketChannel(sock)
    channel.send(_messages.Hello(os.getpid(), 0))
    return sock, channel, channel.recv()


def test_workers_serve_one_socket_per_slot_and_go_away(context):
    model = _model(context, infer_funcs=[identity, identity])
    assert not model.connected and not model.serving and not model.busy and model.last_active == 0.0
    model.start_workers()
    try:
        model.start_workers()  # idempotent: still two workers
        assert len(model._workers) == 2
        first, channel, welcome = _hello(model.endpoint_dir / "slot-0.sock")
        assert type(welcome) is _messages.Welcome
        assert model.connected and not model.serving  # one of two instances attached
        second, channel2, _ = _hello(model.endpoint_dir / "slot-1.sock")
        assert model.serving
        segment, metas = _tensors.write_tensors(None, [[("x", np.array([[1.5]], np.float32))]])
        channel2.send(_messages.Infer(segment, [_messages.Entry(metas[0])]))
        reply = channel2.recv()
        assert type(reply) is _messages.Ok, reply
        assert _tensors.read_tensor(None, reply.results[0][0], True).tolist() == [[1.5]]
        assert model.last_active > 0.0 and not model.retired_busy
        for sock, chan in ((first, channel), (second, channel2)):
            chan.send(_messages.BYE_MESSAGE)
            chan.recv()
            sock.close()
    finally:
        model.stop_workers()
    assert not model.endpoint_dir.exists()
    assert model._workers == []


def test_stubs_of_an_older_generation_are_retired(context):
    lost = []
    context.on_stub_lost = lambda *args: lost.append(args)
    model = _model(context)
    model.start_workers()
    try:
        sock, _, _ = _hello(model.endpoint_dir / "slot-0.sock")
        model.generation = 1
        assert model.retire_generation() == [os.getpid()]  # the pids of generation 0's stubs
        sock.close()
    finally:
        model.stop_workers()
    assert lost == []


def test_short_socket_dir(monkeypatch):
    runtime = pathlib.Path(tempfile.mkdtemp(prefix="ptr-", dir="/tmp"))  # a short $XDG_RUNTIME_DIR
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    token = secrets.token_hex(3)
    path = short_socket_dir(4242, token)
    assert path == runtime / f"pytriton-4242-{token}" and path.stat().st_mode & 0o777 == 0o700
    with pytest.raises(FileExistsError):  # never reuses a directory it did not create
        short_socket_dir(4242, token)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/" + "r" * 60)  # too long (or missing): /tmp
    path = short_socket_dir(4242, token)
    try:
        assert path == pathlib.Path("/tmp") / f"pytriton-4242-{token}"
    finally:
        path.rmdir()
        shutil.rmtree(runtime)


def test_process_instances_are_checked_at_bind_and_started_and_stopped_as_processes(context):
    with pytest.raises(PyTritonBadParameterError, match="instance_kind must be"):
        _model(context, instance_kind="fork")
    with pytest.raises(PyTritonBadParameterError, match="callable of instance 1 .* cannot be pickled"):
        _model(context, infer_funcs=[identity, lambda requests: requests], instance_kind="process")
    model = _model(context, infer_funcs=[identity, identity], instance_kind="process")
    model.start_workers()
    try:
        pids = [worker.pid for worker in model._workers]
        assert len(set(pids)) == 2 and os.getpid() not in pids and None not in pids
    finally:
        model.stop_workers()
    assert not model.endpoint_dir.exists()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
