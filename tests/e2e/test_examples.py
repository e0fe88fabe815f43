"""The examples run and print what they promise."""

import os
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import needs_stub_strings, triton_ports

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"


@pytest.mark.parametrize(
    "script, expected",
    [
        ("quickstart.py", "a + b = [1.5 2.5 3.5]"),
        pytest.param("streaming.py", "6 time", marks=needs_stub_strings),
        ("instances.py", "y = [0. 2. 4.]"),
        ("legacy_client.py", "async requests completed: 4"),
        ("embedded_unit_test.py", "3 of 3 model tests passed, with no port"),
        pytest.param("openai_chat.py", "streamed 9 tokens: You |said: |streams ", marks=needs_stub_strings),
        ("sequences.py", "sequence 4: total 20"),
        ("cancellation.py", "the instance serves again"),
        ("pipeline.py", "grpc: inner error reaches the client"),
    ],
)
def test_example_runs(script, expected):
    env = dict(os.environ)
    for field, port in triton_ports().items():
        env[f"PYTRITON_TRITON_CONFIG_{field.upper()}"] = str(port)
    completed = subprocess.run(
        [sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert expected in completed.stdout
    # DCGM's "Error: Failed to initialize NVML" on a machine without a GPU is kept out of the output
    # (pytriton.inprocess keeps GPU metrics off there unless log_verbose is set).
    assert "NVML" not in completed.stderr, completed.stderr[-2000:]
