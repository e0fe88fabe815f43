"""Backend instances (``instance_kind="backend"``): bind-time packing and the stub-side model, no server.

``pytriton/proxy/_backend_kind.py`` is driven directly (packing, the checks at ``bind``, the runner);
``pytriton/proxy/stubside/_inline.py`` is imported against the fake ``triton_python_backend_utils``
of tests/unit/test_stub.py and run through ``initialize``/``execute``/``finalize`` with a payload
written as ``bind`` writes it, and a fake worker that only answers the hello: every batch must be
answered without a single message to the worker. Both numpy paths of the stub run (the ``setup``
fixture of test_stub.py).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

from pytriton.decorators import batch
from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig
from pytriton.proxy import _backend_kind, _binding, _process, _stub_model
from pytriton.proxy.stubside import _messages, _wire
from tests.unit.test_stub import FINAL, FakeRequest, FakeSender, setup, stub  # noqa: F401 - fixtures

# -- callables (module level: they travel by pickle, by name) ------------------------------------


def identity(requests):
    return [{"y": request["x"]} for request in requests]


def with_pid(requests):
    return [{"y": request["x"], "pid": np.full((len(request["x"]), 1), os.getpid(), np.int64)} for request in requests]


@batch
def doubled(x):
    return {"y": x * 2}


def failing(requests):
    raise ValueError("bad value")


def wrong_dtype(requests):
    return [{"y": np.array([["text"]], dtype=object)} for _ in requests]


def counting(requests):
    (request,) = requests
    for step in range(int(request["x"].ravel()[0])):
        yield [{"y": np.array([[step]], np.float32)}]


def one_plain_result(requests):
    return [{"y": request["x"]} for request in requests]


def names_type(requests):
    return [
        {"y": np.array([[float(isinstance(request.requested_output_names, list))]], np.float32)} for request in requests
    ]


def generator_then_error(requests):
    yield [{"y": np.array([[1]], np.float32)}]
    raise RuntimeError("stream broke")


async def async_plus_one(requests):
    await asyncio.sleep(0)
    return [{"y": request["x"] + 1} for request in requests]


def asks_cancelled(requests):
    return [{"y": np.array([[float(request.is_cancelled())]], np.float32)} for request in requests]


class Unpicklable:
    def __init__(self):
        self.lock = threading.Lock()

    def __call__(self, requests):
        return identity(requests)


# -- helpers --------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_main_module(monkeypatch):
    """The stub side imports the user's main module (as ``__mp_main__``) and marks the process as a
    worker; in this test process neither may happen: the payloads carry no main module here, and the
    flag is restored."""
    real = _process.preparation_data

    def without_main(payloads=()):
        return {key: value for key, value in real(payloads).items() if not key.startswith("init_main_from_")}

    monkeypatch.setattr(_process, "preparation_data", without_main)
    monkeypatch.setattr(_process, "IN_WORKER_PROCESS", False)
    cwd = os.getcwd()
    yield
    os.chdir(cwd)


def _config(decoupled=False, outputs=("y",), batching=True):
    specs = [TensorSpec(name=name, shape=(-1,), dtype=np.int64 if name == "pid" else np.float32) for name in outputs]
    return TritonModelConfig(
        model_name="Unit",
        max_batch_size=8 if batching else 0,
        batching=batching,
        decoupled=decoupled,
        inputs=[TensorSpec(name="x", shape=(-1,), dtype=np.float32)],
        outputs=specs,
    )


@pytest.fixture()
def inline(stub):  # noqa: F811 - the fixture of test_stub.py
    """``stubside._inline`` imported against the fake utils (after ``_stub``), removed again after the test."""
    sys.modules.pop("pytriton.proxy.stubside._inline", None)
    module = importlib.import_module("pytriton.proxy.stubside._inline")
    try:
        yield module
    finally:
        sys.modules.pop("pytriton.proxy.stubside._inline", None)
        import pytriton.proxy.stubside

        if hasattr(pytriton.proxy.stubside, "_inline"):
            delattr(pytriton.proxy.stubside, "_inline")


def _model(setup, inline, func, *, decoupled=False, outputs=("y",), payload=None, **private):  # noqa: F811
    """An initialized inline model of slot 0 with ``func``, as ``bind`` and Triton would set it up."""
    version_dir = os.path.join(setup.root, "repo", "1")
    os.makedirs(version_dir, exist_ok=True)
    if payload is None:
        config = _config(decoupled, outputs)
        payload = _backend_kind.pack(
            [_process.dump_callable(func, "Unit", 0, "backend", _backend_kind.CallablePickler)], config, strict=False
        )
    with open(os.path.join(version_dir, _backend_kind.PAYLOAD_FILE), "wb") as file:
        file.write(payload)
    params = {
        "user_pid": os.getpid(),
        "endpoint_dir": setup.endpoint_dir,
        "slots": 1,
        "shm_prefix": setup.shm_prefix,
        "backend_shm_prefix": f"{setup.shm_prefix}-pb",
        "spin_us": 0,
        "max_request_bytes": 0,
        "execution_timeout_s": 0.0,
        "backend_path": list(sys.path),
    }
    params.update(private)
    with open(os.path.join(version_dir, _wire.PRIVATE_FILE), "w") as file:
        json.dump(params, file)
    model = inline.InlineModel()
    model.initialize(
        {
            "model_config": json.dumps(
                {
                    "name": "Unit",
                    "output": [{"name": name} for name in outputs],
                    "model_transaction_policy": {"decoupled": decoupled},
                }
            ),
            "model_repository": os.path.join(setup.root, "repo"),
            "model_version": "1",
            "model_name": "Unit",
        }
    )
    setup.models.append(model)
    return model


def _x(*values):
    """One request's ``x``: a batch of one row."""
    return {"x": np.array([values], np.float32)}


