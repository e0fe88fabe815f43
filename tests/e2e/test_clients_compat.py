"""Client behaviour that code written for NVIDIA PyTriton 0.7 relies on, against a live server (issue 16)."""

from __future__ import annotations

import asyncio
import time
import warnings

import numpy as np
import pytest
import tritonclient.grpc
import tritonclient.grpc.aio
import tritonclient.http
import tritonclient.http.aio

from pytriton.client import (
    AsyncioDecoupledModelClient,
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)
from pytriton.client._url import parse_url
from pytriton.client.auth import ClientSecurity
from pytriton.client.exceptions import (
    PyTritonClientInferenceServerError,
    PyTritonClientModelUnavailableError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.client.utils import (
    ModelState,
    create_client_from_url,
    get_model_config,
    get_model_state,
    wait_for_model_ready,
    wait_for_server_ready,
)
from pytriton.client.warnings import NotSupportedTimeoutWarning
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports
from tests.e2e._kinds import bind_kinds, model
from tests.e2e.kind_models import breaks, ticks

A = np.array([1.0, 2.0, 3.0], dtype=np.float32)
B = np.array([0.5, 0.5, 0.5], dtype=np.float32)


@batch
def add_sub(a, b):
    return {"add": a + b, "sub": a - b}


@batch
def stalls(n):
    time.sleep(float(n[0, 0]))
    yield {"token": np.zeros((len(n), 1), dtype=np.int32)}


def _t(name, shape=(-1,), dtype=np.float32):
    return Tensor(name=name, shape=shape, dtype=dtype)


def _stream_model(triton, name, function, bind=Triton.bind):
    bind(
        triton,
        name,
        function,
        [_t("n", (1,), np.int32)],
        [_t("token", (1,), np.int32)],
        config=ModelConfig(decoupled=True),
    )


@pytest.fixture(scope="module")
def server():
    ports = triton_ports()
    with Triton(config=TritonConfig(**ports)) as triton:
        triton.bind("AddSub", add_sub, [_t("a"), _t("b")], [_t("add"), _t("sub")], config=ModelConfig(max_batch_size=8))
        triton.bind("Reloadable", add_sub, [_t("a"), _t("b")], [_t("add"), _t("sub")])
        # The streams the tests taking ``kind`` read, on each instance kind (tests/e2e/_kinds.py).
        _stream_model(triton, "Ticks", ticks, bind_kinds)
        _stream_model(triton, "Breaks", breaks, bind_kinds)
        _stream_model(triton, "Stalls", stalls)
        triton.run()
        yield {
            "http": f"http://127.0.0.1:{ports['http_port']}",
            "grpc": f"grpc://127.0.0.1:{ports['grpc_port']}",
            "token": triton.get_access_token(),
        }


@pytest.fixture(params=["http", "grpc"])
def url(request, server):
    return server[request.param]


def _plain_client(url, token, network_timeout_s=None):
    """A raw tritonclient client that sends the access token (the repository index is restricted)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotSupportedTimeoutWarning)
        client = create_client_from_url(url, network_timeout_s=network_timeout_s)
    return ClientSecurity(access_token=token).apply(client, parse_url(url))


def test_asyncio_model_config_is_an_awaitable_property_and_get_lib_is_aio(url, server):
    async def main():
        async with AsyncioModelClient(url, "AddSub") as client:
            config = await client.model_config
            assert config.max_batch_size == 8 and (await client.model_config) is config
            assert client.get_lib() in (tritonclient.http.aio, tritonclient.grpc.aio)
        async with AsyncioDecoupledModelClient(url, "Ticks") as client:  # HTTP streams too (generate_stream)
            assert (await client.model_config).decoupled
            assert client.get_lib() in (tritonclient.http.aio, tritonclient.grpc.aio)

    asyncio.run(main())
    with ModelClient(url, "AddSub") as client:
        assert client.get_lib() in (tritonclient.http, tritonclient.grpc)


def test_create_client_from_url(url):
    client = ModelClient.create_client_from_url(url, network_timeout_s=None)
    try:
        assert isinstance(client, (tritonclient.http.InferenceServerClient, tritonclient.grpc.InferenceServerClient))
        assert client.is_server_ready()
    finally:
        client.close()

    async def main():
        aio = AsyncioModelClient.create_client_from_url(url)
        try:
            assert await aio.is_server_ready()
        finally:
            await aio.close()

    asyncio.run(main())


def test_stream_with_short_inference_timeout_completes(url, kind):
    # Responses 0.1 s apart with inference_timeout_s=0.1: the timeout does not bound the stream.
    with DecoupledModelClient(url, model("Ticks", kind), inference_timeout_s=0.1) as client:
        steps = [int(out["token"][0]) for out in client.infer_sample(np.array([2], np.int32))]
    assert steps == [0, 1]


def test_decoupled_client_on_coupled_model_raises_server_error(url):
    for lazy in (True, False):
        with DecoupledModelClient(url, "AddSub", lazy_init=lazy) as client:
            with pytest.raises(PyTritonClientInferenceServerError, match="not decoupled"):
                next(iter(client.infer_sample(A, B)))

    async def main():
        async with AsyncioDecoupledModelClient(url, "AddSub") as client:
            with pytest.raises(PyTritonClientInferenceServerError, match="not decoupled"):
                async for _ in client.infer_sample(A, B):
                    pass

    asyncio.run(main())
    with ModelClient(url, "Ticks") as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="is decoupled"):
            client.infer_sample(np.array([1], np.int32))


def test_next_stream_works_after_a_model_raised_mid_stream(url, kind):
    with DecoupledModelClient(url, model("Breaks", kind)) as client:
        for _ in range(2):
            received = []
            with pytest.raises(PyTritonClientInferenceServerError, match="broke on purpose"):
                for out in client.infer_sample(np.array([-1], np.int32)):
                    received.append(int(out["token"][0]))
            assert received == [0]
            assert [int(o["token"][0]) for o in client.infer_sample(np.array([1], np.int32))] == [0, 1]

    async def main():
        async with AsyncioDecoupledModelClient(url, model("Breaks", kind)) as client:
            with pytest.raises(PyTritonClientInferenceServerError, match="broke on purpose"):
                async for _ in client.infer_sample(np.array([-1], np.int32)):
                    pass
            return [int(o["token"][0]) async for o in client.infer_sample(np.array([1], np.int32))]

    assert asyncio.run(main()) == [0, 1]


def test_asyncio_stream_bounds_each_wait_and_recovers(url):
    async def main():
        async with AsyncioDecoupledModelClient(url, "Stalls", inference_timeout_s=0.5) as client:
            with pytest.raises(PyTritonClientTimeoutError):
                async for _ in client.infer_sample(np.array([1], np.int32)):
                    pass
            await asyncio.sleep(2.5)  # the model instance finishes the abandoned request (1 s)
            return [int(o["token"][0]) async for o in client.infer_sample(np.array([0], np.int32))]

    assert asyncio.run(main()) == [0]


def test_decoupled_client_is_a_model_client(url):
    with DecoupledModelClient(url, "Ticks") as client:
        assert isinstance(client, ModelClient)
        assert client.is_batching_supported
        assert client.model_config.decoupled
        client.wait_for_server(10.0)
        client.wait_for_model(10.0)


def test_wait_for_server_load_and_unload(url, server):
    with ModelClient(url, "Reloadable", access_token=server["token"]) as client:
        client.wait_for_server(10.0)
        np.testing.assert_array_equal(client.infer_sample(A, B)["add"], A + B)
        client.unload_model()
        probe = _plain_client(url, server["token"])
        try:
            deadline = time.monotonic() + 30
            while get_model_state(probe, "Reloadable") == ModelState.READY and time.monotonic() < deadline:
                time.sleep(0.1)
            assert get_model_state(probe, "Reloadable") != ModelState.READY
            client.load_model()
            wait_for_model_ready(probe, "Reloadable", timeout_s=30)
            assert get_model_state(probe, "Reloadable") == ModelState.READY
        finally:
            probe.close()
        np.testing.assert_array_equal(client.infer_sample(A, B)["sub"], A - B)


def test_utils_on_plain_tritonclient_clients(url, server):
    client = _plain_client(url, server["token"], network_timeout_s=10.0)
    try:
        wait_for_server_ready(client, timeout_s=10)
        wait_for_model_ready(client, "AddSub", timeout_s=10)
        config = get_model_config(client, "AddSub", timeout_s=10)
        assert config.max_batch_size == 8 and [i.name for i in config.inputs] == ["a", "b"]
        assert get_model_state(client, "AddSub") == ModelState.READY
        assert get_model_state(client, "AddSub", "1") == ModelState.READY
        assert get_model_state(client, "NoSuchModel") == ModelState.UNAVAILABLE
        with pytest.raises(PyTritonClientTimeoutError):
            wait_for_model_ready(client, "NoSuchModel", timeout_s=0.5)
    finally:
        client.close()


def test_model_config_argument_and_from_existing_client(url, server):
    with ModelClient(url, "AddSub", lazy_init=False) as first:
        config = first.model_config
        with ModelClient(url, "AddSub", model_config=config, ensure_model_is_ready=False) as given:
            assert given.model_config is config
            np.testing.assert_array_equal(given.infer_sample(A, B)["add"], A + B)
        for cls in (ModelClient, FuturesModelClient):
            clone = cls.from_existing_client(first)
            assert type(clone) is cls
            clone.close()

    async def main():
        async with AsyncioModelClient(url, "AddSub", model_config=config) as client:
            assert (await client.model_config) is config
            clone = AsyncioModelClient.from_existing_client(client)
            assert (await clone.model_config) is config
            np.testing.assert_array_equal((await clone.infer_sample(A, B))["add"], A + B)
            await clone.close()

    asyncio.run(main())
    with DecoupledModelClient(url, "Ticks", lazy_init=False) as streaming:
        clone = DecoupledModelClient.from_existing_client(streaming)
        assert clone.model_config is streaming.model_config
        clone.close()

    async def streaming_main():
        async with AsyncioDecoupledModelClient(url, "Ticks", lazy_init=False) as client:
            clone = AsyncioDecoupledModelClient.from_existing_client(client)
            assert type(clone) is AsyncioDecoupledModelClient
            assert (await clone.model_config) is (await client.model_config)
            assert len([part async for part in clone.infer_sample(np.array([2], np.int32))]) == 2
            await clone.close()

    asyncio.run(streaming_main())


def test_futures_defaults_serve_a_full_queue(url):
    # NVIDIA PyTriton 0.7's defaults: 128 workers, a queue of 128; that many requests run at once.
    with FuturesModelClient(url, "AddSub") as client:
        assert (client._max_workers, client._max_queue_size) == (128, 128)
        inputs = [np.full(3, i, np.float32) for i in range(128)]
        futures = [client.infer_sample(x, B) for x in inputs]
        for x, future in zip(inputs, futures):
            np.testing.assert_array_equal(future.result(timeout=120)["add"], x + B)


def test_unknown_model_maps_to_unavailable_by_status(url):
    with ModelClient(url, "AddSub", lazy_init=False) as known:
        config = known.model_config
    with ModelClient(url, "NoSuchModel", model_config=config, ensure_model_is_ready=False) as client:
        with pytest.raises(PyTritonClientModelUnavailableError):
            client.infer_sample(A, B)


def test_unsupported_parameter_and_header_types_are_rejected(url):
    with ModelClient(url, "AddSub") as client:
        with pytest.raises(PyTritonClientValueError, match="parameters"):
            client.infer_sample(A, B, parameters={"k": [1, 2]})
        with pytest.raises(PyTritonClientValueError, match="headers"):
            client.infer_sample(A, B, headers={"x-k": 1.5})
        with pytest.raises(PyTritonClientValueError, match="not a string"):
            client.infer_sample(A, B, parameters={1: "a"})
    with DecoupledModelClient(url, "Ticks") as client:
        with pytest.raises(PyTritonClientValueError, match="parameters"):
            client.infer_sample(np.array([1], np.int32), parameters={"k": object()})


def test_http_stream_shapes_batches_and_access_token(server):
    url = server["http"]
    with DecoupledModelClient(url, "Ticks", access_token=server["token"]) as client:
        outs = list(client.infer_batch(n=np.array([[2]], np.int32)))
        assert [o["token"].shape for o in outs] == [(1, 1), (1, 1)] and outs[1]["token"].dtype == np.int32
        with pytest.raises(PyTritonClientValueError, match="one sample"):
            list(client.infer_batch(n=np.array([[1], [1]], np.int32)))
    with DecoupledModelClient(url, "NoSuchModel", model_config=_ticks_config(url), ensure_model_is_ready=False) as c:
        with pytest.raises(PyTritonClientModelUnavailableError):
            list(c.infer_sample(np.array([1], np.int32)))


def _ticks_config(url):
    with DecoupledModelClient(url, "Ticks") as client:
        return client.model_config


def test_close_from_another_thread_ends_a_blocked_stream(url):
    import threading

    client = DecoupledModelClient(url, "Ticks")
    first = threading.Event()
    outcome = []

    def consume():
        try:
            for _ in client.infer_sample(np.array([100], np.int32)):
                first.set()
        except Exception as exc:  # the expected end: the client was closed under the stream
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    assert first.wait(30)
    client.close()
    thread.join(30)
    assert not thread.is_alive()
    assert len(outcome) == 1 and type(outcome[0]).__name__ == "PyTritonClientClosedError"


def test_second_infer_while_a_grpc_stream_is_open_is_refused(server):
    # NVIDIA PyTriton's decoupled suite: a second infer_* while the first stream is open raises
    # PyTritonClientInferenceServerError; the first stream still delivers all of its responses.
    with DecoupledModelClient(server["grpc"], "Ticks") as client:
        first = client.infer_sample(np.array([3], np.int32))  # sent now; 3 responses 0.1 s apart
        with pytest.raises(PyTritonClientInferenceServerError, match="still open"):
            client.infer_sample(np.array([1], np.int32))
        with pytest.raises(PyTritonClientInferenceServerError, match="still open"):
            client.infer_batch(np.array([[1]], np.int32))
        assert [int(o["token"][0]) for o in first] == [0, 1, 2]
        assert [int(o["token"][0]) for o in client.infer_sample(np.array([2], np.int32))] == [0, 1]


def test_second_http_stream_while_one_is_read_is_refused(server):
    # HTTP streaming (generate_stream) is this project's addition; the same one-stream rule holds
    # while a stream is being read.
    with DecoupledModelClient(server["http"], "Ticks") as client:
        first = client.infer_sample(np.array([3], np.int32))
        assert int(next(first)["token"][0]) == 0
        with pytest.raises(PyTritonClientInferenceServerError, match="still being read"):
            next(client.infer_sample(np.array([1], np.int32)))
        assert [int(o["token"][0]) for o in first] == [1, 2]
        assert [int(o["token"][0]) for o in client.infer_sample(np.array([1], np.int32))] == [0]
