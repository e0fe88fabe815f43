"""What differs between the supported Triton builds, pinned against the build this run selected.

The build is ``PYTRITON_TRITON_VERSION`` (default 2.51; ``make test-triton-older`` runs this module
on 2.48). Each test asserts what the selected build does, so the same test passes on every build and
fails when a build behaves otherwise than docs/configuration.md ("Triton versions") says:

- a request that is in a stub when the stub dies: 2.51 fails it ("Stub process ... is not healthy"),
  2.48 to 2.50 never answer it (gate ``dead-stub-request-unanswered``, pytriton/server/versions.py),
  and pytriton then logs a warning saying so; on every build the model is replaced and serves the
  requests that follow, and a second model serves throughout.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from pytriton.model_config import ModelConfig, Tensor
from pytriton.server import _recycle, versions
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports, wait_for

SELECTED = versions.selected_version()
UNANSWERED = versions.DEAD_STUB_REQUEST_UNANSWERED.active(SELECTED)
# The held request's client timeout: where the server answers it (2.51: within about 2 s of the
# stub's death, its health poll) a generous bound; where it never does, the time taken to show that.
HELD_TIMEOUT_S = 5.0 if UNANSWERED else 30.0

ENTERED = threading.Event()  # the held request reached the callable
RELEASE = threading.Event()  # set once its stub was killed: the callable returns (to no one)
HOLD = threading.Event()  # set while the next call should be held


def held(requests):
    if HOLD.is_set():
        HOLD.clear()
        ENTERED.set()
        RELEASE.wait(60)
    return [{"y": r["x"]} for r in requests]


def echo(requests):
    return [{"y": r["x"]} for r in requests]


X = [Tensor(name="x", shape=(-1,), dtype=np.float32)]
Y = [Tensor(name="y", shape=(-1,), dtype=np.float32)]


@pytest.fixture(scope="module")
def triton():
    with Triton(config=TritonConfig(**triton_ports())) as triton:
        # One instance each, no batching: the held request is surely in the stub that is killed.
        triton.bind("Held", held, X, Y, config=ModelConfig(batching=False))
        triton.bind("Beside", echo, X, Y, config=ModelConfig(batching=False))
        triton.run()
        try:
            yield triton
        finally:
            RELEASE.set()  # a call still held (a failed test) returns before the stop


def _infer(triton, model, timeout_s):
    """("ok", None) for a correct answer, ("error", text) for an error response, ("timeout", None) for none."""
    client = httpclient.InferenceServerClient(triton.http_url[len("http://") :], network_timeout=timeout_s)
    x = np.arange(3, dtype=np.float32)
    tensor = httpclient.InferInput("x", [3], "FP32")
    tensor.set_data_from_numpy(x)
    try:
        np.testing.assert_array_equal(client.infer(model, [tensor]).as_numpy("y"), x)
        return "ok", None
    except TimeoutError:
        return "timeout", None
    except Exception as exc:  # noqa: BLE001 - the error text is what the test compares
        if "timed out" in str(exc):
            return "timeout", None
        return "error", str(exc)
    finally:
        client.close()


def _stub_pids(server_pid, model):
    """Pids of the live stub processes of ``model`` under the server."""
    return _recycle.model_stubs(server_pid, model)


def test_a_request_in_a_stub_that_dies_is_failed_or_left_unanswered_as_the_build_does(triton, caplog):
    caplog.set_level(logging.WARNING, logger="pytriton._healing")
    assert _infer(triton, "Held", 30.0) == ("ok", None)
    server_pid = triton._backend.server.pid
    stubs = _stub_pids(server_pid, "Held")
    assert len(stubs) == 1, stubs

    outcome = []
    HOLD.set()
    sender = threading.Thread(target=lambda: outcome.append(_infer(triton, "Held", HELD_TIMEOUT_S)), daemon=True)
    sender.start()
    assert ENTERED.wait(30), "the held request never reached the callable"
    started = time.monotonic()
    os.kill(stubs[0], signal.SIGKILL)
    RELEASE.set()  # its reply goes to a stub that is gone
    beside = [_infer(triton, "Beside", 30.0) for _ in range(5)]  # healthy traffic meanwhile
    sender.join(HELD_TIMEOUT_S + 30)
    assert not sender.is_alive()
    waited_s = time.monotonic() - started

    if UNANSWERED:
        assert outcome == [("timeout", None)], f"Triton {SELECTED} answered the dead stub's request: {outcome}"
    else:
        assert len(outcome) == 1 and outcome[0][0] == "error", outcome
        assert "not healthy" in outcome[0][1], outcome
        assert waited_s < HELD_TIMEOUT_S
    assert beside == [("ok", None)] * 5

    # Every build: the model is replaced (a new stub), serves the requests that follow, and the
    # server was not restarted for it. Short client timeouts: on 2.48 to 2.50 a request queued behind
    # the wedged instance before the new generation took over is never answered either.
    assert wait_for(lambda: _infer(triton, "Held", 2.0) == ("ok", None), 60, 0.1), "Held did not serve again"
    assert all(_infer(triton, "Held", 30.0) == ("ok", None) for _ in range(10))
    assert triton._backend.server.pid == server_pid
    assert stubs[0] not in _stub_pids(server_pid, "Held")

    warned = [r.getMessage() for r in caplog.records if "is never answered" in r.getMessage()]
    if UNANSWERED:
        assert warned and f"Triton {SELECTED}" in warned[0], [r.getMessage() for r in caplog.records]
    else:
        assert not warned, warned