def _no_batch_reached(worker):
    """The worker got its hello and nothing else: the batch never left the stub."""
    (channel,) = [worker.channel()]
    channel.sock.settimeout(0.05)
    with pytest.raises(OSError):  # socket.timeout: nothing was sent after the hello
        channel.recv()
    assert len(worker.hellos) == 1


# -- bind side ------------------------------------------------------------------------------------


def test_backend_is_an_instance_kind():
    assert _process.check_instance_kind("backend", "Unit") == "backend"


def test_an_unpicklable_callable_fails_at_bind_naming_the_stub_and_the_fix():
    with pytest.raises(PyTritonBadParameterError, match="instance_kind='backend'.*server's stub process.*module level"):
        _process.dump_callable(Unpicklable(), "Unit", 0, "backend", _backend_kind.CallablePickler)
    with pytest.raises(PyTritonBadParameterError, match="instance_kind='backend'"):
        _process.dump_callable(lambda requests: requests, "Unit", 0, "backend", _backend_kind.CallablePickler)


def test_what_a_backend_model_cannot_do_is_refused_with_the_alternative():
    with pytest.raises(PyTritonBadParameterError, match="execution_timeout_s.*instance_kind='thread' or 'process'"):
        _backend_kind.check_backend_binding("Unit", tcp=False, execution_timeout_s=1.0)
    with pytest.raises(PyTritonBadParameterError, match="transport='tcp'"):
        _backend_kind.check_backend_binding("Unit", tcp=True, execution_timeout_s=None)
    _backend_kind.check_backend_binding("Unit", tcp=False, execution_timeout_s=None)


