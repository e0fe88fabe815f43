"""What one call of the Python backend's custom-metric API costs inside a stub.

Usage::

    python -m bench.metric_api_cost [CALLS]

Starts a server with pytriton, loads a plain Python-backend model next to a bound one, and asks
it to time ``CALLS`` (default 2000) calls each of ``Metric.observe`` (histogram), ``increment``
(counter) and ``set`` (gauge) inside its ``execute``. Each is a round trip from the stub to the
server process; the figure is why pytriton's stub counts in its own memory and pushes the changes
from a thread once per second (pytriton/proxy/stubside/_stub_metrics.py, docs/metrics.md). It then times
what pytriton does per batch instead (``hot_path``): the stub's counting with the metrics on and
off, and the worker's final reply with and without the duration field (``timeit``, best of 5).
"""

from __future__ import annotations

import json
import sys
import tempfile
import timeit
import types
from typing import Any, Dict, List

import numpy as np
import tritonclient.http as httpclient

from bench.__main__ import free_ports
from pytriton.decorators import batch
from pytriton.model_config import Tensor
from pytriton.proxy.stubside import _messages, _stub_metrics
from pytriton.triton import Triton, TritonConfig

_MODEL = """
import json, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        kinds = pb_utils.MetricFamily
        self.families = [
            kinds(name="bench_api_histogram", description="bench", kind=kinds.HISTOGRAM),
            kinds(name="bench_api_counter", description="bench", kind=kinds.COUNTER),
            kinds(name="bench_api_gauge", description="bench", kind=kinds.GAUGE),
        ]
        self.histogram = self.families[0].Metric(labels={"m": "x"}, buckets=[0.001, 0.01, 0.1])
        self.counter = self.families[1].Metric(labels={"m": "x"})
        self.gauge = self.families[2].Metric(labels={"m": "x"})

    def execute(self, requests):
        calls = int(requests[0].inputs()[0].as_numpy().flat[0])
        timings = {}
        for name, call in (("observe", lambda: self.histogram.observe(0.005)),
                           ("increment", lambda: self.counter.increment(1)),
                           ("set", lambda: self.gauge.set(3))):
            started = time.perf_counter()
            for _ in range(calls):
                call()
            timings[name] = (time.perf_counter() - started) / calls * 1e6
        text = np.array([json.dumps(timings).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", text)]) for _ in requests]
"""
_CONFIG = """name: "metric_api"
backend: "python"
max_batch_size: 0
input [{ name: "CALLS" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "OUT" data_type: TYPE_STRING dims: [1] }]
instance_group [{ kind: KIND_CPU count: 1 }]
"""


@batch
def _identity(x: Any) -> Dict[str, Any]:
    return {"y": x}


def run(calls: int = 2000, rounds: int = 3) -> List[Dict[str, float]]:
    """Microseconds per call of each operation, one dict per round."""
    http_port, grpc_port, metrics_port = free_ports(3)
    with tempfile.TemporaryDirectory(prefix="pytriton-bench-metric-api-") as directory:
        config = TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
        with Triton(config=config, workspace=directory) as triton:
            spec = Tensor(name="x", shape=(1,), dtype=np.float32)
            triton.bind("identity", _identity, [spec], [Tensor(name="y", shape=(1,), dtype=np.float32)])
            triton.run()
            repository = triton._repository
            assert repository is not None
            (repository / "metric_api" / "1").mkdir(parents=True)
            (repository / "metric_api" / "1" / "model.py").write_text(_MODEL)
            (repository / "metric_api" / "config.pbtxt").write_text(_CONFIG)
            triton._backend.repository_request("load", "metric_api")
            client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
            try:
                results = []
                for _ in range(rounds):
                    tensor = httpclient.InferInput("CALLS", [1], "INT32")
                    tensor.set_data_from_numpy(np.array([calls], np.int32))
                    out = client.infer("metric_api", [tensor]).as_numpy("OUT")
                    results.append(json.loads(out[0]))
                return results
            finally:
                client.close()


def hot_path(number: int = 100_000) -> Dict[str, float]:
    """Nanoseconds per batch of what the stub and the worker do for the metrics (no metric API call)."""
    metrics = _stub_metrics.StubMetrics(
        types.ModuleType("unused"), model="m", version="1", instance=0, max_batch_size=32
    )  # not started
    null = _stub_metrics.NULL
    final = _messages.Ok(None, []).settled(False, 0.0003)

    def counted(counter: _stub_metrics.NullMetrics) -> None:
        counter.enter(1)
        counter.settled(final)
        counter.leave()

    def best(statement: Any) -> float:
        return min(timeit.repeat(statement, number=number, repeat=5)) / number * 1e9

    return {
        "stub, metrics on": best(lambda: counted(metrics)),
        "stub, metrics off": best(lambda: counted(null)),
        "worker reply with duration": best(lambda: _messages.Ok(None, []).settled(False, 0.1)),
        "worker reply without": best(lambda: _messages.Ok(None, [])),
    }


def main() -> int:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for result in run(calls):
        print("  ".join(f"{name} {value:.1f} us" for name, value in result.items()) + f"   ({calls} calls each)")
    print("per batch: " + ", ".join(f"{name} {value:.0f} ns" for name, value in hot_path().items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
