"""Model warmup (issue 15, item 2): Triton runs it through the proxy before the model is ready."""

from __future__ import annotations

import http.client

import numpy as np
import pytest
import tritonclient.http as httpclient

from pytriton.client import ModelClient
from pytriton.decorators import batch, fill_optionals, first_value, pad_batch
from pytriton.exceptions import PyTritonModelConfigError
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.model_config.common import ModelWarmup, WarmupInput
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports, wait_for

INPUTS = [
    Tensor(name="x", shape=(3,), dtype=np.float32),
    Tensor(name="label", shape=(1,), dtype=object),
    Tensor(name="scale", shape=(1,), dtype=np.float32, optional=True),
]
OUTPUTS = [Tensor(name="y", shape=(3,), dtype=np.float32)]


class Recorder:
    """A decorated callable that notes every batch and whether the model was ready while it ran."""

    def __init__(self, http_url):
        self.http_url = http_url
        self.calls = []
        self.server_ready_during_warmup = []

    def _ready(self, path):
        host, port = self.http_url[len("http://") :].split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            connection.request("GET", path)
            return connection.getresponse().status == 200
        except OSError:  # endpoints not open yet
            return False
        finally:
            connection.close()

    @fill_optionals(scale=np.array([2.0], dtype=np.float32))
    @batch
    @pad_batch
    @first_value("scale")
    def __call__(self, x, label, scale):
        ready = self._ready("/v2/models/Warm/ready")
        self.calls.append({"x": x.copy(), "label": label.tolist(), "scale": scale, "ready": ready})
        if ready is False:
            self.server_ready_during_warmup.append(self._ready("/v2/health/ready"))
        return {"y": x * scale}


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
def warm(tmp_path_factory):
    data_file = tmp_path_factory.mktemp("warmup") / "x.npy"
    np.save(data_file, np.array([1.0, 2.0, 3.0]))
    with Triton(config=TritonConfig(**triton_ports())) as triton:
        recorder = Recorder(triton.http_url)
        config = ModelConfig(
            max_batch_size=4,
            batcher=DynamicBatcher(preferred_batch_size=[4]),
            model_warmup=_warmups(data_file),
        )
        triton.bind("Warm", recorder, INPUTS, OUTPUTS, config=config)
        triton.run()
        yield triton, recorder


def test_warmup_runs_through_the_decorators_before_ready(warm):
    triton, recorder = warm
    assert triton.get_access_token()  # management endpoints restricted (the default)
    warmup_calls = list(recorder.calls)
    assert len(warmup_calls) == 4  # zeros twice, random once, file once
    assert not any(call["ready"] for call in warmup_calls)
    # Nor is the server ready (a load balancer's probe) while a model still warms up.
    assert recorder.server_ready_during_warmup == [False] * 4
    zeros, _, random_call, from_file = warmup_calls
    # @pad_batch padded 3 to the preferred 4; @fill_optionals gave the absent scale; @first_value took it.
    assert zeros["x"].shape == (4, 3) and not zeros["x"].any()
    assert zeros["label"] == [[b""]] * 4 and float(zeros["scale"]) == 2.0
    assert random_call["x"].shape == (4, 3) and float(random_call["scale"]) == 0.0
    np.testing.assert_array_equal(from_file["x"][0], [1.0, 2.0, 3.0])
    data_files = list((triton._repository / "Warm" / "warmup").iterdir())
    assert data_files and all(path.stat().st_mode & 0o777 == 0o600 for path in data_files)


def test_model_serves_after_warmup(warm):
    triton, recorder = warm
    before = len(recorder.calls)
    with ModelClient(triton.http_url, "Warm") as client:
        result = client.infer_sample(x=np.ones(3, np.float32), label=np.array([b"a"]))
    np.testing.assert_array_equal(result["y"], [2.0, 2.0, 2.0])
    assert len(recorder.calls) == before + 1 and recorder.calls[-1]["ready"]


