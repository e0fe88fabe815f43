"""The case ``bench.backend_cold`` copies into a tree's tests/unit and runs there (pytest fixtures of that tree)."""

import json
import os
import statistics
import time

import numpy as np

from bench.models import identity
from tests.unit.test_backend_kind import _model, _no_main_module, inline  # noqa: F401 - fixtures
from tests.unit.test_stub import FakeRequest, setup, stub  # noqa: F401 - fixtures


def test_cold(setup, inline):  # noqa: F811
    if setup.stub._NUMPY2:  # one path: the stub's numpy 1.x (the setup fixture runs both)
        return
    setup.worker()
    model = _model(setup, inline, identity, outputs=("OUTPUT",))
    import triton_python_backend_utils as pb_utils

    def by_name(request, name):  # pb_utils.get_input_tensor_by_name, which the fake lacks
        for tensor in request.inputs():
            if tensor.name() == name:
                return tensor
        return None

    def floor(requests):  # bench.models' plain identity model
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", by_name(r, "INPUT").as_numpy())]) for r in requests
        ]

    evict = np.zeros(16 << 20, np.uint8)
    inputs = {"INPUT": np.ones((1, 16), np.float32)}
    calls = {"floor": floor, "model": model.execute}
    spent = {name: [] for name in calls}
    for _ in range(int(os.environ.get("BACKEND_COLD_CALLS", "3000"))):
        for name, call in calls.items():
            requests = [FakeRequest(inputs)]
            evict[::64] += 1
            started = time.perf_counter_ns()
            call(requests)
            spent[name].append(time.perf_counter_ns() - started)
    with open(os.environ["BACKEND_COLD_OUT"], "w") as file:
        json.dump({name: statistics.median(values) / 1e3 for name, values in spent.items()}, file)
