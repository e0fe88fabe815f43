"""The shared client core, driven by both drivers (blocking and asyncio) over a fake transport.

No server: a fake ``InferenceServerClient`` answers the calls the core's operations yield, so the
same expectations run through ``run_sync`` and ``run_async`` and through the public clients.
"""

from __future__ import annotations

import asyncio
import socket
import warnings
from typing import Any, Dict, List

import numpy as np
import pytest
import tritonclient.grpc
import tritonclient.grpc.aio
import tritonclient.http
import tritonclient.http.aio
from tritonclient.utils import InferenceServerException

from pytriton.client import (
    AsyncioDecoupledModelClient,
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)
from pytriton.client import _clients as client_module
from pytriton.client._core import ClientCore, ModelState, map_error, model_state
from pytriton.client._drivers import run_async, run_sync
from pytriton.client._url import parse_url
from pytriton.client.exceptions import (
    PyTritonClientInferenceServerError,
    PyTritonClientInvalidUrlError,
    PyTritonClientModelUnavailableError,
    PyTritonClientPermissionError,
    PyTritonClientRuntimeError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.client.utils import (
    LATEST_MODEL_VERSION,
    TritonUrl,
    create_client_from_url,
    get_model_config,
    get_model_state,
    wait_for_model_ready,
    wait_for_server_ready,
)
from pytriton.client.warnings import NotSupportedTimeoutWarning, PyTritonWarning
from pytriton.model_config.triton_model_config import TritonModelConfig

CONFIG = {
    "name": "AddSub",
    "max_batch_size": 8,
    "input": [
        {"name": "a", "data_type": "TYPE_FP32", "dims": [-1]},
        {"name": "b", "data_type": "TYPE_FP32", "dims": [-1]},
    ],
    "output": [{"name": "add", "data_type": "TYPE_FP32", "dims": [-1]}],
}


# Triton 2.51's answer to a gRPC call of a restricted protocol without the token (FACTS.md).
RESTRICTED_GRPC = (
    "[StatusCode.UNAVAILABLE] This protocol is restricted, expecting header 'triton-grpc-protocol-triton-access-token'"
)


class FakeResult:
    def __init__(self, outputs: Dict[str, np.ndarray]):
        self._outputs = outputs

    def as_numpy(self, name: str) -> Any:
        return self._outputs.get(name)


class FakeServer:
    """Answers like a blocking tritonclient HTTP client; records every call."""

    def __init__(self, ready_after: int = 0, config: Any = None, fail_infer: Any = None):
        self.calls: List[str] = []
        self.ready_after = ready_after
        self.config = dict(CONFIG if config is None else config)
        self.fail_infer = fail_infer
        self.index: Any = [{"name": "AddSub", "version": "1", "state": "READY"}]

    def is_server_ready(self, **_: Any) -> bool:
        self.calls.append("is_server_ready")
        return self.calls.count("is_server_ready") > self.ready_after

    def is_model_ready(self, name: str, version: str = "", **_: Any) -> bool:
        self.calls.append("is_model_ready")
        return True

    def get_model_config(self, name: str, version: str = "", **_: Any) -> Any:
        self.calls.append("get_model_config")
        return self.config

    def get_model_repository_index(self, **_: Any) -> Any:
        self.calls.append("get_model_repository_index")
        return self.index

    def load_model(self, name: str, **kwargs: Any) -> None:
        self.calls.append(f"load_model:{sorted(kwargs)}")

    def unload_model(self, name: str, **_: Any) -> None:
        self.calls.append("unload_model")

    def infer(self, name: str, inputs: Any, **kwargs: Any) -> FakeResult:
        self.calls.append("infer")
        if self.fail_infer is not None:
            raise self.fail_infer
        arrays = {i.name(): i for i in inputs}
        assert set(arrays) == {"a", "b"}
        self.last_kwargs = kwargs
        shape = [int(d) for d in arrays["a"].shape()]
        return FakeResult({"add": np.full(shape, 3.0, np.float32)})

    def close(self) -> None:
        self.calls.append("close")


class AsyncFake:
    """The same server behind coroutines, as tritonclient's asyncio clients expose it."""

    def __init__(self, server: FakeServer):
        self.server = server

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.server, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        return call


def _drive(driver: str, operation: Any, server: FakeServer) -> Any:
    if driver == "sync":
        return run_sync(operation, server, server)
    return asyncio.run(run_async(operation, AsyncFake(server)))


DRIVERS = ["sync", "async"]


def _core(**kwargs: Any) -> ClientCore:
    return ClientCore(parse_url("http://fake:1"), "AddSub", None, 5.0, 5.0, **kwargs)


@pytest.mark.parametrize("driver", DRIVERS)
def test_infer_waits_reads_config_once_then_one_round_trip(driver):
    server = FakeServer(ready_after=2)
    core = _core()
    a = np.ones(3, np.float32)
    result = _drive(driver, core.infer((a, a), {}, None, None, False, tritonclient.http), server)
    assert result["add"].shape == (3,)  # batch axis added for the request, removed from the output
    assert server.calls.count("get_model_config") == 1 and server.calls.count("is_server_ready") == 3
    before = len(server.calls)
    _drive(driver, core.infer((), {"a": a, "b": a}, {"k": 1.5}, {"x-id": 7}, False, tritonclient.http), server)
    assert server.calls[before:] == ["infer"]
    assert server.last_kwargs["parameters"] == {"k": 1.5} and server.last_kwargs["headers"] == {"x-id": "7"}


@pytest.mark.parametrize("driver", DRIVERS)
def test_given_config_skips_reading_and_optionally_readiness(driver):
    from pytriton.model_config.generator import from_dict

    config = from_dict(CONFIG)
    server = FakeServer()
    core = _core(model_config=config, ensure_model_is_ready=False)
    a = np.ones((2, 3), np.float32)
    _drive(driver, core.infer((a, a), {}, None, None, True, tritonclient.http), server)
    assert server.calls == ["infer"]
    server = FakeServer()
    core = _core(model_config=config)
    assert _drive(driver, core.ensure_config(), server) is config
    assert "get_model_config" not in server.calls and "is_model_ready" in server.calls


@pytest.mark.parametrize("driver", DRIVERS)
def test_load_and_unload_forget_the_cached_config(driver):
    server = FakeServer()
    core = _core()
    _drive(driver, core.ensure_config(), server)
    _drive(driver, core.load_model('{"max_batch_size": 4}', None), server)
    assert core.config is None and "load_model:['config']" in server.calls
    _drive(driver, core.ensure_config(), server)
    _drive(driver, core.unload_model(), server)
    assert core.config is None and server.calls[-1] == "unload_model"


@pytest.mark.parametrize("driver", DRIVERS)
def test_decoupled_model_rejected_by_unary_infer_with_server_error_type(driver):
    server = FakeServer(config={**CONFIG, "model_transaction_policy": {"decoupled": True}})
    a = np.ones(3, np.float32)
    with pytest.raises(PyTritonClientInferenceServerError, match="decoupled"):
        _drive(driver, _core().infer((a, a), {}, None, None, False, tritonclient.http), server)
    assert "infer" not in server.calls


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("parameters", "headers", "match"),
    [
        ({"k": [1]}, None, "parameters"),
        ({1: "v"}, None, "not a string"),
        (None, {"x": 1.5}, "headers"),
        ("k=v", None, "must be a dict"),
    ],
)
def test_unsupported_parameter_and_header_types(driver, parameters, headers, match):
    server = FakeServer()
    a = np.ones(3, np.float32)
    with pytest.raises(PyTritonClientValueError, match=match):
        _drive(driver, _core().infer((a, a), {}, parameters, headers, False, tritonclient.http), server)
    assert server.calls == []  # rejected before anything is sent


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (InferenceServerException("whatever words", status="StatusCode.DEADLINE_EXCEEDED"), PyTritonClientTimeoutError),
        (socket.timeout("x"), PyTritonClientTimeoutError),
        (
            InferenceServerException("whatever words", status="StatusCode.UNAVAILABLE"),
            PyTritonClientModelUnavailableError,
        ),
        (InferenceServerException("is not found", status="400"), PyTritonClientInferenceServerError),
        (InferenceServerException("timed out, unavailable", status="500"), PyTritonClientInferenceServerError),
        (ConnectionRefusedError("refused"), PyTritonClientModelUnavailableError),
        (InferenceServerException("forbidden", status="403"), PyTritonClientPermissionError),
        (InferenceServerException(RESTRICTED_GRPC, status="StatusCode.UNAVAILABLE"), PyTritonClientPermissionError),
    ],
)
def test_errors_map_by_status_and_type_not_words(driver, error, expected):
    server = FakeServer(fail_infer=error)
    a = np.ones(3, np.float32)
    with pytest.raises(expected):
        _drive(driver, _core().infer((a, a), {}, None, None, False, tritonclient.http), server)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    ("output", "match"),
    [
        ({"name": "add", "data_type": "TYPE_BF16", "dims": [-1]}, "TYPE_BF16"),  # no numpy dtype for it
        ({"data_type": "TYPE_FP32", "dims": [-1]}, "Cannot parse"),  # no name
    ],
)
def test_a_config_the_client_cannot_use_is_a_client_error(driver, output, match):
    server = FakeServer(config={**CONFIG, "output": [output]})
    a = np.ones(3, np.float32)
    with pytest.raises(PyTritonClientRuntimeError, match=match) as info:
        _drive(driver, _core().infer((a, a), {}, None, None, False, tritonclient.http), server)
    assert "AddSub" in info.value.message
    assert "infer" not in server.calls


