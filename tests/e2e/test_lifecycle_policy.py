"""NVIDIA PyTriton 0.7's life cycle, kept: entering the context starts (or connects to) the server,
a model bound while it runs is served when ``bind`` returns, ``is_connected()`` says which state it is in.

Each test has a server of its own on free ports of 127.0.0.1; models are checked with raw
``tritonclient`` (ready or not) and ``ModelClient`` (an answer).
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http

from pytriton.client import ModelClient
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import RemoteTriton, Triton, TritonConfig, TritonLifecyclePolicy
from tests.conftest import triton_ports


@batch
def _double(x):
    return {"y": x * 2}


def _bind(triton: Triton, name: str) -> None:
    triton.bind(
        name,
        _double,
        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
        [Tensor(name="y", shape=(-1,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=4),
    )


def _answers(url: str, name: str) -> bool:
    with ModelClient(url, name, init_timeout_s=10, lazy_init=False) as client:
        return client.infer_sample(np.ones(2, np.float32))["y"].tolist() == [2.0, 2.0]


def _ready(http_url: str, name: str) -> bool:
    with tritonclient.http.InferenceServerClient(http_url.removeprefix("http://")) as client:
        return bool(client.is_model_ready(name))


def _config() -> TritonConfig:
    return TritonConfig(**triton_ports())


def test_a_remote_triton_is_not_connected_until_it_is_entered_or_connected():
    remote = RemoteTriton(url="127.0.0.1:1")
    try:
        assert not remote.is_connected()
    finally:
        remote.stop()


def test_entering_the_context_starts_the_server_and_bind_serves_at_once():
    with Triton(config=_config()) as triton:
        assert triton.is_connected() and triton.is_alive()  # no model yet, server up
        _bind(triton, "Local")
        assert triton.is_alive()
        assert _answers(triton.http_url, "Local")  # no run(): bound in a running context
        with RemoteTriton(url=triton.http_url, access_token=triton.get_access_token()) as remote:
            assert remote.is_connected()
            _bind(remote, "FromRemote")
            assert remote.is_alive() and _answers(triton.http_url, "FromRemote")
        # Leaving the remote block unloads its model and leaves the server serving the rest.
        assert not _ready(triton.http_url, "FromRemote") and _answers(triton.http_url, "Local")
        assert not remote.is_connected()
    assert not triton.is_connected()


def test_connect_loads_the_models_bound_before_it_and_stop_unloads_them():
    with Triton(config=_config()) as triton:
        remote = RemoteTriton(url=triton.http_url, access_token=triton.get_access_token())
        try:
            _bind(remote, "Late")
            assert not remote.is_connected() and not remote.is_alive()
            assert not _ready(triton.http_url, "Late")
            remote.connect()
            assert remote.is_connected() and remote.is_alive()
            assert _answers(triton.http_url, "Late")
        finally:
            remote.stop()
        assert not _ready(triton.http_url, "Late")


def test_without_a_context_the_server_starts_at_run_and_later_binds_are_served():
    triton = Triton(config=_config())
    try:
        assert not triton.is_connected() and not triton.is_alive()
        _bind(triton, "First")
        assert not triton.is_alive()
        triton.run()
        assert triton.is_connected() and triton.is_alive() and _answers(triton.http_url, "First")
        _bind(triton, "Second")
        assert triton.is_alive() and _answers(triton.http_url, "Second")
    finally:
        triton.stop()
    assert not triton.is_alive() and not triton.is_connected()


def test_a_policy_that_does_not_launch_on_startup_waits_for_run():
    policy = TritonLifecyclePolicy(launch_triton_on_startup=False)
    with Triton(config=_config(), triton_lifecycle_policy=policy) as triton:
        assert not triton.is_connected()
        _bind(triton, "AtRun")
        triton.run()
        assert triton.is_connected() and _answers(triton.http_url, "AtRun")


def test_a_bind_that_fails_in_a_running_context_leaves_the_server_serving():
    with Triton(config=_config()) as triton:
        _bind(triton, "Good")
        with pytest.raises(Exception, match="Bad"):
            triton.bind(
                "Bad",
                _double,
                [Tensor(name="x", shape=(-1,), dtype=np.float32)],
                [Tensor(name="y", shape=(-1,), dtype=np.float32)],
                config=ModelConfig(max_batch_size=4, model_warmup=["not a warmup"]),  # refused by validation
            )
        assert triton.is_alive() and _answers(triton.http_url, "Good")
