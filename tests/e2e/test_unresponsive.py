"""Issue 25, item 5: readiness while a callable hangs with no execution timeout (pytriton/_unresponsive.py).

Before: the model's readiness and strict server readiness answered 200 for as long as the callable
hung, and every new request queued behind it without an answer; while a stub was stopped (SIGSTOP)
readiness answered 200 until its replacement. Now, once every instance has been
in one call for ``PYTRITON_UNRESPONSIVE_AFTER_S`` (1 s here), the model is unloaded from Triton:
readiness says not ready and new requests fail at once; the hung call and the requests already
queued are still answered when it returns; then the model is loaded again and serves, with no
server restart. That test runs on thread and on backend instances (tests/e2e/_kinds.py; the hung
callable waits for a file); the others need an execution timeout, which a backend instance refuses.
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import signal
import threading
import time
from typing import Any, Dict, Iterator, Tuple

import numpy as np
import pytest

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports, wait_for
from tests.e2e._kinds import bind_kinds, model
from tests.e2e.kind_models import HangsOnOne
from tests.e2e.test_healing import _stubs


class Release:
    """The hung callables' gate: a file they wait for (tests/e2e/kind_models.py), for every instance kind."""

    def __init__(self, directory: pathlib.Path):
        self.directory = directory

    def set(self) -> None:
        (self.directory / "release").touch()

    def clear(self) -> None:
        (self.directory / "release").unlink(missing_ok=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Tuple[Triton, Dict[str, int], Release]]:
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("PYTRITON_UNRESPONSIVE_AFTER_S", "1")
    ports = triton_ports()
    triton = Triton(config=TritonConfig(**ports))
    release = Release(tmp_path_factory.mktemp("release"))
    hangs_on_one = HangsOnOne(str(release.directory))
    spec = dict(
        inputs=[Tensor(name="x", shape=(-1,), dtype=np.float32)],
        outputs=[Tensor(name="y", shape=(-1,), dtype=np.float32)],
    )
    bind_kinds(triton, "Hangs", hangs_on_one, config=ModelConfig(max_batch_size=4), **spec)  # tests/e2e/_kinds.py
    triton.bind("Bounded", hangs_on_one, config=ModelConfig(max_batch_size=4, execution_timeout_s=30), **spec)
    triton.bind("Pausable", hangs_on_one, config=ModelConfig(max_batch_size=4, execution_timeout_s=30), **spec)
    try:
        triton.run()
        yield triton, ports, release
    finally:
        release.set()
        triton.stop()
        monkeypatch.undo()


def _http(ports: Dict[str, int], path: str, body: Any = None) -> Tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", ports["http_port"], timeout=60)
    try:
        connection.request("POST" if body is not None else "GET", path, body=json.dumps(body) if body else None)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _infer(ports: Dict[str, int], model: str, value: float) -> Tuple[int, bytes]:
    body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}
    return _http(ports, f"/v2/models/{model}/infer", body)


def _in_background(function, *args) -> Tuple[threading.Thread, Dict[str, Any]]:
    result: Dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", function(*args)), daemon=True)
    thread.start()
    return thread, result


def test_a_hung_callable_makes_the_model_not_ready_and_it_recovers(server, kind):
    triton, ports, release = server
    hangs = model("Hangs", kind)
    release.clear()
    assert _http(ports, f"/v2/models/{hangs}/ready")[0] == 200
    hung, hung_result = _in_background(_infer, ports, hangs, 1.0)
    time.sleep(0.3)
    queued, queued_result = _in_background(_infer, ports, hangs, 2.0)  # waits in Triton's queue behind it
    try:
        assert wait_for(lambda: _http(ports, f"/v2/models/{hangs}/ready")[0] != 200, 10, 0.1), "readiness stayed 200"
        assert _http(ports, "/v2/health/ready")[0] != 200  # strict readiness (the default)
        started = time.monotonic()
        status, body = _infer(ports, hangs, 3.0)
        assert status != 200 and time.monotonic() - started < 5, (status, body)  # fails at once, not queued
        assert hangs.encode() in body, body
        assert _infer(ports, "Bounded", 4.0)[0] == 200  # other models serve on
    finally:
        release.set()
    hung.join(60)
    queued.join(60)
    assert hung_result["value"][0] == 200 and queued_result["value"][0] == 200  # both answered when it returned
    assert wait_for(lambda: _http(ports, f"/v2/models/{hangs}/ready")[0] == 200, 30, 0.1), "not loaded again"
    assert _http(ports, "/v2/health/ready")[0] == 200
    status, body = _infer(ports, hangs, 5.0)
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [5.0]
    assert triton.server_restarts == 0