def test_a_refused_restricted_call_is_a_permission_error_that_says_what_to_do():
    error = map_error(InferenceServerException(RESTRICTED_GRPC, status="StatusCode.UNAVAILABLE"), "Loading model 'x'")
    assert isinstance(error, PyTritonClientPermissionError)
    assert isinstance(error, PyTritonClientInferenceServerError)  # existing handlers still catch it
    assert "Loading model 'x' was refused" in error.message and "access_token=" in error.message
    # A real UNAVAILABLE (server going away) stays retryable "unavailable".
    plain = map_error(InferenceServerException("Socket closed", status="StatusCode.UNAVAILABLE"), "x")
    assert type(plain) is PyTritonClientModelUnavailableError


@pytest.mark.parametrize("driver", DRIVERS)
def test_readiness_wait_raises_a_refusal_at_once_instead_of_polling(driver):
    class Restricted(FakeServer):
        def is_server_ready(self, **_: Any) -> bool:
            self.calls.append("is_server_ready")
            raise InferenceServerException(RESTRICTED_GRPC, status="StatusCode.UNAVAILABLE")

    server = Restricted()
    with pytest.raises(PyTritonClientPermissionError, match="is ready was refused"):
        _drive(driver, _core().wait_for_model(30.0), server)
    assert server.calls == ["is_server_ready"]


