"""pytriton.ray's replica class without Ray: an embedded Triton in this process, driven as Ray would.

Ray Serve constructs :class:`PyTritonReplica` in a replica process, awaits ``infer`` for handle
calls, awaits ``__call__`` with a Starlette request for HTTP, and calls ``check_health`` and
``record_autoscaling_stats`` on timers. These tests do the same here (no Ray needed, so they run in
every environment); tests/e2e/test_ray.py runs it on a real two-node Ray cluster (``make test-ray``).
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from pytriton.inprocess import InvalidArgumentError
from pytriton.ray import PyTritonReplica, PyTritonRequestError
from tests.e2e import ray_models


@pytest.fixture(scope="module")
def replica():
    made = PyTritonReplica(ray_models.bind_identity)
    yield made
    made.__del__()


def _http(replica, method, path, body=None, root_path="/app"):
    from starlette.requests import Request

    payload = json.dumps(body).encode() if body is not None else b""
    sent = []

    async def receive():
        if sent:
            return {"type": "http.disconnect"}
        sent.append(1)
        return {"type": "http.request", "body": payload, "more_body": False}

    scope = {
        "type": "http",
        "method": method,
        "path": root_path + path,
        "root_path": root_path,
        "headers": [],
        "query_string": b"",
        "server": ("127.0.0.1", 8000),
        "scheme": "http",
    }
    response = asyncio.run(replica(Request(scope, receive)))
    return response.status_code, json.loads(response.body)


def test_handle_path_numpy_in_numpy_out(replica):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = asyncio.run(replica.infer({"x": x}, "Identity"))
    np.testing.assert_array_equal(out["y"], x)
    out = asyncio.run(replica.infer({"x": x}))  # one model bound: the name may be left out
    np.testing.assert_array_equal(out["y"], x)
    with pytest.raises(PyTritonRequestError, match="No model 'Nope'"):
        asyncio.run(replica.infer({"x": x}, "Nope"))
    with pytest.raises(InvalidArgumentError):
        asyncio.run(replica.infer({"wrong": x}, "Identity"))
    np.testing.assert_array_equal(asyncio.run(replica.infer({"x": x}))["y"], x)  # still serving


def test_http_routes_under_the_route_prefix(replica):
    body = {"id": "7", "inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1.5, 2, 3]}]}
    status, answer = _http(replica, "POST", "/v2/models/Identity/infer", body)
    assert status == 200, answer
    assert answer["id"] == "7"
    assert answer["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [1, 3], "data": [1.5, 2.0, 3.0]}]
    assert _http(replica, "POST", "/v2/models/Identity/versions/1/infer", body)[0] == 200
    assert _http(replica, "POST", "/v2/models/Nope/infer", body)[0] == 404
    assert _http(replica, "POST", "/v2/models/Identity/infer", {"inputs": "x"})[0] == 400
    bad_name = {"inputs": [{"name": "z", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}
    status, answer = _http(replica, "POST", "/v2/models/Identity/infer", bad_name)
    assert status == 400 and "Traceback" not in answer["error"]
    assert _http(replica, "GET", "/elsewhere")[0] == 404
    assert _http(replica, "GET", "/v2/health/ready") == (200, {"ready": True})
    assert _http(replica, "GET", "/v2/models/Identity/ready") == (200, {"ready": True})
    assert _http(replica, "GET", "/v2/models/Identity")[1]["name"] == "Identity"
    status, answer = _http(replica, "POST", "/v2/models/Identity/infer", body, root_path="")  # route prefix "/"
    assert status == 200 and answer["outputs"][0]["data"] == [1.5, 2.0, 3.0]


def test_queue_time_and_health_reports(replica):
    replica.queue_time_ms()  # start a fresh window
    for _ in range(5):
        asyncio.run(replica.infer({"x": np.ones((1, 2), np.float32)}))
    stats = replica.record_autoscaling_stats()
    assert set(stats) == {"pytriton_queue_ms"} and stats["pytriton_queue_ms"] > 0.0
    assert replica.record_autoscaling_stats() == {"pytriton_queue_ms": 0.0}  # nothing finished since
    replica.check_health()
    where = replica.where()
    assert where["models"] == ["Identity"] and where["shm_prefix"].startswith("pytriton-")


def test_a_stopped_replica_fails_its_health_check_and_reports_no_queue():
    stopped = PyTritonReplica(ray_models.bind_identity)
    stopped.check_health()
    stopped.__del__()  # what Ray Serve calls when it stops a replica
    with pytest.raises(RuntimeError, match="not serving"):
        stopped.check_health()
    # Ray may ask for autoscaling stats once more while the replica shuts down.
    assert stopped.record_autoscaling_stats() == {"pytriton_queue_ms": 0.0}


def test_bind_models_that_binds_nothing_is_refused():
    with pytest.raises(ValueError, match="bound no model"):
        PyTritonReplica(lambda triton: None)
