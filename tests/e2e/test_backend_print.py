"""A backend instance's ``print`` reaches this process's stdout and stderr (stubside/_stub_print.py).

The callable runs in Triton's stub process, whose output is the server's; pytriton forwards the
printed lines back. One server for the module; the lines are awaited (bounded) in pytest's capture.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from pytriton.client import ModelClient
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports
from tests.e2e.print_models import talkative


@pytest.fixture(scope="module")
def triton():
    with Triton(config=TritonConfig(**triton_ports())) as triton:
        triton.bind(
            "Talkative",
            talkative,
            [Tensor(name="x", shape=(-1,), dtype=np.float32)],
            [Tensor(name="y", shape=(-1,), dtype=np.float32)],
            config=ModelConfig(max_batch_size=4),
            instance_kind="backend",
        )
        triton.run()
        yield triton


def test_print_in_a_backend_callable_reaches_this_processs_stdout_and_stderr(triton, capfd):
    with ModelClient(triton.http_url, "Talkative") as client:
        assert client.infer_sample(np.ones(2, np.float32))["y"].tolist() == [1.0, 1.0]
    out, err = "", ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and ("stub says" not in out or "stub warns" not in err):
        captured = capfd.readouterr()
        out, err = out + captured.out, err + captured.err
        time.sleep(0.05)
    assert "stub says: batch of 1\n" in out
    assert "stub warns: on stderr\n" in err
    assert "@pytriton-output" not in out + err  # the marker is the server log's, not the user's
    # The server's log keeps the line with the instance it came from.
    assert any(line.endswith("|stub says: batch of 1") and "Talkative/0" in line for line in triton.server_log)