def test_the_legacy_client_names_a_refusal_as_permission_denied():
    from pytriton.client.legacy._errors import InferenceServerException as LegacyError
    from pytriton.client.legacy._errors import translated

    with pytest.raises(LegacyError, match=r"^load of model 'x': permission denied \(the endpoint is restricted"):
        with translated("grpc://h:1", what="load of model 'x'"):
            raise InferenceServerException(RESTRICTED_GRPC, status="StatusCode.UNAVAILABLE")


def test_map_error_keeps_pytriton_errors():
    error = PyTritonClientValueError("x")
    assert map_error(error, "y") is error


@pytest.mark.parametrize("driver", DRIVERS)
def test_wait_for_model_times_out_with_a_clear_message(driver):
    server = FakeServer(ready_after=10_000)
    with pytest.raises(PyTritonClientTimeoutError, match="server at http://fake:1 is not ready"):
        _drive(driver, _core().wait_for_model(0.2), server)


class NotReadyServer(FakeServer):
    """A server up and answering, whose model never becomes ready; ``index`` None: the index is restricted.

    ``metadata_error``: Triton's answer to a metadata request for the model.
    """

    metadata_error = "Request for unknown model: 'AddSub' has no available versions"

    def get_model_metadata(self, name: str, version: str = "", **_: Any) -> Any:
        self.calls.append("get_model_metadata")
        raise InferenceServerException(self.metadata_error, status="404")

    def is_model_ready(self, name: str, version: str = "", **_: Any) -> bool:
        self.calls.append("is_model_ready")
        return False

    def get_model_repository_index(self, **_: Any) -> Any:
        self.calls.append("get_model_repository_index")
        if self.index is None:
            raise InferenceServerException("This API is restricted", status="403")
        return self.index


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("index", [[{"name": "Other", "version": "1", "state": "READY"}], {"models": []}])
def test_wait_for_a_model_the_server_does_not_know_fails_at_once(driver, index):
    server = NotReadyServer()
    server.index = index  # HTTP's list and gRPC's {"models": [...]}, neither naming AddSub
    with pytest.raises(PyTritonClientModelUnavailableError, match="no model 'AddSub'"):
        _drive(driver, _core().wait_for_model(600.0), server)
    assert server.calls.count("is_model_ready") == 1  # no polling