def test_a_model_with_an_execution_timeout_stays_loaded_while_busy(server):
    """Its calls are bounded by the timeout: the watch leaves it alone."""
    triton, ports, release = server
    release.clear()
    call, result = _in_background(_infer, ports, "Bounded", 1.0)
    try:
        time.sleep(2.5)  # well past the 1 s limit
        assert _http(ports, "/v2/models/Bounded/ready")[0] == 200
    finally:
        release.set()
    call.join(60)
    assert result["value"][0] == 200


def test_a_stopped_stub_makes_the_model_not_ready_until_it_is_replaced(server):
    """A stub stopped for 0.5 s: not ready at once, whatever the execution timeout; ready once replaced (2 s kill)."""
    triton, ports, _ = server
    (stub,) = _stubs(triton._backend.server.pid, "Pausable")
    os.kill(stub, signal.SIGSTOP)
    try:
        assert wait_for(lambda: _http(ports, "/v2/models/Pausable/ready")[0] != 200, 5, 0.05), "readiness stayed 200"
        started = time.monotonic()
        status, body = _infer(ports, "Pausable", 3.0)
        assert status != 200 and time.monotonic() - started < 1.0, (status, body)  # not Triton's 1 s health check
    finally:
        try:
            os.kill(stub, signal.SIGCONT)  # killed by then, normally (proxy/_stub_watch.py)
        except ProcessLookupError:
            pass
    assert wait_for(lambda: _http(ports, "/v2/models/Pausable/ready")[0] == 200, 30, 0.1), "not loaded again"
    status, body = _infer(ports, "Pausable", 6.0)
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [6.0]
    assert _infer(ports, "Bounded", 7.0)[0] == 200
    assert triton.server_restarts == 0


def test_the_embedded_server_reports_a_hung_model_not_ready_too(monkeypatch):
    """``Triton(embedded=True)``: the same watch, the in-process server's unload and load."""
    monkeypatch.setenv("PYTRITON_UNRESPONSIVE_AFTER_S", "1")
    release = threading.Event()

    def hangs(requests):
        if float(requests[0]["x"].flat[0]) == 1.0:
            release.wait(60)
        return [{"y": request["x"]} for request in requests]

    triton = Triton(embedded=True)
    spec = dict(
        inputs=[Tensor(name="x", shape=(-1,), dtype=np.float32)],
        outputs=[Tensor(name="y", shape=(-1,), dtype=np.float32)],
    )
    triton.bind("Embedded", hangs, config=ModelConfig(max_batch_size=4), **spec)
    try:
        triton.run()
        model = triton.model("Embedded")
        assert model.ready()
        hung, hung_result = _in_background(
            lambda: triton.client("Embedded").infer_sample(x=np.array([1.0], np.float32))
        )
        try:
            assert wait_for(lambda: not model.ready(), 10, 0.1), "readiness stayed true"
            started = time.monotonic()
            with pytest.raises(Exception, match="Embedded"):
                triton.client("Embedded").infer_sample(x=np.array([3.0], np.float32))
            assert time.monotonic() - started < 5
        finally:
            release.set()
        hung.join(60)
        assert float(hung_result["value"]["y"][0]) == 1.0
        assert wait_for(lambda: triton.model("Embedded").ready(), 30, 0.1), "not loaded again"
        assert float(triton.client("Embedded").infer_sample(x=np.array([4.0], np.float32))["y"][0]) == 4.0
    finally:
        release.set()
        triton.stop()
