"""The case ``bench.backend_cold`` copies into a tree's tests/unit and runs there (pytest fixtures of that tree)."""

import importlib
import json
import os
import statistics
import time
from typing import Any, Callable, Dict, List

import numpy as np

from bench.models import identity

# The tree's unit-test fakes and fixtures, imported by name: they are test code, outside what mypy checks.
_backend_kind_tests = importlib.import_module("tests.unit.test_backend_kind")
_stub_tests = importlib.import_module("tests.unit.test_stub")
_model, _no_main_module, inline = (
    _backend_kind_tests._model,
    _backend_kind_tests._no_main_module,
    _backend_kind_tests.inline,
)
FakeRequest, setup, stub = _stub_tests.FakeRequest, _stub_tests.setup, _stub_tests.stub


def test_cold(setup: Any, inline: Any) -> None:
    if setup.stub._NUMPY2:  # one path: the stub's numpy 1.x (the setup fixture runs both)
        return
    setup.worker()
    model = _model(setup, inline, identity, outputs=("OUTPUT",))
    pb_utils: Any = importlib.import_module("triton_python_backend_utils")  # the fake

    def by_name(request: Any, name: str) -> Any:  # pb_utils.get_input_tensor_by_name, which the fake lacks
        for tensor in request.inputs():
            if tensor.name() == name:
                return tensor
        return None

    def floor(requests: List[Any]) -> List[Any]:  # bench.models' plain identity model
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", by_name(r, "INPUT").as_numpy())]) for r in requests
        ]

    evict = np.zeros(16 << 20, np.uint8)
    inputs = {"INPUT": np.ones((1, 16), np.float32)}
    calls: Dict[str, Callable[[List[Any]], Any]] = {"floor": floor, "model": model.execute}
    spent: Dict[str, List[int]] = {name: [] for name in calls}
    for _ in range(int(os.environ.get("BACKEND_COLD_CALLS", "3000"))):
        for name, call in calls.items():
            requests = [FakeRequest(inputs)]
            evict[::64] += 1
            started = time.perf_counter_ns()
            call(requests)
            spent[name].append(time.perf_counter_ns() - started)
    with open(os.environ["BACKEND_COLD_OUT"], "w") as file:
        json.dump({name: statistics.median(values) / 1e3 for name, values in spent.items()}, file)