@pytest.mark.parametrize("driver", DRIVERS)
def test_without_the_index_metadata_not_found_means_unknown(driver):
    server = NotReadyServer()
    server.index = None  # restricted: the metadata answer decides
    server.metadata_error = "Request for unknown model: 'AddSub' is not found"
    with pytest.raises(PyTritonClientModelUnavailableError, match="no model 'AddSub'; check"):
        _drive(driver, _core().wait_for_model(600.0), server)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_misspelt_name_suggests_the_near_match_and_lists_the_models(driver):
    server = NotReadyServer()
    server.index = [{"name": name} for name in ("AddSub", "Classifier", "addsub_v2")]
    with pytest.raises(PyTritonClientModelUnavailableError) as info:
        _drive(driver, ClientCore(parse_url("http://fake:1"), "AdSub", None, 5.0, 5.0).wait_for_model(600.0), server)
    assert str(info.value) == (
        "The server at http://fake:1 has no model 'AdSub'. Did you mean 'AddSub'? "
        "Its models: 'AddSub', 'Classifier', 'addsub_v2'."
    )


def test_an_unknown_name_with_no_near_match_lists_the_models_and_without_the_index_says_how_to_see_them():
    from pytriton.client._core import unknown_model_message

    assert (
        unknown_model_message("h:1", "Zebra", ["AddSub"])
        == "The server at h:1 has no model 'Zebra'. Its models: 'AddSub'."
    )
    assert unknown_model_message("h:1", "addsub", ["AddSub"]).startswith(
        "The server at h:1 has no model 'addsub'. Did you mean 'AddSub'?"
    )
    assert "pass access_token= to the client to see it" in unknown_model_message("h:1", "Zebra", None)


