"""The callables' metrics on Triton's own /metrics endpoint, next to Triton's (docs/metrics.md).

One server for the module: a model whose callable answers, raises on a negative input and blocks
for the input 7 until the test releases it, on a thread and on a backend instance (tests/e2e/_kinds.py;
the callable, in tests/e2e/kind_models.py, signals through files); the test scrapes ``/metrics`` and
parses the Prometheus text.
"""

from __future__ import annotations

import pathlib
import re
import threading
import urllib.request
from typing import Dict, Tuple

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.server.process import listening_probe
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports, wait_for
from tests.e2e._kinds import KINDS, model
from tests.e2e.kind_models import Metered

MODEL = "Metered"
LABELS = {"version": "1", "instance": "0", "generation": "0"}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
Samples = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Prometheus text exposition: {(name, sorted labels): value}."""
    samples: Samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        labels = tuple(sorted(_LABEL.findall(match.group(2) or "")))
        samples[(match.group(1), labels)] = float(match.group(3))
    return samples


class Server:
    """The module's server, seen through the model of one instance kind (``notes``: its callable's files)."""

    def __init__(self, ports: Dict[str, int], kind: str, notes: pathlib.Path):
        self.model = model(MODEL, kind)
        self.notes = notes
        self.metrics_url = f"http://127.0.0.1:{ports['metrics_port']}/metrics"
        self.http_url = f"127.0.0.1:{ports['http_port']}"
        self.client = httpclient.InferenceServerClient(self.http_url)

    def release(self) -> None:
        (self.notes / "state.release").touch()

    def scrape(self) -> Samples:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            return parse(response.read().decode())

    def value(self, name: str, samples: Samples = None, **labels: str) -> float:
        samples = self.scrape() if samples is None else samples
        return samples.get((name, tuple(sorted({**LABELS, "model": self.model, **labels}.items()))), float("nan"))

    def infer(self, value: float, client: httpclient.InferenceServerClient = None) -> np.ndarray:
        data = np.full((1, 2), value, np.float32)
        tensor = httpclient.InferInput("x", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        return (client or self.client).infer(self.model, [tensor]).as_numpy("y")

    def infer_on_own_client(self, value: float) -> None:
        """From another thread: tritonclient.http's connections belong to the thread that made them."""
        client = httpclient.InferenceServerClient(self.http_url)
        try:
            self.infer(value, client)
        finally:
            client.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    ports = triton_ports()
    with Triton(config=TritonConfig(**ports)) as triton:
        states = {}
        for kind in KINDS:
            states[kind] = Server(ports, kind, tmp_path_factory.mktemp(f"metrics-{kind}"))
            triton.bind(
                model(MODEL, kind),
                batch(Metered(str(states[kind].notes))),
                [Tensor(name="x", shape=(2,), dtype=np.float32)],
                [Tensor(name="y", shape=(2,), dtype=np.float32)],
                config=ModelConfig(max_batch_size=8),
                instance_kind=kind,
            )
        triton.run()
        # run() returns only once the metrics port listens too (Triton opens it after HTTP; CI once had
        # this module's first scrape refused when run() did not wait for it): no wait here.
        assert listening_probe("127.0.0.1", ports["metrics_port"])(), "run() returned before the metrics port opened"
        yield states
        for state in states.values():
            state.release()
            state.client.close()


@pytest.fixture
def server(servers, kind):
    return servers[kind]


def test_the_callables_metrics_move_with_requests_and_sit_next_to_tritons(server):
    # The series exist at zero once the instance is up (created by the stub's metrics thread).
    assert wait_for(lambda: server.value("pytriton_batch_size_count") == 0, timeout_s=10)
    assert server.value("pytriton_callable_errors_total") == 0
    for _ in range(5):
        np.testing.assert_array_equal(server.infer(1.5), [[3.0, 3.0]])
    with pytest.raises(InferenceServerException, match="ValueError: negative input"):
        server.infer(-1.0)

    # The stub pushes its counts once per second: wait for the last batch to show.
    assert wait_for(lambda: server.value("pytriton_batch_size_count") == 6, timeout_s=10)
    samples = server.scrape()
    value = lambda name, **labels: server.value(name, samples, **labels)  # noqa: E731
    assert value("pytriton_batch_size_sum") == 6  # requests
    assert value("pytriton_batch_size_bucket", le="1") == 6 and value("pytriton_batch_size_bucket", le="+Inf") == 6
    assert value("pytriton_callable_errors_total") == 1
    assert value("pytriton_callable_duration_seconds_count") == 6
    assert value("pytriton_callable_duration_seconds_bucket", le="+Inf") == 6
    assert 0 < value("pytriton_callable_duration_seconds_sum") < 60
    assert value("pytriton_requests_in_flight") == 0
    assert value("pytriton_stub_reconnects_total") == 0
    # Triton's own metrics for the same model, in the same scrape. Triton 2.51 counts the request the
    # callable failed as a success: the Python backend answered it with an error response, which is
    # why pytriton_callable_errors_total exists (docs/metrics.md).
    triton_labels = {("model", server.model), ("version", "1")}
    success = [v for (name, labels), v in samples.items() if name == "nv_inference_request_success" and triton_labels <= set(labels)]  # fmt: skip
    failure = [v for (name, labels), v in samples.items() if name == "nv_inference_request_failure" and triton_labels <= set(labels)]  # fmt: skip
    assert success == [6.0] and sum(failure) == 0.0


def test_requests_in_flight_while_the_callable_runs(server):
    running = server.notes / "state.running"
    thread = threading.Thread(target=server.infer_on_own_client, args=(7.0,), daemon=True)
    thread.start()
    try:
        assert wait_for(running.exists, timeout_s=10)
        assert wait_for(lambda: server.value("pytriton_requests_in_flight") == 1, timeout_s=10)
    finally:
        server.release()
        thread.join(30)
    assert not thread.is_alive()
    assert wait_for(lambda: server.value("pytriton_requests_in_flight") == 0, timeout_s=10)
    duration = server.value("pytriton_callable_duration_seconds_sum")
    assert duration > 0
