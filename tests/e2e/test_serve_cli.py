"""``pytriton serve MODULE:ATTRIBUTE`` with a real server: both target kinds, SIGTERM, --reload, bad targets.

Each test runs the command as a child process on free ports of 127.0.0.1 and talks to it with raw
``tritonclient``. Every wait is bounded in time.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time
from typing import Dict, List

import numpy as np
import pytest
import tritonclient.grpc
import tritonclient.http

from tests.conftest import triton_ports

APP = """
import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton

VALUE = {value}


@batch
def infer(x):
    return {{"y": x * 0 + VALUE}}


def bind_models(triton):
    triton.bind(
        "Const",
        infer,
        inputs=[Tensor(name="x", shape=(-1,), dtype=np.float32)],
        outputs=[Tensor(name="y", shape=(-1,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=8),
    )


triton = Triton()
bind_models(triton)
"""


def write_app(directory: pathlib.Path, value: float) -> None:
    path = directory / "served_app.py"
    path.write_text(textwrap.dedent(APP.format(value=value)))
    # A rewrite within the same clock tick must still look changed to the mtime poll.
    stamp = time.time() + value
    os.utime(path, (stamp, stamp))


def start(directory: pathlib.Path, target: str, ports: Dict[str, int], *extra: str) -> subprocess.Popen:
    command: List[str] = [sys.executable, "-m", "pytriton", "serve", target, "--host", "127.0.0.1"]
    command += ["--app-dir", str(directory), "--log-level", "info", *extra]
    for field, port in ports.items():
        command += [f"--{field.replace('_', '-')}", str(port)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def answer(ports: Dict[str, int], timeout_s: float = 120.0) -> float:
    """The model's answer over HTTP, waiting (bounded) until the server is there and ready."""
    deadline = time.monotonic() + timeout_s
    last: BaseException = TimeoutError("never asked")
    while time.monotonic() < deadline:
        try:
            with tritonclient.http.InferenceServerClient(f"127.0.0.1:{ports['http_port']}") as client:
                inputs = [tritonclient.http.InferInput("x", [1, 2], "FP32")]
                inputs[0].set_data_from_numpy(np.zeros((1, 2), np.float32))
                return float(client.infer("Const", inputs).as_numpy("y")[0, 0])
        except Exception as exc:  # not up yet, or being restarted
            last = exc
            time.sleep(0.2)
    raise AssertionError(f"no answer in {timeout_s} s: {last}")


def stop(process: subprocess.Popen, timeout_s: float = 90.0) -> str:
    """SIGTERM, then the exit status must come within ``timeout_s``; the output."""
    process.send_signal(signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(f"did not stop after SIGTERM:\n{output[-3000:]}") from None
    return output


def test_a_triton_attribute_serves_over_http_and_grpc_and_sigterm_exits_0(tmp_path):
    write_app(tmp_path, 3.0)
    ports = triton_ports()
    process = start(tmp_path, "served_app:triton", ports)
    try:
        assert answer(ports) == 3.0
        with tritonclient.grpc.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}") as client:
            inputs = [tritonclient.grpc.InferInput("x", [1, 2], "FP32")]
            inputs[0].set_data_from_numpy(np.ones((1, 2), np.float32))
            assert client.infer("Const", inputs).as_numpy("y").tolist() == [[3.0, 3.0]]
    finally:
        output = stop(process)
    assert process.returncode == 0, output[-3000:]


def test_a_bind_function_is_served_on_the_commands_ports(tmp_path):
    write_app(tmp_path, 5.0)
    ports = triton_ports()
    process = start(tmp_path, "served_app:bind_models", ports)
    try:
        assert answer(ports) == 5.0
    finally:
        output = stop(process)
    assert process.returncode == 0, output[-3000:]


# An application whose start goes on after a model answers: "Warm" is loaded once the server is up (it has a
# warmup) and its warmup waits (bounded) until the test creates the gate file.
SLOW_START_APP = """
import os
import time

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.model_config.common import ModelWarmup, WarmupInput

GATE = {gate!r}


@batch
def const(x):
    return {{"y": x * 0 + 7.0}}


@batch
def warm(x):
    deadline = time.monotonic() + 60.0
    while not os.path.exists(GATE) and time.monotonic() < deadline:
        time.sleep(0.01)
    return {{"y": x}}


def bind_models(triton):
    io = dict(
        inputs=[Tensor(name="x", shape=(-1,), dtype=np.float32)],
        outputs=[Tensor(name="y", shape=(-1,), dtype=np.float32)],
    )
    triton.bind("Const", const, config=ModelConfig(max_batch_size=8), **io)
    warmup = ModelWarmup(name="gate", batch_size=1, inputs={{"x": WarmupInput(np.float32, (2,), zero_data=True)}})
    triton.bind("Warm", warm, config=ModelConfig(max_batch_size=8, model_warmup=[warmup]), **io)
"""


def test_a_sigterm_while_the_start_goes_on_stops_the_command_with_status_0(tmp_path):
    # The race test_a_bind_function_is_served_on_the_commands_ports lost under load, made certain: a model
    # answers while run() still loads the others, and the SIGTERM comes then (it ended the command, -15).
    gate = tmp_path / "warmup-may-end"
    (tmp_path / "slow_start_app.py").write_text(SLOW_START_APP.format(gate=str(gate)))
    ports = triton_ports()
    process = start(tmp_path, "slow_start_app:bind_models", ports)
    try:
        assert answer(ports) == 7.0  # "Warm" is still warming up: run() has not returned
        process.send_signal(signal.SIGTERM)
    except BaseException:
        process.kill()
        raise
    finally:
        gate.touch()  # the start ends; the SIGTERM it had received then stops the server
    try:
        output, _ = process.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(f"did not stop after SIGTERM:\n{output[-3000:]}") from None
    assert process.returncode == 0, output[-3000:]
    assert "Triton stopped" in output, output[-3000:]  # the drain ran: the signal was handled, not fatal


def test_reload_serves_the_changed_source(tmp_path):
    write_app(tmp_path, 1.0)
    ports = triton_ports()
    process = start(tmp_path, "served_app:bind_models", ports, "--reload")
    try:
        assert answer(ports) == 1.0
        write_app(tmp_path, 2.0)
        deadline = time.monotonic() + 120
        seen = 1.0
        while seen != 2.0 and time.monotonic() < deadline:
            seen = answer(ports, timeout_s=max(1.0, deadline - time.monotonic()))
        assert seen == 2.0
    finally:
        output = stop(process)
    assert process.returncode == 0, output[-3000:]
    assert "restarting the server" in output
    # The reloading parent's child server is gone with it: nothing answers on the port any more.
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", ports["http_port"])) != 0


@pytest.mark.parametrize(
    "target, message",
    [
        ("no_such_module:triton", "no module named 'no_such_module'"),
        ("served_app:tritn", "has no attribute 'tritn'"),
        ("served_app:VALUE", "is a float; it must be a Triton"),
    ],
)
def test_a_target_that_cannot_work_exits_2_and_says_why(tmp_path, target, message):
    write_app(tmp_path, 0.0)
    process = start(tmp_path, target, triton_ports())
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 2, output[-3000:]
    assert message in output