class RefusingServer(FakeServer):
    """Every poll is refused, as a wrong port or a stopped server refuses it."""

    def is_server_ready(self, **_: Any) -> bool:
        self.calls.append("is_server_ready")
        raise ConnectionRefusedError(111, "Connection refused")


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_refused_wait_says_once_what_is_refused_and_where(driver, monkeypatch, caplog):
    from pytriton.client import _core

    monkeypatch.setattr(_core, "_SILENT_WAIT_S", 0.1)
    server = RefusingServer()
    with caplog.at_level("WARNING", logger="pytriton.client"):
        with pytest.raises(PyTritonClientTimeoutError, match="not ready"):
            _drive(driver, _core.wait_for_server(0.8, False, "the server at http://fake:1"), server)
    lines = [r.getMessage() for r in caplog.records if r.name == "pytriton.client"]
    assert len(lines) == 1, lines
    assert lines[0].startswith("Waiting for the server at http://fake:1: [Errno 111] Connection refused.")
    assert "check the URL and that the server is running" in lines[0]
    assert server.calls.count("is_server_ready") > 2  # it went on polling after the warning


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_server_that_starts_quickly_is_waited_for_in_silence(driver, caplog):
    server = FakeServer(ready_after=2)
    with caplog.at_level("WARNING", logger="pytriton.client"):
        _drive(driver, _core().wait_for_model(5.0), server)
    assert not [r for r in caplog.records if r.name == "pytriton.client"]


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    "index", [[{"name": "AddSub", "version": "1", "state": "LOADING"}], {"models": [{"name": "AddSub"}]}, None]
)
def test_wait_for_a_known_model_polls_until_the_timeout(driver, index):
    # Known but loading (or listed without versions), or, with the index restricted, a metadata
    # answer saying it is loading: waited for.
    server = NotReadyServer()
    server.index = index
    with pytest.raises(PyTritonClientTimeoutError, match="model 'AddSub' is not ready"):
        _drive(driver, _core().wait_for_model(0.3), server)
    assert server.calls.count("is_model_ready") > 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_model_state_from_http_and_grpc_indexes(driver):
    server = FakeServer()
    server.index = [
        {"name": "AddSub", "version": "1", "state": "READY"},
        {"name": "AddSub", "version": "2", "state": "UNLOADING"},
        {"name": "Other", "version": "3", "state": "READY"},
        {"name": "AddSub"},
    ]
    assert _drive(driver, model_state(False, 1.0, "AddSub", None), server) == ModelState.UNLOADING
    assert _drive(driver, model_state(False, 1.0, "AddSub", "1"), server) == ModelState.READY
    assert _drive(driver, model_state(False, 1.0, "AddSub", LATEST_MODEL_VERSION), server) == ModelState.UNLOADING
    assert _drive(driver, model_state(False, 1.0, "Missing", None), server) == ModelState.UNAVAILABLE
    server.index = {"models": [{"name": "AddSub", "version": "1"}]}  # gRPC as JSON; no state yet
    assert _drive(driver, model_state(True, 1.0, "AddSub", None), server) == ModelState.LOADING


# -- the public clients over the fake transport -------------------------------------------------------
@pytest.fixture
def fake(monkeypatch):
    server = FakeServer()
    monkeypatch.setattr(client_module, "sync_clients", lambda *_: (tritonclient.http, server, server))
    monkeypatch.setattr(client_module, "async_clients", lambda *_: (tritonclient.http.aio, AsyncFake(server)))
    return server


def test_blocking_and_asyncio_clients_share_the_core(fake):
    a = np.ones(3, np.float32)
    with ModelClient("http://fake:1", "AddSub") as client:
        assert client.infer_sample(a, a)["add"].shape == (3,)
        assert client.is_batching_supported and client.get_lib() is tritonclient.http
        client.wait_for_server(1.0)
        client.load_model()
        client.unload_model()

    async def main():
        async with AsyncioModelClient("http://fake:1", "AddSub") as client:
            config = await client.model_config  # an awaitable property, as in the reference
            assert config.max_batch_size == 8 and client.get_lib() is tritonclient.http.aio
            assert (await client.infer_batch(a=np.ones((2, 3), np.float32), b=np.ones((2, 3), np.float32)))[
                "add"
            ].shape == (2, 3)
            clone = AsyncioModelClient.from_existing_client(client)
            assert (await clone.model_config) is config
            await clone.close()

    asyncio.run(main())


def test_from_existing_client_keeps_class_config_and_readiness(fake):
    with ModelClient("http://fake:1", "AddSub", lazy_init=False, inference_timeout_s=7) as client:
        clone = ModelClient.from_existing_client(client)
        assert clone._core.config is client._core.config and clone._core.ready
        assert clone._core.inference_timeout_s == 7
        clone.close()
        futures = FuturesModelClient.from_existing_client(client)
        assert isinstance(futures, FuturesModelClient) and futures.model_config().result(5) is client.model_config
        futures.close()


def test_futures_defaults_and_validation(fake):
    with FuturesModelClient("http://fake:1", "AddSub") as client:
        assert client._max_workers == 128 and client._max_queue_size == 128
        assert client.infer_sample(np.ones(3, np.float32), np.ones(3, np.float32)).result(5)["add"].shape == (3,)
    for bad in ({"max_workers": 0}, {"max_queue_size": 0}):
        with pytest.raises(PyTritonClientValueError):
            FuturesModelClient("http://fake:1", "AddSub", **bad)


