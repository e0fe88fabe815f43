"""Graceful drain (Triton.stop, SIGTERM to serve()): in-flight requests finish, later ones are refused cleanly.

The drain of ``stop()`` is tested on thread and on backend instances (the ``kind`` fixture,
tests/e2e/conftest.py): a server each, since the drain ends it. The gated callables
(tests/e2e/kind_models.py) wait for files, so that one test drives both kinds.
"""

from __future__ import annotations

import http.client
import json
import pathlib
import queue
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports
from tests.e2e.kind_models import Gate, Hold

CHILD = pathlib.Path(__file__).with_name("serve_child.py")
REPO = pathlib.Path(__file__).parents[2]
IN_FLIGHT = 32
TIMEOUT_S = 20.0
EXIT_TIMEOUT_S = 10


def _body(value):
    return json.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [value, -value]}]})


def _http_infer(connection, value):
    """``("ok", output)``, ``("status", code)`` or ``("closed", error)`` when no response began."""
    try:
        connection.request("POST", "/v2/models/Gate/infer", body=_body(value))
        response = connection.getresponse()
        data = response.read()  # an IncompleteRead here (a reset mid-response) fails the test
    except (ConnectionError, http.client.RemoteDisconnected) as exc:
        return "closed", type(exc).__name__
    if response.status != 200:
        return "status", response.status
    return "ok", json.loads(data)["outputs"][0]["data"]


def _grpc_infer(client, value):
    tensor = grpcclient.InferInput("x", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[value, -value]], dtype=np.float32))
    try:
        return "ok", client.infer("Gate", [tensor], client_timeout=TIMEOUT_S).as_numpy("x")[0].tolist()
    except InferenceServerException as exc:
        return "status", exc.status()


class Gates:
    """The gates of the Gate and Hold models (files in ``directory``, tests/e2e/kind_models.py), from the test's side."""

    def __init__(self, directory):
        self.directory = directory

    def open(self, name="open"):
        (self.directory / name).touch()

    def close(self, name="open"):
        (self.directory / name).unlink(missing_ok=True)

    def entered(self):
        """How many requests reached the Gate's callable (since :meth:`forget`)."""
        return sum(json.loads(path.read_text()) for path in self.directory.glob("entered-*.json"))

    def forget(self):
        for path in self.directory.glob("entered-*.json"):
            path.unlink()


def _hold_model(triton, gates, kind="thread"):
    tensor = Tensor(name="x", shape=(2,), dtype=np.float32)
    hold = Hold(str(gates.directory), TIMEOUT_S)
    triton.bind("Hold", hold, [tensor], [tensor], config=ModelConfig(batching=False), instance_kind=kind)


def _gate_model(triton, gates, kind="thread"):
    gated = batch(Gate(str(gates.directory), TIMEOUT_S))
    triton.bind(
        "Gate",
        [gated, gated],
        [Tensor(name="x", shape=(2,), dtype=np.float32)],
        [Tensor(name="x", shape=(2,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=IN_FLIGHT, batcher=DynamicBatcher()),
        instance_kind=kind,
    )


def test_stop_drains_in_flight_requests_and_refuses_later_ones_cleanly(kind, tmp_path):
    ports = triton_ports()
    gates = Gates(tmp_path)
    triton = Triton(config=TritonConfig(**ports, exit_timeout_secs=EXIT_TIMEOUT_S))
    _gate_model(triton, gates, kind)
    _hold_model(triton, gates, kind)  # one request held there keeps the drain open for the late requests
    triton.run()
    http_port = ports["http_port"]
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
    late_http = http.client.HTTPConnection("127.0.0.1", http_port, timeout=TIMEOUT_S)
    late_grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
    try:
        gates.open()  # warm the keep-alive connection and channel used after the drain began
        assert _http_infer(late_http, 0.5)[0] == "ok" and _grpc_infer(late_grpc, 0.5)[0] == "ok"
        gates.close()
        gates.forget()
        results = {}

        def send(index):
            value = float(index + 1)
            if index % 2:
                connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=TIMEOUT_S)
                results[index] = (value, _http_infer(connection, value))
                connection.close()
            else:
                results[index] = (value, _grpc_infer(grpc_client, value))

        def send_held():
            connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=TIMEOUT_S)
            connection.request("POST", "/v2/models/Hold/infer", body=_body(9.0).replace("[1, 2]", "[2]"))
            response = connection.getresponse()
            results["held"] = (9.0, ("ok", json.loads(response.read())["outputs"][0]["data"]))
            connection.close()

        senders = [threading.Thread(target=send, args=(index,)) for index in range(IN_FLIGHT)]
        senders.append(threading.Thread(target=send_held))
        for sender in senders:
            sender.start()
        # Every request reached Triton: two in the callables (one per instance), the rest queued.
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and _queued(ports) + gates.entered() < IN_FLIGHT:
            time.sleep(0.02)
        assert _queued(ports) + gates.entered() == IN_FLIGHT, "the requests did not all reach the server"
        assert _wait(lambda: triton._models[("Hold", 1)].busy), "the held request did not reach its callable"

        stopped = {}
        stopper = threading.Thread(target=lambda: stopped.update(s=_timed(triton.stop)))
        stopper.start()
        model = triton._models[("Gate", 1)]
        assert _wait(lambda: all(worker.admission is not None for worker in model._workers)), "refusal not armed"
        gates.open()  # the requests in the callables and those Triton had queued are served ...
        assert _wait(lambda: len(results) == IN_FLIGHT), "the requests in flight did not finish"
        # ... and those sent after the drain began are refused: a new connection gets no response,
        # a kept connection HTTP 503, gRPC UNAVAILABLE (while the held request keeps the drain open).
        fresh = http.client.HTTPConnection("127.0.0.1", http_port, timeout=TIMEOUT_S)
        late = {"fresh": _http_infer(fresh, 7.0), "kept": _http_infer(late_http, 7.0)}
        late["grpc"] = _grpc_infer(late_grpc, 7.0)
        fresh.close()
        gates.open("hold")
        for thread in (*senders, stopper):
            thread.join(TIMEOUT_S + EXIT_TIMEOUT_S)
            assert not thread.is_alive(), "a request or the stop hung"
    finally:
        gates.open()
        gates.open("hold")
        triton.stop()
        for closable in (late_http, grpc_client, late_grpc):
            closable.close()
    for value, outcome in results.values():  # every request sent before the drain: its own result
        assert outcome == ("ok", [value, -value])
    assert late["fresh"][0] == "closed", late  # Triton closes new HTTP connections once signalled
    assert late["kept"] == ("status", 503), late
    assert late["grpc"] == ("status", "StatusCode.UNAVAILABLE"), late
    assert stopped["s"] < EXIT_TIMEOUT_S, "stop() ran into its exit timeout instead of draining"


