"""pytriton's clients against a live server, over HTTP and gRPC, served by each instance kind (tests/e2e/_kinds.py)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from pytriton.client import (
    AsyncioDecoupledModelClient,
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientModelUnavailableError,
    PyTritonClientQueueFullError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports
from tests.e2e._kinds import bind_kinds, model
from tests.e2e.kind_models import add_sub, fails, no_batch, params_echo, slow, tokens


def _t(name, shape=(-1,), dtype=np.float32):
    return Tensor(name=name, shape=shape, dtype=dtype)


@pytest.fixture(scope="module")
def urls():
    ports = triton_ports()
    config = TritonConfig(http_header_forward_pattern="x-.*", grpc_header_forward_pattern="x-.*", **ports)
    with Triton(config=config) as triton:
        # Each model twice, as "<name>" (thread instances) and "<name>_backend" (tests/e2e/_kinds.py).
        bind_kinds(
            triton, "AddSub", add_sub, [_t("a"), _t("b")], [_t("add"), _t("sub")], config=ModelConfig(max_batch_size=64)
        )
        bind_kinds(triton, "Params", params_echo, [_t("x")], [_t("params", (1,), bytes)])
        bind_kinds(triton, "NoBatch", no_batch, [_t("x", (3,))], [_t("y", (3,))], config=ModelConfig(batching=False))
        bind_kinds(triton, "Slow", slow, [_t("x", (1,))], [_t("y", (1,))])
        # A model of its own for the queue test, so it never waits behind the timeout tests' sleeps.
        triton.bind("QueueProbe", slow, [_t("x", (1,))], [_t("y", (1,))])
        bind_kinds(triton, "Fails", fails, [_t("x")], [_t("y")])
        bind_kinds(
            triton,
            "Tokens",
            tokens,
            [_t("n", (1,), np.int32)],
            [_t("token", (1,), np.int32)],
            config=ModelConfig(decoupled=True),
        )
        triton.run()
        yield {
            "http": f"http://127.0.0.1:{ports['http_port']}",
            "grpc": f"grpc://127.0.0.1:{ports['grpc_port']}",
            "token": triton.get_access_token(),
        }


@pytest.fixture(params=["http", "grpc"])
def url(request, urls):
    return urls[request.param]


A = np.array([1.0, 2.0, 3.0], dtype=np.float32)
B = np.array([0.5, 0.5, 0.5], dtype=np.float32)


def test_infer_sample_adds_and_removes_batch_axis(url, kind):
    with ModelClient(url, model("AddSub", kind)) as client:
        result = client.infer_sample(A, B)
        assert result["add"].shape == (3,)
        np.testing.assert_array_equal(result["add"], A + B)
        np.testing.assert_array_equal(client.infer_sample(a=A, b=B)["sub"], A - B)


def test_infer_batch_and_config(url, kind):
    with ModelClient(url, model("AddSub", kind), lazy_init=False) as client:
        assert client.is_batching_supported
        config = client.model_config
        assert config.max_batch_size == 64 and [o.name for o in config.outputs] == ["add", "sub"]
        batch_a = np.stack([A, A * 2])
        result = client.infer_batch(a=batch_a, b=np.stack([B, B]))
        assert result["add"].shape == (2, 3)
        np.testing.assert_array_equal(result["add"][1], A * 2 + B)
        clone = ModelClient.from_existing_client(client)
        assert clone.model_config is config  # reused, not read again
        clone.close()


def test_mixing_positional_and_named_inputs_is_rejected(url):
    with ModelClient(url, "AddSub") as client, pytest.raises(PyTritonClientValueError, match="not both"):
        client.infer_sample(A, b=B)


def test_parameters_and_headers_reach_the_model(url, kind):
    with ModelClient(url, model("Params", kind)) as client:
        result = client.infer_sample(
            np.ones(1, np.float32), parameters={"mode": "fast", "k": 2}, headers={"x-trace": "abc", "other": "no"}
        )
        # Headers matching *_header_forward_pattern arrive as parameters, next to the request's own.
        assert json.loads(result["params"][0]) == {"k": 2, "mode": "fast", "x-trace": "abc"}


def test_non_batching_model(url, kind):
    with ModelClient(url, model("NoBatch", kind)) as client:
        assert not client.is_batching_supported
        np.testing.assert_array_equal(client.infer_sample(x=A)["y"], A * 2)
        with pytest.raises(PyTritonClientModelDoesntSupportBatchingError):
            client.infer_batch(x=np.stack([A]))


def test_server_error_reaches_the_caller(url, kind):
    with ModelClient(url, model("Fails", kind)) as client, pytest.raises(PyTritonClientInferenceServerError) as info:
        client.infer_sample(A)
    assert "KeyError" in str(info.value) and "missing vocabulary entry" in str(info.value)


def test_a_server_refusal_reaches_the_caller_without_tritons_unknown_id_prefix(url):
    # Triton's core says "[request id: <id_unknown>] ..." for a request sent without an id: it names
    # nothing the caller can use, so the client leaves it out.
    with ModelClient(url, "AddSub") as client, pytest.raises(PyTritonClientInferenceServerError) as info:
        client.infer_batch(a=np.zeros((65, 3), np.float32), b=np.zeros((65, 3), np.float32))
    assert "batch-size must be <= 64" in str(info.value)
    assert "id_unknown" not in str(info.value)


# An init timeout the test could never sit out: only the fail-fast answer lets these tests return.
_HOUR = 3600.0


def _misspelt_sync(url):
    with ModelClient(url, "AddSubb", init_timeout_s=_HOUR) as client:
        client.infer_sample(A, B)


def _misspelt_lazy_false(url):
    ModelClient(url, "AddSubb", lazy_init=False, init_timeout_s=_HOUR)


def _misspelt_futures(url):
    with FuturesModelClient(url, "AddSubb", init_timeout_s=_HOUR) as client:
        client.infer_sample(A, B).result(timeout=60)


def _misspelt_asyncio(url):
    async def main():
        async with AsyncioModelClient(url, "AddSubb", init_timeout_s=_HOUR) as client:
            await client.infer_sample(A, B)

    asyncio.run(main())


def _misspelt_decoupled(url):
    with DecoupledModelClient(url, "Tokenz", init_timeout_s=_HOUR) as client:
        list(client.infer_sample(np.array([2], np.int32)))


def _misspelt_asyncio_decoupled(url):
    async def main():
        async with AsyncioDecoupledModelClient(url, "Tokenz", init_timeout_s=_HOUR) as client:
            return [out async for out in client.infer_sample(np.array([2], np.int32))]

    asyncio.run(main())


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "attempt",
    [
        _misspelt_sync,
        _misspelt_lazy_false,
        _misspelt_futures,
        _misspelt_asyncio,
        _misspelt_decoupled,
        _misspelt_asyncio_decoupled,
    ],
)
def test_misspelt_model_name_fails_fast(url, attempt):
    # The server answers at once that it has no such model: the clients say so instead of waiting
    # init_timeout_s (an hour here), and name the models it has.
    with pytest.raises(PyTritonClientModelUnavailableError, match=r"no model '(AddSubb|Tokenz)'; check the model name"):
        attempt(url)


def test_misspelt_model_name_with_the_access_token_lists_the_models(url, urls):
    # With the token the client may read the repository index, and the error names what is there.
    expected = r"no model 'AddSubb'\. Did you mean 'AddSub'.*\? Its models: 'AddSub', 'AddSub_backend', 'Fails', .*'Tokens_backend'\."
    with ModelClient(url, "AddSubb", access_token=urls["token"], init_timeout_s=_HOUR) as client:
        with pytest.raises(PyTritonClientModelUnavailableError, match=expected):
            client.infer_sample(A, B)


def test_known_model_not_ready_is_waited_for(url):
    # Known to the server but not ready (a version it does not have): waited for until the timeout,
    # as for a model still loading.
    expected = r"Waited 0\.5 s: the server is up but model 'AddSub' version 7 is not ready"
    with (
        ModelClient(url, "AddSub", model_version="7") as client,
        pytest.raises(PyTritonClientTimeoutError, match=expected),
    ):
        client.wait_for_model(0.5)


def test_wait_for_model(url):
    # A lazy client has contacted nothing yet; once the wait returns, the model serves.
    with ModelClient(url, "AddSub") as client:
        assert client.wait_for_model(5.0) is None
        np.testing.assert_array_equal(client.infer_sample(a=A, b=B)["add"], A + B)
    # A model the server does not know: the wait ends at once, naming it.
    with (
        ModelClient(url, "NoSuchModel") as client,
        pytest.raises(PyTritonClientModelUnavailableError, match="no model 'NoSuchModel'"),
    ):
        client.wait_for_model(600.0)


def test_inference_timeout_sync(url, kind):
    with ModelClient(url, model("Slow", kind), inference_timeout_s=0.5) as client:
        client.wait_for_model(5.0)
        # The 3 s reply would have returned a result: the timeout error is the check, no clock needed.
        with pytest.raises(PyTritonClientTimeoutError):
            client.infer_sample(np.array([3.0], np.float32))


def test_inference_timeout_futures(url, kind):
    with FuturesModelClient(url, model("Slow", kind), inference_timeout_s=0.5) as client:
        future = client.infer_sample(np.array([2.0], np.float32))
        with pytest.raises(PyTritonClientTimeoutError):
            future.result(timeout=10)


def test_inference_timeout_asyncio(url, kind):
    async def main():
        async with AsyncioModelClient(url, model("Slow", kind), inference_timeout_s=0.5) as client:
            await client.wait_for_model(5.0)
            with pytest.raises(PyTritonClientTimeoutError):
                await client.infer_sample(np.array([2.0], np.float32))

    asyncio.run(main())


def test_many_concurrent_futures(url, kind):
    with FuturesModelClient(url, model("AddSub", kind), max_workers=8) as client:
        assert client.model_config().result(10).max_batch_size == 64
        client.wait_for_model(5.0).result(10)
        futures = [(i, client.infer_sample(A * i, B)) for i in range(200)]
        for i, future in futures:
            np.testing.assert_array_equal(future.result(timeout=30)["add"], A * i + B)


def test_futures_closed_and_queue_full(url):
    client = FuturesModelClient(url, "QueueProbe", max_workers=1, max_queue_size=1, non_blocking=True)
    first = client.infer_sample(np.array([0.3], np.float32))
    with pytest.raises(PyTritonClientQueueFullError):
        client.infer_sample(np.array([0.0], np.float32))
    first.result(timeout=30)
    client.close()
    with pytest.raises(PyTritonClientClosedError):
        client.infer_sample(np.array([0.0], np.float32))


def test_closed_sync_client(url):
    client = ModelClient(url, "AddSub")
    client.close()
    client.close()
    with pytest.raises(PyTritonClientClosedError):
        client.infer_sample(A, B)


def test_asyncio_client(url, kind):
    async def main():
        async with AsyncioModelClient(url, model("AddSub", kind), lazy_init=False) as client:
            assert (await client.model_config).max_batch_size == 64
            results = await asyncio.gather(*(client.infer_sample(A * i, B) for i in range(20)))
            for i, result in enumerate(results):
                np.testing.assert_array_equal(result["add"], A * i + B)
            batch_result = await client.infer_batch(a=np.stack([A]), b=np.stack([B]))
            assert batch_result["sub"].shape == (1, 3)
        with pytest.raises(PyTritonClientClosedError):
            await client.infer_sample(A, B)

    asyncio.run(main())


def test_decoupled_clients_stream(urls, kind):
    with DecoupledModelClient(urls["grpc"], model("Tokens", kind)) as client:
        steps = [int(out["token"][0]) for out in client.infer_sample(np.array([4], np.int32))]
    assert steps == [0, 1, 2, 3]

    async def main():
        async with AsyncioDecoupledModelClient(urls["grpc"], model("Tokens", kind), lazy_init=False) as client:
            return [int(out["token"][0]) async for out in client.infer_sample(n=np.array([3], np.int32))]

    assert asyncio.run(main()) == [0, 1, 2]


def test_decoupled_client_errors(urls, kind):
    with DecoupledModelClient(urls["http"], model("Tokens", kind)) as client:  # HTTP streams through generate_stream
        assert [int(out["token"][0]) for out in client.infer_sample(np.array([2], np.int32))] == [0, 1]
    with DecoupledModelClient(urls["grpc"], model("AddSub", kind), lazy_init=False) as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="not decoupled"):
            list(client.infer_sample(A, B))