def test_class_hierarchy_and_libs():
    assert issubclass(DecoupledModelClient, ModelClient)
    assert issubclass(AsyncioDecoupledModelClient, AsyncioModelClient)
    assert issubclass(PyTritonClientInvalidUrlError, PyTritonClientValueError)
    assert issubclass(NotSupportedTimeoutWarning, PyTritonWarning) and issubclass(PyTritonWarning, UserWarning)
    client = DecoupledModelClient("grpc://127.0.0.1:1", "m")
    assert client.get_lib() is tritonclient.grpc
    client.close()
    client = DecoupledModelClient("http://127.0.0.1:1", "m")  # HTTP streams through generate_stream
    assert client.get_lib() is tritonclient.http
    client.close()


def test_helpers_for_plain_clients_run_the_same_operations():
    server = FakeServer()
    wait_for_server_ready(server, timeout_s=5)
    wait_for_model_ready(server, "AddSub", timeout_s=5)
    config = get_model_config(server, "AddSub", model_version=LATEST_MODEL_VERSION, timeout_s=5)
    assert isinstance(config, TritonModelConfig) and config.model_name == "AddSub" and config.max_batch_size == 8
    assert get_model_state(server, "AddSub") == ModelState.READY
    assert get_model_state(server, "Missing") == ModelState.UNAVAILABLE
    assert server.calls.count("get_model_config") == 1 and "is_model_ready" in server.calls


def test_model_config_argument_must_be_typed():
    with pytest.raises(PyTritonClientValueError, match="TritonModelConfig"):
        ModelClient("http://127.0.0.1:1", "m", model_config={"max_batch_size": 1})  # type: ignore[arg-type]


def test_triton_url_and_create_client_from_url():
    url = TritonUrl.from_url("localhost")
    assert (url.scheme, url.hostname, url.port) == ("http", "localhost", 8000)
    assert url.with_scheme == "http://localhost:8000" and url.without_scheme == "localhost:8000"
    assert TritonUrl.from_url("grpc://h").port == 8001
    with pytest.raises(PyTritonClientValueError):
        TritonUrl.from_url("ftp://h")
    http = create_client_from_url("127.0.0.1:1", network_timeout_s=2.0)
    assert isinstance(http, tritonclient.http.InferenceServerClient)
    http.close()
    with pytest.warns(NotSupportedTimeoutWarning):
        grpc = ModelClient.create_client_from_url("grpc://127.0.0.1:1", network_timeout_s=2.0)
    assert isinstance(grpc, tritonclient.grpc.InferenceServerClient)
    grpc.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grpc = create_client_from_url("grpc://127.0.0.1:1")  # no timeout asked for: no warning
    grpc.close()

    async def main():
        aio = AsyncioModelClient.create_client_from_url("http://127.0.0.1:1")
        assert isinstance(aio, tritonclient.http.aio.InferenceServerClient)
        await aio.close()

    asyncio.run(main())


# -- the blocking and asyncio streaming clients over a fake gRPC stream ---------------------------------
class FakeStreamResult:
    def __init__(self, step: Any, final: bool):
        self._step = step
        parameters = {"triton_final_response": type("P", (), {"bool_param": True})()} if final else {}
        outputs = [] if step is None else ["token"]
        self._response = type("R", (), {"parameters": parameters, "outputs": outputs})()

    def get_response(self) -> Any:
        return self._response

    def as_numpy(self, name: str) -> Any:
        return np.array([[self._step]], np.int32) if name == "token" else None


