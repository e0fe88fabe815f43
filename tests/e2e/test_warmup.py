"""Model warmup (issue 15, item 2): Triton runs it through the proxy before the model is ready.

The warmups run on thread and on backend instances (tests/e2e/_kinds.py); the callables, in
tests/e2e/kind_models.py, note their calls in files. A failing warmup at ``run()`` is tested on
thread instances only: it needs a server of its own.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.http as httpclient

from pytriton.client import ModelClient
from pytriton.decorators import batch
from pytriton.exceptions import PyTritonModelConfigError
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.model_config.common import ModelWarmup, WarmupInput
from pytriton.triton import Triton, TritonConfig, TritonLifecyclePolicy
from tests.conftest import triton_ports, wait_for
from tests.e2e._kinds import KINDS, model
from tests.e2e.kind_models import EchoRecorder, Recorder, recorded, refuses

INPUTS = [
    Tensor(name="x", shape=(3,), dtype=np.float32),
    Tensor(name="label", shape=(1,), dtype=object),
    Tensor(name="scale", shape=(1,), dtype=np.float32, optional=True),
]
OUTPUTS = [Tensor(name="y", shape=(3,), dtype=np.float32)]


def _warmups(data_file):
    return [
        ModelWarmup(
            name="zeros",
            batch_size=3,
            inputs={
                "x": WarmupInput(np.float32, (3,), zero_data=True),
                "label": WarmupInput(bytes, (1,), zero_data=True),
            },
            count=2,
        ),
        ModelWarmup(
            name="random",
            batch_size=1,
            inputs={
                "x": WarmupInput(np.float32, (3,), random_data=True),
                "label": WarmupInput(object, (1,), random_data=True),
                "scale": WarmupInput(np.float32, (1,), zero_data=True),
            },
        ),
        ModelWarmup(
            name="file",
            batch_size=1,
            inputs={
                "x": WarmupInput(np.float32, (3,), input_data_file=str(data_file)),
                "label": WarmupInput(bytes, (1,), zero_data=True),
            },
        ),
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_file = tmp_path_factory.mktemp("warmup") / "x.npy"
    np.save(data_file, np.array([1.0, 2.0, 3.0]))
    notes = {kind: tmp_path_factory.mktemp(f"warm-{kind}") for kind in KINDS}  # what each kind's Recorder saw
    with Triton(config=TritonConfig(**triton_ports())) as triton:
        config = ModelConfig(
            max_batch_size=4,
            batcher=DynamicBatcher(preferred_batch_size=[4]),
            model_warmup=_warmups(data_file),
        )
        for kind in KINDS:  # the model on each instance kind (tests/e2e/_kinds.py)
            recorder = Recorder(triton.http_url, model("Warm", kind), str(notes[kind]))
            triton.bind(model("Warm", kind), recorder, INPUTS, OUTPUTS, config=config, instance_kind=kind)
        triton.run()
        yield triton, notes


@pytest.fixture
def warm(server, kind):
    """The server, and the directory where the Recorder of model ``Warm`` on instance ``kind`` notes its calls."""
    triton, notes = server
    return triton, notes[kind]


def test_warmup_runs_through_the_decorators_before_ready(warm, kind):
    triton, notes = warm
    assert triton.get_access_token()  # management endpoints restricted (the default)
    warmup_calls = recorded(notes)
    assert len(warmup_calls) == 4  # zeros twice, random once, file once
    assert not any(call["ready"] for call in warmup_calls)
    # Nor is the server ready (a load balancer's probe) while a model still warms up.
    assert [call["server_ready"] for call in warmup_calls] == [False] * 4
    zeros, _, random_call, from_file = warmup_calls
    # @pad_batch padded 3 to the preferred 4; @fill_optionals gave the absent scale; @first_value took it.
    assert np.shape(zeros["x"]) == (4, 3) and not np.any(zeros["x"])
    assert zeros["label"] == [[""]] * 4 and zeros["scale"] == 2.0
    assert np.shape(random_call["x"]) == (4, 3) and random_call["scale"] == 0.0
    np.testing.assert_array_equal(from_file["x"][0], [1.0, 2.0, 3.0])
    data_files = list((triton._repository / model("Warm", kind) / "warmup").iterdir())
    assert data_files and all(path.stat().st_mode & 0o777 == 0o600 for path in data_files)


def test_model_serves_after_warmup(warm, kind):
    triton, notes = warm
    before = len(recorded(notes))
    with ModelClient(triton.http_url, model("Warm", kind)) as client:
        result = client.infer_sample(x=np.ones(3, np.float32), label=np.array([b"a"]))
    np.testing.assert_array_equal(result["y"], [2.0, 2.0, 2.0])
    calls = recorded(notes)
    assert len(calls) == before + 1 and calls[-1]["ready"]


# -- warmups Triton cannot express, accepted as NVIDIA PyTriton 0.7 accepts them --------------------
# (Before the tests whose failing warmup may crash Triton 2.51: a bind while pytriton restarts the
# server is a different story.)
PAIR_INPUTS = [Tensor(name="a", shape=(-1,), dtype=np.int64), Tensor(name="b", shape=(-1,), dtype=np.int64)]
PAIR_OUTPUTS = [Tensor(name="a_out", shape=(-1,), dtype=np.int64), Tensor(name="b_out", shape=(-1,), dtype=np.int64)]


def test_warmup_for_some_inputs_and_a_whole_batch_file_reach_the_callable(server, kind, tmp_path):
    triton, _ = server
    positions = np.arange(15, dtype=np.int64).reshape(3, 5)
    np.save(tmp_path / "positions.npy", positions)
    notes = tmp_path / "calls"
    notes.mkdir()
    warmups = [
        ModelWarmup("only_a", 2, {"a": WarmupInput(np.int64, (4,), zero_data=True)}),
        ModelWarmup(
            "whole_batch",
            3,
            {
                "a": WarmupInput(np.int64, (5,), input_data_file=tmp_path / "positions.npy"),
                "b": WarmupInput(np.int64, (2,), random_data=True),
            },
        ),
    ]
    name = model("Partial", kind)
    config = ModelConfig(max_batch_size=4, model_warmup=warmups)
    triton.bind(name, batch(EchoRecorder(str(notes))), PAIR_INPUTS, PAIR_OUTPUTS, config=config, instance_kind=kind)
    calls = recorded(notes)
    assert [sorted(call) for call in calls] == [["a"], ["a", "b"]]
    assert np.shape(calls[0]["a"]) == (2, 4) and not np.any(calls[0]["a"])
    np.testing.assert_array_equal(calls[1]["a"], positions)
    assert np.shape(calls[1]["b"]) == (3, 2)
    with ModelClient(triton.grpc_url, name) as client:
        result = client.infer_sample(a=np.arange(2), b=np.arange(3))
    np.testing.assert_array_equal(result["b_out"], [0, 1, 2])


def test_failing_warmup_pytriton_sends_is_reported_and_not_served(server, kind):
    triton, _ = server
    warmups = [ModelWarmup("partial", 1, {"a": WarmupInput(np.int64, (2,), zero_data=True)})]
    config = ModelConfig(max_batch_size=4, model_warmup=warmups)
    name = model("PartialCold", kind)
    with pytest.raises(PyTritonModelConfigError, match="warmup 'partial' failed in the callable: ValueError: cannot"):
        triton.bind(name, refuses, PAIR_INPUTS, PAIR_OUTPUTS, config=config, instance_kind=kind)
    client = httpclient.InferenceServerClient(triton.http_url[len("http://") :])
    try:
        assert not client.is_model_ready(name)
    finally:
        client.close()


FAILED_WARMUP = "warmup sample 'smoke'.*weights missing|died while loading it.*warmup fails"


def _zeros_warmup():
    return [
        ModelWarmup(
            name="smoke",
            batch_size=1,
            inputs={
                "x": WarmupInput(np.float32, (3,), zero_data=True),
                "label": WarmupInput(bytes, (1,), zero_data=True),
            },
        )
    ]


def test_failing_warmup_on_a_live_bind_is_reported_and_not_served(server, kind):
    triton, _ = server
    name = model("Cold", kind)
    # Triton 2.51 reports the warmup's error, or (about one load in ten here) crashes on the failed
    # instance; pytriton then says so and restarts the server with the models that loaded.
    with pytest.raises(PyTritonModelConfigError, match=FAILED_WARMUP):
        triton.bind(
            name, refuses, INPUTS, OUTPUTS, config=ModelConfig(model_warmup=_zeros_warmup()), instance_kind=kind
        )
    assert wait_for(triton.is_alive, 60)
    client = httpclient.InferenceServerClient(triton.http_url[len("http://") :])
    try:
        assert not client.is_model_ready(name)
        assert client.is_model_ready("Warm") and client.is_model_ready("Warm_backend")
    finally:
        client.close()


def test_failing_warmup_at_startup_fails_run_clearly():
    # Bound before run(), with the server started by run() (the policy does not start it on entering
    # the context): the start-up path, where a failed warmup fails the whole start.
    policy = TritonLifecyclePolicy(launch_triton_on_startup=False)
    with Triton(config=TritonConfig(**triton_ports()), triton_lifecycle_policy=policy) as triton:
        triton.bind("Cold", refuses, INPUTS, OUTPUTS, config=ModelConfig(model_warmup=_zeros_warmup()))
        with pytest.raises(PyTritonModelConfigError, match=FAILED_WARMUP):
            triton.run()
        assert not triton.is_alive()
        # The model's instance had started, so the Python backend had made its /tmp directory: removed too.
        scratch = triton._backend.scratch.path
        assert scratch is not None and not os.path.exists(scratch), "the Python backend's scratch directory was left"
