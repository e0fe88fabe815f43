"""Self-healing pieces without a server: exit descriptions, crash lines, the restart settings' validation, the
watchdog's ``pgid`` lines, the guard that only ever kills stub processes, the validation of
``ModelConfig.execution_timeout_s``, and which lost stubs get replaced (``pytriton/_serving/supervisor.py``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from pytriton._exit import describe_exit
from pytriton._platform import watchdog as _watchdog
from pytriton._serving.backend import State
from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config import ModelConfig, Tensor
from pytriton.server.process import TritonServerProcess, kill_stub
from pytriton.triton import Triton, TritonLifecyclePolicy
from tests.conftest import process_group_alive, wait_for


def test_describe_exit():
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-signal.SIGABRT) == "killed by SIGABRT"
    assert describe_exit(1) == "exit code 1"


def test_crash_lines_quote_the_reason_not_the_backtrace():
    process = TritonServerProcess(["tritonserver"], {})
    for line in [
        'I1123 12:00:00.000 1 http_server.cc:4713] "Started HTTPService at 127.0.0.1:8000"',
        'E1123 12:00:00.000 1 server.cc:241] "CudaDriverHelper has not been initialized."',
        "terminate called after throwing an instance of 'std::bad_alloc'",
        "  what():  std::bad_alloc",
        "Signal (6) received.",
        " 0# 0x000055BA3551F52D in /opt/tritonserver/bin/tritonserver",
        " 1# abort in /lib/x86_64-linux-gnu/libc.so.6",
    ]:
        process._lines.append(line)
    assert process.crash_lines() == [
        "terminate called after throwing an instance of 'std::bad_alloc'",
        "what():  std::bad_alloc",
        "Signal (6) received.",
    ]
    quiet = TritonServerProcess(["tritonserver"], {})
    quiet._lines.extend(["one", "", "two", " 3# frame"])
    assert quiet.crash_lines() == ["one", "two"]


@pytest.mark.parametrize(
    "kwargs", [{"max_server_restarts": -1}, {"max_server_restarts": True}, {"restart_window_s": 0}]
)
def test_restart_settings_are_validated(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(PyTritonBadParameterError, match=rf"^{name} must be .*, got {re.escape(repr(kwargs[name]))}\.$"):
        Triton(**kwargs)


def _sleeper_group():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


def test_watchdog_kills_the_server_group_it_was_told_about_last(tmp_path):
    first, restarted = _sleeper_group(), _sleeper_group()
    read_fd, write_fd = os.pipe()
    watchdog = subprocess.Popen(
        [
            sys.executable,
            "-S",
            _watchdog.__file__,
            str(read_fd),
            str(first.pid),
            "pytriton-0-unit",
            str(tmp_path / "x"),
        ],
        pass_fds=(read_fd,),
    )
    os.close(read_fd)
    try:
        os.write(write_fd, f"pgid {restarted.pid}\n".encode())
    finally:
        os.close(write_fd)  # the user's process "died" without sending done
    assert watchdog.wait(20) == 0
    restarted.wait(10)
    assert wait_for(lambda: not process_group_alive(restarted.pid), 10)
    # The first group belongs to a server that a restart already ended; its number may have been
    # reused by then, so the watchdog leaves it alone.
    assert first.poll() is None
    first.kill()
    first.wait()


def test_kill_stub_leaves_other_processes_alone():
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert kill_stub(other.pid) is False
        assert other.poll() is None
        assert kill_stub(2**22 + 12345) is False  # no such process
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "2", True])
def test_execution_timeout_is_validated_at_bind(bad):
    x = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
    offline = TritonLifecyclePolicy(launch_triton_on_startup=False)  # a unit test: no server on entering
    with (
        Triton(triton_lifecycle_policy=offline) as triton,
        pytest.raises(PyTritonBadParameterError, match="execution_timeout_s"),
    ):
        triton.bind("Bad", lambda requests: [], x, x, config=ModelConfig(execution_timeout_s=bad))


def test_a_lost_stub_is_reported_once_and_only_while_running_on_the_current_server():
    triton = Triton()
    x = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
    triton.bind("Model", lambda requests: [], x, x)
    try:
        assert triton._state is State.CREATED
        supervisor = triton._supervisor
        supervisor.on_stub_lost("Model", 0, 42)
        assert supervisor._events.empty()  # not running: nothing to replace
        triton._state = State.RUNNING
        triton._backend._server = SimpleNamespace(pid=42, is_alive=lambda: True)
        supervisor.on_stub_lost("Model", 0, 41)  # a stub of an earlier server: the restart handles it
        supervisor.on_stub_lost("Unbound", 0, 42)  # a model unbound meanwhile: its stubs go away
        assert supervisor._events.empty()
        supervisor.on_stub_lost("Model", 3, 42)
        supervisor.on_stub_lost("Model", 3, 42)  # already being replaced
        assert supervisor._events.get_nowait() == ("stub", ("Model", 3)) and supervisor._events.empty()
        assert supervisor.healing == {"Model"} and not triton.is_alive()
    finally:
        triton._backend._server = None
        assert triton.stop() is True
    assert triton._state is State.STOPPED and triton.stop() is False