class FakeStreamServer(FakeServer):
    """A decoupled model behind a fake gRPC client: ``n`` responses ``gap_s`` apart, or an error."""

    def __init__(self, gap_s: float = 0.0, fail_after: int = -1):
        super().__init__(
            config={
                "name": "Gen",
                "max_batch_size": 4,
                "input": [{"name": "n", "data_type": "TYPE_INT32", "dims": [1]}],
                "output": [{"name": "token", "data_type": "TYPE_INT32", "dims": [1]}],
                "model_transaction_policy": {"decoupled": True},
            }
        )
        self.gap_s = gap_s
        self.fail_after = fail_after
        self.count = 2  # responses per request
        self.callback: Any = None
        self.stops: List[bool] = []  # cancel_requests of each stop_stream
        self.hang_on_half_close = False  # a half-close waits until the call is cancelled (a silent peer)
        self.gate: Any = None  # a threading.Event the responses wait for: a stream the test holds open
        self._stream: Any = None  # what tritonclient names its stream object, holding its gRPC call

    def start_stream(self, callback: Any, headers: Any = None) -> None:
        import threading

        self.calls.append("start_stream")
        self.callback = callback
        call = type("Call", (), {})()
        call.cancelled = threading.Event()
        call.cancel = call.cancelled.set
        self._stream = type("Stream", (), {})()
        self._stream._response_iterator = call

    def async_stream_infer(self, name: str, inputs: Any, **kwargs: Any) -> None:
        import threading
        import time

        count, callback, gate = self.count, self.callback, self.gate

        def produce() -> None:
            if gate is not None:
                assert gate.wait(10.0), "the test never let the stream go on"
            for step in range(count):
                time.sleep(self.gap_s)
                if step == self.fail_after:
                    callback(None, InferenceServerException("RuntimeError: broke", status="StatusCode.INTERNAL"))
                    return
                callback(FakeStreamResult(step, False), None)
            callback(FakeStreamResult(None, True), None)

        threading.Thread(target=produce, daemon=True).start()

    def stop_stream(self, cancel_requests: bool = False) -> None:
        self.calls.append("stop_stream")
        self.stops.append(cancel_requests)
        if not cancel_requests and self.hang_on_half_close:
            assert self._stream._response_iterator.cancelled.wait(10.0), "the half-close was never bounded"
        self._stream = None


@pytest.fixture
def fake_stream(monkeypatch):
    server = FakeStreamServer(gap_s=0.05)
    monkeypatch.setattr(client_module, "sync_clients", lambda *_: (tritonclient.grpc, server, server))
    return server


def _tokens(outputs: Any) -> List[int]:
    return [int(out["token"][0]) for out in outputs]


def test_stream_is_not_bounded_by_inference_timeout(fake_stream):
    with DecoupledModelClient("grpc://fake:1", "Gen", inference_timeout_s=0.01) as client:
        assert _tokens(client.infer_sample(np.array([2], np.int32))) == [0, 1]
        assert fake_stream.stops == [False]  # ended by the server: half-closed, not cancelled (end_stream)


def test_a_stream_left_early_is_cancelled_and_an_ended_one_half_closed(fake_stream):
    fake_stream.count = 5
    with DecoupledModelClient("grpc://fake:1", "Gen") as client:
        for _ in client.infer_sample(np.array([5], np.int32)):
            break  # the caller leaves: the model should stop generating
        assert fake_stream.stops == [True]
        fake_stream.fail_after = 1
        with pytest.raises(PyTritonClientInferenceServerError, match="broke"):
            list(client.infer_sample(np.array([5], np.int32)))
        assert fake_stream.stops == [True, False]  # an error response ends the stream on the server's side


def test_a_half_close_the_server_never_answers_is_cancelled(fake_stream, monkeypatch):
    from pytriton.client import _decoupled

    monkeypatch.setattr(_decoupled, "GRACEFUL_CLOSE_TIMEOUT_S", 0.2)
    fake_stream.hang_on_half_close = True
    with DecoupledModelClient("grpc://fake:1", "Gen") as client:
        assert _tokens(client.infer_sample(np.array([2], np.int32))) == [0, 1]  # returns once the call is cancelled
        assert fake_stream.stops == [False]


def test_stream_error_then_next_stream_both_drivers(fake_stream):
    fake_stream.fail_after = 1
    with DecoupledModelClient("grpc://fake:1", "Gen") as client:
        received: List[int] = []
        with pytest.raises(PyTritonClientInferenceServerError, match="broke"):
            for out in client.infer_sample(np.array([2], np.int32)):
                received.append(int(out["token"][0]))
        assert received == [0]
        fake_stream.fail_after = -1
        assert _tokens(client.infer_sample(np.array([2], np.int32))) == [0, 1]

    async def main() -> List[int]:
        fake_stream.fail_after = 0
        async with AsyncioDecoupledModelClient("grpc://fake:1", "Gen") as client:
            with pytest.raises(PyTritonClientInferenceServerError):
                async for _ in client.infer_sample(np.array([2], np.int32)):
                    pass
            fake_stream.fail_after = -1
            return [int(out["token"][0]) async for out in client.infer_sample(np.array([2], np.int32))]

    assert asyncio.run(main()) == [0, 1]