# -- warmups Triton cannot express, accepted as NVIDIA PyTriton 0.7 accepts them --------------------
# (Before the tests whose failing warmup may crash Triton 2.51: a bind while pytriton restarts the
# server is a different story.)
PAIR_INPUTS = [Tensor(name="a", shape=(-1,), dtype=np.int64), Tensor(name="b", shape=(-1,), dtype=np.int64)]
PAIR_OUTPUTS = [Tensor(name="a_out", shape=(-1,), dtype=np.int64), Tensor(name="b_out", shape=(-1,), dtype=np.int64)]


def test_warmup_for_some_inputs_and_a_whole_batch_file_reach_the_callable(warm, tmp_path):
    triton, _ = warm
    positions = np.arange(15, dtype=np.int64).reshape(3, 5)
    np.save(tmp_path / "positions.npy", positions)
    calls = []

    @batch
    def echo(**inputs):
        calls.append({name: array.copy() for name, array in inputs.items()})
        return {f"{name}_out": array for name, array in inputs.items()}

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
    triton.bind("Partial", echo, PAIR_INPUTS, PAIR_OUTPUTS, config=ModelConfig(max_batch_size=4, model_warmup=warmups))
    assert [sorted(call) for call in calls] == [["a"], ["a", "b"]]
    assert calls[0]["a"].shape == (2, 4) and not calls[0]["a"].any()
    np.testing.assert_array_equal(calls[1]["a"], positions)
    assert calls[1]["b"].shape == (3, 2)
    with ModelClient(triton.grpc_url, "Partial") as client:
        result = client.infer_sample(a=np.arange(2), b=np.arange(3))
    np.testing.assert_array_equal(result["b_out"], [0, 1, 2])


def test_failing_warmup_pytriton_sends_is_reported_and_not_served(warm):
    triton, _ = warm

    def refuses(requests):
        raise ValueError("cannot warm up: weights missing")

    warmups = [ModelWarmup("partial", 1, {"a": WarmupInput(np.int64, (2,), zero_data=True)})]
    config = ModelConfig(max_batch_size=4, model_warmup=warmups)
    with pytest.raises(PyTritonModelConfigError, match="warmup 'partial' failed in the callable: ValueError: cannot"):
        triton.bind("PartialCold", refuses, PAIR_INPUTS, PAIR_OUTPUTS, config=config)
    client = httpclient.InferenceServerClient(triton.http_url[len("http://") :])
    try:
        assert not client.is_model_ready("PartialCold")
    finally:
        client.close()


FAILED_WARMUP = "warmup sample 'smoke'.*weights missing|died while loading it.*warmup fails"


def _failing(requests):
    raise ValueError("cannot warm up: weights missing")


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


def test_failing_warmup_on_a_live_bind_is_reported_and_not_served(warm):
    triton, _ = warm
    # Triton 2.51 reports the warmup's error, or (about one load in ten here) crashes on the failed
    # instance; pytriton then says so and restarts the server with the models that loaded.
    with pytest.raises(PyTritonModelConfigError, match=FAILED_WARMUP):
        triton.bind("Cold", _failing, INPUTS, OUTPUTS, config=ModelConfig(model_warmup=_zeros_warmup()))
    assert wait_for(triton.is_alive, 60)
    client = httpclient.InferenceServerClient(triton.http_url[len("http://") :])
    try:
        assert not client.is_model_ready("Cold")
        assert client.is_model_ready("Warm")
    finally:
        client.close()


def test_failing_warmup_at_startup_fails_run_clearly():
    with Triton(config=TritonConfig(**triton_ports())) as triton:
        triton.bind("Cold", _failing, INPUTS, OUTPUTS, config=ModelConfig(model_warmup=_zeros_warmup()))
        with pytest.raises(PyTritonModelConfigError, match=FAILED_WARMUP):
            triton.run()
        assert not triton.is_alive()