def test_bind_writes_the_payload_and_the_users_path_and_the_shim_picks_the_inline_model(tmp_path):
    context = _binding.BindingContext(
        user_pid=os.getpid(), shm_prefix="pytriton-unit", socket_dir=tmp_path / "s", on_unrecoverable=lambda exc: None
    )
    from pytriton.model_config import ModelConfig, Tensor

    bound = _binding.BoundModel(
        index=0,
        model_name="Unit",
        model_version=1,
        infer_funcs=[identity, doubled],
        inputs=[Tensor(name="x", shape=(-1,), dtype=np.float32)],
        outputs=[Tensor(name="y", shape=(-1,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=8),
        strict=True,
        context=context,
        instance_kind="backend",
    )
    bound.write_repository(tmp_path / "repo")
    version_dir = tmp_path / "repo" / "Unit" / "1"
    payload = version_dir / _backend_kind.PAYLOAD_FILE
    assert payload.stat().st_mode & 0o777 == 0o600
    private = json.loads((version_dir / _wire.PRIVATE_FILE).read_text())
    assert os.getcwd() in private["backend_path"]
    runner = _backend_kind.InlineRunner.load(payload.read_bytes(), 1)
    assert runner.func is doubled and runner.config.instance_count == 2 and runner.checker._strict
    assert "BACKEND_PAYLOAD" in dir(_stub_model) and _stub_model.BACKEND_PAYLOAD == _backend_kind.PAYLOAD_FILE
    # Bound again as a thread model under the same directory: the payload goes, model.py proxies again.
    bound.instance_kind = "thread"
    bound.write_repository(tmp_path / "repo")
    assert not payload.exists()


def test_the_runner_attaches_the_model_config_for_decorators():
    config = _config()
    data = _backend_kind.pack(
        [_process.dump_callable(doubled, "Unit", 0, "backend", _backend_kind.CallablePickler)], config, strict=False
    )
    runner = _backend_kind.InlineRunner.load(data, 0)
    requests = [runner.request(_x(1, 2), None, None), runner.request(_x(3, 4), None, None)]
    result = runner.call(requests)
    groups = runner.outputs(result, 2)
    np.testing.assert_array_equal(groups[1][0][1], np.array([[6, 8]], np.float32))


def test_the_payload_carries_where_spans_are_exported(monkeypatch):
    """A stub of an unconfigured process exports the instance's spans where the user's process would."""
    from pytriton.proxy import _tracing

    monkeypatch.setattr(_tracing.State, "export_url", None)
    monkeypatch.setattr(_tracing.State, "export_resource", {})
    config = _config()
    untraced = _backend_kind.pack(
        [_process.dump_callable(doubled, "Unit", 0, "backend", _backend_kind.CallablePickler)], config, strict=False
    )
    _tracing.configure_export(["mode=opentelemetry", "opentelemetry,url=http://collector:4318/v1/traces",
                               "opentelemetry,resource=service.name=scorer"])  # fmt: skip
    traced = _backend_kind.pack(
        [_process.dump_callable(doubled, "Unit", 0, "backend", _backend_kind.CallablePickler)], config, strict=False
    )
    monkeypatch.setattr(_tracing.State, "export_url", None)  # the stub: a fresh process
    monkeypatch.setattr(_tracing.State, "export_resource", {})
    _backend_kind.InlineRunner.load(untraced, 0)
    assert _tracing.State.export_url is None
    _backend_kind.InlineRunner.load(traced, 0)
    assert _tracing.State.export_url == "http://collector:4318/v1/traces"
    assert _tracing.State.export_resource == {"service.name": "scorer"}


# -- stub side ------------------------------------------------------------------------------------


def test_a_batch_runs_in_the_stub_with_no_message_to_the_worker(setup, inline):  # noqa: F811
    worker = setup.worker()
    model = _model(setup, inline, with_pid, outputs=("y", "pid"))
    requests = [FakeRequest(_x(1, 2)), FakeRequest(_x(3), requested=["y"])]
    responses = model.execute(requests)
    np.testing.assert_array_equal(responses[0].outputs()["y"], [[1, 2]])
    assert responses[0].outputs()["pid"][0, 0] == os.getpid()  # ran in this (the stub's) process
    assert set(responses[1].outputs()) == {"y"}  # only the requested output
    _no_batch_reached(worker)


def test_decorators_async_and_cancellation_reach_the_callable(setup, inline):  # noqa: F811
    setup.worker()
    model = _model(setup, inline, doubled)
    np.testing.assert_array_equal(model.execute([FakeRequest(_x(1, 2))])[0].outputs()["y"], [[2, 4]])
    setup.finalize(model)
    model = _model(setup, inline, async_plus_one)
    np.testing.assert_array_equal(model.execute([FakeRequest(_x(1))])[0].outputs()["y"], [[2]])
    setup.finalize(model)
    model = _model(setup, inline, asks_cancelled)
    cancelled = FakeRequest(_x(1))
    cancelled.cancelled = True
    responses = model.execute([FakeRequest(_x(1)), cancelled])
    assert [response.outputs()["y"][0, 0] for response in responses] == [0.0, 1.0]


def test_an_error_of_the_callable_fails_the_batch_with_its_type_and_message(setup, inline, caplog):  # noqa: F811
    setup.worker()
    model = _model(setup, inline, failing)
    responses = model.execute([FakeRequest(_x(1)), FakeRequest(_x(2))])
    assert [response.error.message() for response in responses] == ["ValueError: bad value"] * 2
    assert "Traceback" in caplog.text  # logged with the traceback; the client gets none
    # The instance keeps serving.
    assert model.execute([FakeRequest(_x(1))])[0].error is not None


def test_outputs_are_checked_as_for_the_other_kinds(setup, inline):  # noqa: F811
    setup.worker()
    model = _model(setup, inline, wrong_dtype)
    (response,) = model.execute([FakeRequest(_x(1))])
    assert "PyTritonRuntimeError" in response.error.message() and "'y'" in response.error.message()


def test_a_generator_streams_each_result_then_the_final_flag(setup, inline):  # noqa: F811
    setup.worker()
    model = _model(setup, inline, counting, decoupled=True)
    sender = FakeSender()
    assert model.execute([FakeRequest(_x(3), sender=sender)]) is None
    assert [response.outputs()["y"][0, 0] for response in sender.responses] == [0, 1, 2]
    assert sender.sent[-1] == (None, FINAL)


def test_a_decoupled_callable_may_return_one_plain_result_without_an_error_log(setup, inline, caplog):  # noqa: F811
    setup.worker()
    model = _model(setup, inline, one_plain_result, decoupled=True)
    sender = FakeSender()
    assert model.execute([FakeRequest(_x(7), sender=sender)]) is None
    assert [response.outputs()["y"][0, 0] for response in sender.responses] == [7]
    assert sender.sent[-1] == (None, FINAL)
    assert "closing the generator failed" not in caplog.text  # a list iterator has nothing to close


def test_requested_output_names_reach_the_callable_as_a_list(setup, inline):  # noqa: F811
    setup.worker()
    model = _model(setup, inline, names_type, outputs=("y", "pid"))
    # Triton gives a set (tests/unit/test_stub.py); the thread and process kinds see a list.
    (response,) = model.execute([FakeRequest(_x(1), requested={"y"})])
    assert response.outputs()["y"][0, 0] == 1.0


def test_a_stream_that_fails_ends_with_the_error_and_the_final_flag(setup, inline):  # noqa: F811
    setup.worker()
    model = _model(setup, inline, generator_then_error, decoupled=True)
    sender = FakeSender()
    model.execute([FakeRequest(_x(1), sender=sender)])
    assert sender.responses[-1].error.message() == "RuntimeError: stream broke"
    assert sender.sent[-1] == (None, FINAL)


def test_a_stream_whose_client_cancelled_is_closed(setup, inline):  # noqa: F811
    setup.worker()
    model = _model(setup, inline, counting, decoupled=True)
    sender = FakeSender(cancelled=True)
    model.execute([FakeRequest(_x(1000), sender=sender)])
    assert len(sender.responses) == _messages.STREAM_WINDOW  # stopped at the first check
    assert sender.sent[-1] == (None, FINAL)


def test_a_generator_of_a_model_that_is_not_decoupled_fails(setup, inline):  # noqa: F811
    setup.worker()
    model = _model(setup, inline, counting)
    (response,) = model.execute([FakeRequest(_x(2))])
    assert "not decoupled" in response.error.message()


def test_a_callable_the_stub_cannot_load_fails_initialize_with_the_reason(setup, inline):  # noqa: F811
    setup.worker()
    config = _config()
    payload = _backend_kind.pack([b"not a pickle"], config, strict=False)
    with pytest.raises(Exception, match="could not load its callable.*instance_kind='backend'"):
        _model(setup, inline, None, payload=payload)


def test_requests_over_the_size_limit_fail_alone(setup, inline):  # noqa: F811
    setup.worker()
    model = _model(setup, inline, identity, max_request_bytes=16)
    small, large = model.execute([FakeRequest(_x(1)), FakeRequest({"x": np.zeros((1, 64), np.float32)})])
    np.testing.assert_array_equal(small.outputs()["y"], [[1]])
    assert "limit" in large.error.message()


def _answers(responses):
    """What clients get from a list of responses: outputs, or the error text."""
    return [
        ("error", response.error.message())
        if response.error is not None
        else {name: (str(array.dtype), array.tolist()) for name, array in response.outputs().items()}
        for response in responses
    ]


def _batches():
    """Batches that exercise the short path's branches (a fresh list of requests per call)."""
    return [
        [FakeRequest(_x(1, 2))],
        [FakeRequest(_x(1), parameters={"p": 1}), FakeRequest(_x(2), timeout_us=5_000_000)],
        [FakeRequest(_x(3), requested=["y"]), FakeRequest({"x": np.zeros((1, 64), np.float32)})],  # 2nd: over 64 B
    ]


@pytest.mark.parametrize("func", [with_pid, failing, wrong_dtype, doubled], ids=lambda f: f.__name__)
def test_the_short_path_answers_as_the_general_path_does(setup, inline, func):  # noqa: F811
    """The common case's one-function path (``_execute_short``) against the path every model can take."""
    setup.worker()
    outputs = ("y", "pid") if func is with_pid else ("y",)
    model = _model(setup, inline, func, outputs=outputs, max_request_bytes=64)
    assert model._short
    for index in range(len(_batches())):
        short = _answers(model._execute_short(_batches()[index]))
        general = _answers(model._counted(_batches()[index]))
        assert short == general


# Results that take each branch of the short path's inline test for a model with one output.
_ONE_OUTPUT_RESULTS = {
    "exact": lambda x: [{"y": x}],
    "float16, converted": lambda x: [{"y": x.astype(np.float16)}],
    "float64, refused": lambda x: [{"y": x.astype(np.float64)}],
    "a list, not an array": lambda x: [{"y": x.tolist()}],
    "a numpy scalar": lambda x: [{"y": np.float32(1)}],
    "one axis too many": lambda x: [{"y": x[..., None]}],
    "three columns": lambda x: [{"y": np.ones((1, 3), np.float32)}],
    "a transposed view": lambda x: [{"y": np.ones((2, 1), np.float32).T}],
    "an undeclared extra output": lambda x: [{"y": x, "z": x}],
    "no output": lambda x: [{}],
    "a tuple of results": lambda x: ({"y": x},),
    "no result": lambda x: [],
    "not a dict": lambda x: [x],
}


def one_output(requests):
    """Returns what ``_ONE_OUTPUT_RESULTS`` names in the request's parameter ``case``."""
    (request,) = requests
    return _ONE_OUTPUT_RESULTS[request.parameters["case"]](request["x"])


@pytest.mark.parametrize("shape", [(-1,), (2,)], ids=["any size", "fixed"])
@pytest.mark.parametrize("case", list(_ONE_OUTPUT_RESULTS))
def test_the_short_paths_inline_output_test_answers_as_the_checks_do(setup, inline, shape, case):  # noqa: F811
    """One declared output: the short path tests the result inline; whatever it lets through must
    be what ``OutputChecker.check`` accepts unchanged, and it hands the rest to ``check``."""
    setup.worker()
    config = _config()
    config.outputs[0] = TensorSpec(name="y", shape=shape, dtype=np.float32)
    payload = _backend_kind.pack(
        [_process.dump_callable(one_output, "Unit", 0, "backend", _backend_kind.CallablePickler)], config, strict=False
    )
    model = _model(setup, inline, one_output, payload=payload)
    assert model._short and model._one is not None  # numpy 2 too: its outputs go through DLPack there

    def batch():
        return [FakeRequest({"x": np.array([[1.0, 2.0]], np.float32)}, parameters={"case": case})]

    assert _answers(model._execute_short(batch())) == _answers(model._counted(batch()))


def test_the_short_path_hands_unusual_batches_to_the_general_path(setup, inline, monkeypatch):  # noqa: F811
    setup.worker()
    model = _model(setup, inline, identity, max_request_bytes=16)
    calls = []
    general = model._counted
    monkeypatch.setattr(model, "_counted", lambda requests: calls.append(len(requests)) or general(requests))
    # An input over the limit: the whole batch goes to the general path, which answers that one alone.
    small, large = model.execute([FakeRequest(_x(1)), FakeRequest({"x": np.zeros((1, 64), np.float32)})])
    np.testing.assert_array_equal(small.outputs()["y"], [[1]])
    assert "limit" in large.error.message() and calls == [2]
    # A request Triton cannot give the inputs of: the general path names the problem.
    broken = FakeRequest(_x(1))
    broken.inputs = lambda: (_ for _ in ()).throw(RuntimeError("tensor gone"))
    (response,) = model.execute([broken])
    assert "could not read the request" in response.error.message() and "tensor gone" in response.error.message()
    assert calls == [2, 1]
    # An ordinary batch stays on the short path.
    np.testing.assert_array_equal(model.execute([FakeRequest(_x(5))])[0].outputs()["y"], [[5]])
    assert calls == [2, 1]


def test_a_response_that_cannot_be_built_fails_the_batch_on_both_paths(setup, inline, monkeypatch):  # noqa: F811
    import triton_python_backend_utils as pb_utils

    setup.worker()
    model = _model(setup, inline, identity)
    real = pb_utils.Tensor

    class Refusing:  # pb_utils.Tensor refusing the array (both ways a tensor is made: numpy 1.x and DLPack)
        def __init__(self, name, array):
            raise ValueError("tensor refused")

        @staticmethod
        def from_dlpack(name, array):
            raise ValueError("tensor refused")

    monkeypatch.setattr(pb_utils, "Tensor", Refusing)
    for path in (model._execute_short, model._counted):
        (response,) = path([FakeRequest(_x(1))])
        assert response.error.message() == "ValueError: tensor refused"
    monkeypatch.setattr(pb_utils, "Tensor", real)
    np.testing.assert_array_equal(model.execute([FakeRequest(_x(2))])[0].outputs()["y"], [[2]])


def test_only_the_common_case_takes_the_short_path(setup, inline):  # noqa: F811
    setup.worker()
    assert _model(setup, inline, identity)._short
    assert not _model(setup, inline, counting, decoupled=True)._short


def test_the_short_path_counts_the_metrics_the_general_path_counts(setup, inline):  # noqa: F811
    import triton_python_backend_utils as pb_utils

    from pytriton.proxy.stubside import _stub_metrics

    setup.worker()
    model = _model(setup, inline, identity)
    counts = {}
    for path in ("_execute_short", "_counted"):
        for func in (identity, failing):
            model._runner.func = func  # one model: a new one would wait for the slot the last one held
            metrics = _stub_metrics.StubMetrics(pb_utils, model="Unit", version="1", instance=0, max_batch_size=8)
            model._metrics = metrics
            getattr(model, path)([FakeRequest(_x(1)), FakeRequest(_x(2))])
            getattr(model, path)([FakeRequest(_x(3))])
            metrics.counted()  # what the flusher does before each push (the short path only appends)
            totals = metrics.totals()
            counts[path, func.__name__] = (
                totals.size_counts,
                totals.size_sum,
                sum(totals.duration_counts),
                totals.errors,
                metrics.in_flight,
            )
    model._metrics = _stub_metrics.NULL
    assert counts["_execute_short", "identity"] == counts["_counted", "identity"] == ([1, 1, 0, 0, 0], 3, 2, 0, 0)
    assert counts["_execute_short", "failing"] == counts["_counted", "failing"] == ([1, 1, 0, 0, 0], 3, 2, 2, 0)


def test_numpy_scalar_types_travel_by_dtype_code_not_by_name():
    """numpy 2 pickles ``np.bool_`` as ``numpy.bool``, which the stub's numpy 1.x lacks."""
    import pickle
    import pickletools

    config = _config()
    config.outputs.append(TensorSpec(name="flag", shape=(1,), dtype=np.bool_))
    data = _backend_kind.pack(
        [_process.dump_callable(np.bool_, "Unit", 0, "backend", _backend_kind.CallablePickler)], config, strict=False
    )
    names = [arg for op, arg, _ in pickletools.genops(data) if op.name in ("SHORT_BINUNICODE", "BINUNICODE")]
    assert "bool" not in names and "float32" not in names
    payload = pickle.loads(data)
    assert payload["config"].outputs[-1].dtype is np.bool_ and payload["config"].inputs[0].dtype is np.float32
    assert pickle.loads(payload["callables"][0]) is np.bool_


# -- the status page (stubside/_backend_page.py) ---------------------------------------------------

PAGE_VIEW: list = []  # (page, slot) the busy_probe callable reads


def busy_probe(requests):
    page, slot = PAGE_VIEW[0]
    return [{"y": np.array([[float(page.busy(slot))]], np.float32)} for _ in requests]


def test_the_page_carries_busy_last_active_and_the_drain_budget(tmp_path):
    from pytriton.proxy.stubside._backend_page import Page

    owner = Page.create(str(tmp_path / "backend.page"), 2)
    peer = Page.open(str(tmp_path / "backend.page"), 2)
    assert Page.open(str(tmp_path / "missing"), 2) is None and Page.open(str(tmp_path / "backend.page"), 9) is None
    try:
        assert not owner.busy(1) and owner.last_active(1) == 0.0
        peer.enter(1)
        assert owner.busy(1) and not owner.busy(0)
        peer.leave(1)
        assert not owner.busy(1) and owner.last_active(1) > 0.0
        assert not peer.draining()
        owner.refuse(2)
        owner.refuse(50)  # the first call decides
        assert peer.draining()
        assert peer.admit(1) and peer.admit(4)  # a batch that straddles the end runs whole
        assert not peer.admit(1)
    finally:
        peer.close()
        owner.close()


def test_the_stub_marks_its_batches_and_refuses_once_the_drain_budget_is_spent(setup, inline):  # noqa: F811
    from pytriton.proxy.stubside._backend_page import PAGE_NAME, Page

    setup.worker()
    owner = Page.create(os.path.join(setup.endpoint_dir, PAGE_NAME), 1)
    PAGE_VIEW[:] = [(owner, 0)]
    try:
        model = _model(setup, inline, busy_probe)
        (response,) = model.execute([FakeRequest(_x(1))])
        assert response.outputs()["y"][0, 0] == 1.0  # busy while the callable ran
        assert not owner.busy(0) and owner.last_active(0) > 0.0
        owner.refuse(1)  # Triton had one request queued when the drain began
        assert model.execute([FakeRequest(_x(1))])[0].error is None
        refused = model.execute([FakeRequest(_x(1)), FakeRequest(_x(2))])
        assert [r.error.message() for r in refused] == [_messages.UNAVAILABLE_TEXT] * 2
        setup.finalize(model)
    finally:
        PAGE_VIEW.clear()
        owner.close()


def _instance(page, tmp_path, on_unrecoverable=lambda exc: None):
    """The user's side of slot 0 of a backend model whose status page is ``page`` (not started)."""
    return _backend_kind.BackendInstance(
        page=page,
        slot=0,
        path=str(tmp_path / "slot-0.sock"),
        config=_config(),
        strict=False,
        shm_prefix="pytriton-unit-backend",
        on_unrecoverable=on_unrecoverable,
        name="Unit-0",
    )


def test_a_backend_instance_reads_busy_and_last_active_from_the_page_and_drains_through_it(tmp_path):
    from pytriton.proxy._admission import Admission
    from pytriton.proxy.stubside._backend_page import Page

    owner = Page.create(str(tmp_path / "backend.page"), 1)
    peer = Page.open(str(tmp_path / "backend.page"), 1)
    worker = _instance(owner, tmp_path)
    try:
        peer.enter(0)
        assert not worker.busy  # no peer attached: a flag left by a dead peer does not count
        assert worker.last_active == 0.0  # when the last batch finished: none has yet
        peer.leave(0)
        assert worker.last_active > 0.0
        ints, floats, item = peer.views(0)  # what the short path writes inline (_inline.py)
        ints[item] = 1
        floats[item + 1] = 12.5
        assert owner.busy(0) and worker.last_active == 12.5
        worker.admission = Admission(3)
        assert peer.draining() and worker.admission is not None
    finally:
        peer.close()
        owner.close()


def doomed(requests):
    from pytriton.exceptions import PyTritonUnrecoverableError

    raise PyTritonUnrecoverableError("the GPU caught fire")


def test_an_unrecoverable_error_reaches_the_page_and_the_instance_calls_back(setup, inline, tmp_path):  # noqa: F811
    from pytriton.exceptions import PyTritonUnrecoverableError
    from pytriton.proxy.stubside._backend_page import PAGE_NAME, Page

    setup.worker()
    owner = Page.create(os.path.join(setup.endpoint_dir, PAGE_NAME), 1)
    reported = []
    worker = _instance(owner, tmp_path, reported.append)
    worker.start()
    try:
        assert owner.unrecoverable() is None
        model = _model(setup, inline, doomed)
        (response,) = model.execute([FakeRequest(_x(1))])
        assert response.error.message() == "PyTritonUnrecoverableError: the GPU caught fire"
        assert owner.unrecoverable() == "PyTritonUnrecoverableError: the GPU caught fire"
        deadline = time.monotonic() + 10
        while not reported and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(reported) == 1 and isinstance(reported[0], PyTritonUnrecoverableError)
        setup.finalize(model)
    finally:
        worker.stop()
        owner.close()


def test_read_only_inputs_are_copied_so_the_callable_may_change_them(inline):
    """Under numpy 2 the stub's inputs come through DLPack, which numpy may import read-only."""
    read_only = np.arange(4, dtype=np.float32)
    read_only.flags.writeable = False
    copied = inline._writable(read_only)
    assert copied.flags.writeable and copied is not read_only
    np.testing.assert_array_equal(copied, read_only)
    writable = np.arange(4, dtype=np.float32)
    assert inline._writable(writable) is writable  # no copy where none is needed
    assert inline._input_array(read_only).flags.writeable


# -- the unresponsive-model watch's signal (issue 42 item 4) -----------------------------------------


def sleeps_x_seconds(requests):
    """Sleeps the first value of ``x`` seconds, in short sleeps as a polling callable does; echoes ``x``.

    With a second value, sends itself the watch's signal once it has run that long (as the watch
    would, seeing it stuck): the signal comes inside the call whatever the host's load, where a timer
    started beside the call could fire before the call began or, for a young call, after it had aged.
    """
    started = time.monotonic()
    length, signal_at = float(requests[0]["x"].flat[0]), requests[0]["x"].flat[1:]
    sent = not len(signal_at)
    while time.monotonic() < started + length:
        if not sent and time.monotonic() - started >= float(signal_at[0]):
            sent = True
            os.kill(os.getpid(), _messages.STUCK_SIGNAL)  # handled here, on the main thread, at once
        time.sleep(0.01)
    return [{"y": request["x"]} for request in requests]


def test_the_watchs_signal_fails_a_stuck_call_retryably_and_spares_a_young_one(setup, inline, monkeypatch):  # noqa: F811
    # Before: the watch killed a backend instance's stub, and its batch got Triton's 500.
    setup.worker()
    previous = signal.getsignal(_messages.STUCK_SIGNAL)
    try:
        model = _model(setup, inline, sleeps_x_seconds)  # installs the handler: this test runs on the main thread
        assert signal.getsignal(_messages.STUCK_SIGNAL) == model._on_stuck_signal
        model._on_stuck_signal(_messages.STUCK_SIGNAL, None)  # no call in progress: nothing happens
        for path in ("short", "general"):
            if path == "general":  # the path of sequence, decoupled, traced or BYTES models
                model.execute = lambda requests: model._gated(requests, model._execute_general)
            stuck_at = 2 * _messages.STUCK_MIN_AGE_S  # older than that when signalled: stuck
            began = time.monotonic()
            responses = model.execute([FakeRequest(_x(5.0, stuck_at)), FakeRequest(_x(5.0, stuck_at))])
            assert time.monotonic() - began < 4.0  # failed, not waited for
            assert [r.error.message() for r in responses] == [_messages.STUCK_TEXT] * 2, path
            # A call younger than STUCK_MIN_AGE_S is not the one the watch saw: it runs to its end. The
            # call signals itself as it begins; the bound is raised so it is still young at the signal
            # however long a loaded host paused it.
            with monkeypatch.context() as young:
                young.setattr(_messages, "STUCK_MIN_AGE_S", 60.0)
                (response,) = model.execute([FakeRequest(_x(0.3, 0.0))])
            assert response.error is None and response.outputs()["y"][0, 0] == np.float32(0.3), path
        setup.finalize(model)
    finally:
        signal.signal(_messages.STUCK_SIGNAL, previous)


def test_a_stuck_backend_call_that_ignores_the_signal_is_ended_with_its_stub(tmp_path, monkeypatch):
    from pytriton.proxy.stubside._backend_page import Page

    page = Page.create(str(tmp_path / "backend.page"), 1)
    sent = []
    monkeypatch.setattr(_backend_kind, "STUCK_GRACE_S", 0.05)
    monkeypatch.setattr(_backend_kind.os, "kill", lambda pid, number: sent.append((pid, number)))
    # The kill itself happens outside the backend's locks (native.kill_outside_robust_locks, its own tests).
    monkeypatch.setattr(
        _backend_kind.native, "kill_outside_robust_locks", lambda pid: sent.append((pid, signal.SIGKILL)) or "free"
    )
    monkeypatch.setattr(_backend_kind.BackendInstance, "busy", property(lambda self: page.busy(0)))
    monkeypatch.setattr(_backend_kind.BackendInstance, "_stub_pids", lambda self: [4242])
    instance = _instance(page, tmp_path)
    try:
        assert not instance.fail_stuck_call(_messages.STUCK_TEXT)  # nothing in a call
        page.enter(0)
        assert instance.fail_stuck_call(_messages.STUCK_TEXT)
        assert wait_until(lambda: len(sent) == 2)  # the call went on: the stub is killed after the grace
        assert sent == [(4242, _messages.STUCK_SIGNAL), (4242, signal.SIGKILL)]
        sent.clear()
        monkeypatch.setattr(_backend_kind, "STUCK_GRACE_S", 0.3)
        assert instance.fail_stuck_call(_messages.STUCK_TEXT)
        page.leave(0)  # the signal failed the call: the stub serves on
        time.sleep(0.6)
        assert sent == [(4242, _messages.STUCK_SIGNAL)]
    finally:
        page.close()


def wait_until(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()