def test_a_second_infer_while_a_stream_is_open_is_refused(fake_stream):
    import threading

    # The stream stays open until the refused call is done, not for 0.6 s of gaps: a loaded host could
    # pause the test that long, and the server had then ended the stream (no longer refused).
    fake_stream.gate = threading.Event()
    with DecoupledModelClient("grpc://fake:1", "Gen") as client:
        first = client.infer_sample(np.array([2], np.int32))  # sent at once, as in NVIDIA PyTriton
        assert fake_stream.calls.count("start_stream") == 1
        with pytest.raises(PyTritonClientInferenceServerError, match="still open"):
            client.infer_batch(np.array([[2]], np.int32))
        assert fake_stream.calls.count("start_stream") == 1  # the refused call sent nothing
        fake_stream.gate.set()
        assert _tokens(first) == [0, 1]
        assert _tokens(client.infer_sample(np.array([2], np.int32))) == [0, 1]  # read to its end: free again


def test_a_dropped_stream_frees_the_client_once_the_server_ends_it(fake_stream):
    import time

    with DecoupledModelClient("grpc://fake:1", "Gen") as client:
        client.infer_sample(np.array([2], np.int32))  # never read
        deadline = time.monotonic() + 10
        while client._grpc_stream is not None and not client._grpc_stream.ended.is_set():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert _tokens(client.infer_sample(np.array([2], np.int32))) == [0, 1]
        assert fake_stream.stops == [False, False]  # the dropped one half-closed before the next started
        client.infer_sample(np.array([2], np.int32))  # open and unread at close(): close ends it
    assert len(fake_stream.stops) == 3


def test_grpc_stream_headers_carry_the_token_under_tritons_grpc_key(fake_stream):
    seen = {}
    original = fake_stream.start_stream

    def start_stream(callback, headers=None):
        seen.update(headers or {})
        original(callback, headers)

    fake_stream.start_stream = start_stream
    with DecoupledModelClient("grpc://fake:1", "Gen") as client:
        list(client.infer_sample(np.array([1], np.int32), headers={"Triton-Access-Token": "t0k", "x-id": 3}))
    assert seen == {"triton-grpc-protocol-triton-access-token": "t0k", "x-id": "3"}


def test_asyncio_stream_bounds_each_wait(fake_stream):
    fake_stream.gap_s = 1.0

    async def main() -> None:
        async with AsyncioDecoupledModelClient("grpc://fake:1", "Gen", inference_timeout_s=0.1) as client:
            with pytest.raises(PyTritonClientTimeoutError):
                async for _ in client.infer_sample(np.array([2], np.int32)):
                    pass

    asyncio.run(main())
    assert fake_stream.stops == [True]  # the abandoned request was cancelled


def test_plain_wait_for_model_ready_waits_even_for_an_unknown_name():
    # The utils poll keeps NVIDIA PyTriton's contract: only the timeout error, whatever the name.
    server = NotReadyServer()
    server.index = []
    with pytest.raises(PyTritonClientTimeoutError, match="model 'AddSub' is not ready"):
        wait_for_model_ready(server, "AddSub", timeout_s=0.3)
    assert "get_model_repository_index" not in server.calls


def test_tritons_unknown_request_id_prefix_is_left_out_of_raised_errors():
    error = InferenceServerException("[request id: <id_unknown>] Fails: ValueError: bad input", status="400")
    assert str(map_error(error, "Inference of Fails")) == "Inference of Fails failed: Fails: ValueError: bad input"
    # A request that carried an id keeps it: it names the request.
    named = InferenceServerException("[request id: 7] Fails: ValueError: bad input", status="400")
    assert "[request id: 7]" in str(map_error(named, "Inference of Fails"))