def _timed(function):
    started = time.monotonic()
    function()
    return time.monotonic() - started


def _wait(predicate, timeout_s=TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def _queued(ports):
    from pytriton.server._drain import pending_requests

    return pending_requests("127.0.0.1", ports["metrics_port"]).get(("Gate", "1"), 0)


def test_exit_timeout_bounds_a_drain_whose_callable_never_returns(tmp_path):
    ports = triton_ports()
    gates = Gates(tmp_path)
    triton = Triton(config=TritonConfig(**ports, exit_timeout_secs=1))
    _gate_model(triton, gates)
    triton.run()
    outcome = {}
    connection = http.client.HTTPConnection("127.0.0.1", ports["http_port"], timeout=TIMEOUT_S)
    request = threading.Thread(target=lambda: outcome.update(r=_http_infer(connection, 1.0)))
    try:
        request.start()
        assert _wait(gates.entered), "the request did not reach the callable"
        stop_s = _timed(triton.stop)
        request.join(TIMEOUT_S)
    finally:
        gates.open()
        triton.stop()
        connection.close()
    assert not request.is_alive()
    assert outcome["r"][0] == "closed"  # ended with the server: no response had begun
    assert stop_s < 1 + 5.0, f"stop() took {stop_s:.1f} s with exit_timeout_secs=1"


def test_drain_delay_keeps_serving_while_not_ready(tmp_path):
    ports = triton_ports()
    gates = Gates(tmp_path)
    gates.open()
    triton = Triton(config=TritonConfig(**ports, drain_delay_secs=1))
    _gate_model(triton, gates)
    triton.run()
    kept = http.client.HTTPConnection("127.0.0.1", ports["http_port"], timeout=TIMEOUT_S)
    during = {}
    try:
        assert _http_infer(kept, 1.0)[0] == "ok"
        stopper = threading.Thread(target=lambda: during.update(stop_s=_timed(triton.stop)))
        stopper.start()
        assert _wait(lambda: not _ready(ports["http_port"])), "readiness stayed true"
        during["kept"] = _http_infer(kept, 2.0)  # still inside the delay: served
        stopper.join(TIMEOUT_S)
    finally:
        triton.stop()
        kept.close()
    assert during["kept"] == ("ok", [2.0, -2.0])
    assert during["stop_s"] >= 1.0


def _ready(port):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/v2/health/ready")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_sigterm_to_serve_drains_requests_in_flight(signum):
    ports = triton_ports()
    process = subprocess.Popen(  # noqa: S603
        [
            sys.executable,
            str(CHILD),
            str(ports["http_port"]),
            str(ports["grpc_port"]),
            str(ports["metrics_port"]),
            "2",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline(), "child did not start"
        results = {}

        signalled = [0.0]
        connections = [http.client.HTTPConnection("127.0.0.1", ports["http_port"], timeout=TIMEOUT_S) for _ in range(8)]
        for connection in connections:  # open before the signal: Triton then closes new connections
            connection.request("GET", "/v2/health/live")
            assert connection.getresponse().read() == b""

        def send(index):
            connection = connections[index]
            try:
                connection.request("POST", "/v2/models/Slow/infer", body=_body(float(index)).replace("[1, 2]", "[2]"))
                response = connection.getresponse()
                results[index] = (response.status, json.loads(response.read()))
            except Exception as exc:
                results[index] = (type(exc).__name__, time.monotonic() - signalled[0])
            finally:
                connection.close()

        senders = [threading.Thread(target=send, args=(index,)) for index in range(8)]
        for sender in senders:
            sender.start()
        # The signal goes once every request is in the callable (each prints a line as it enters,
        # then takes 2 s: 8 instances), whatever the machine's load; each wait is bounded.
        lines: queue.Queue = queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True)
        reader.start()
        for _ in range(8):
            assert lines.get(timeout=60).strip() == "entered", "a request did not reach the callable"
        signalled[0] = time.monotonic()
        process.send_signal(signum)
        for sender in senders:
            sender.join(TIMEOUT_S)
        process.wait(TIMEOUT_S)
        reader.join(TIMEOUT_S)
        out = "".join(lines.queue)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0 and "served" in out
    for index in range(8):
        status, body = results[index]
        assert status == 200 and body["outputs"][0]["data"] == [float(index), -float(index)], results
