"""Inference callables for tests/e2e/test_process_instances.py, importable by a worker process.

Kept apart from the test module so that a worker process imports numpy and pytriton only (not
pytest and the test's fixtures) when it unpickles its callable.
"""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np

from pytriton.decorators import batch


def pid_echo(requests):
    """Each request's ``x`` back, with the pid of the process that ran it."""
    return [{"x": r["x"], "pid": np.full((len(r["x"]), 1), os.getpid(), dtype=np.int64)} for r in requests]


@batch
def doubled(x):
    """A ``@batch`` function defined at module level: pickled by name."""
    return {"y": x * 2}


class Scaler:
    """A callable object; its state travels to the worker process by pickling."""

    def __init__(self, factor: float):
        self.factor = factor
        self.calls = 0

    @batch
    def __call__(self, x):
        self.calls += 1
        return {"y": x * self.factor}


async def async_echo(requests):
    await asyncio.sleep(0)
    return [{"y": r["x"] + 1} for r in requests]


def tokens(requests):
    """A generator (decoupled model): ``n`` responses per request."""
    (request,) = requests
    for step in range(int(request["n"].ravel()[0])):
        yield [{"token": np.full((len(request["n"]), 1), step, dtype=np.int32)}]


def fails_or_crashes(requests):
    """x == 1: raise; x == 2: end the worker process at once; else echo."""
    value = int(requests[0]["x"].ravel()[0])
    if value == 1:
        raise ValueError("bad value 1")
    if value == 2:
        os._exit(3)
    return [{"y": r["x"]} for r in requests]


def slow_echo(requests):
    """Echo after 0.3 s: keeps a batch in flight while ``Triton.stop`` drains."""
    import time

    time.sleep(0.3)
    return [{"y": r["x"]} for r in requests]


def slower_echo(requests):
    """``x`` back after 0.8 s (a batch still running when stop() drains)."""
    import time

    time.sleep(0.8)
    return [{"y": r["x"]} for r in requests]


def scaled(factor, requests):
    """``x * factor``; bound as ``functools.partial(scaled, factor)`` (one per model version)."""
    return [{"y": r["x"] * factor} for r in requests]


CALLS = [0]


def call_count(requests):
    """``x`` back with how many batches this process has run (Triton's warmup included)."""
    CALLS[0] += 1
    return [{"y": r["x"], "calls": np.full((len(r["x"]), 1), CALLS[0], np.int64)} for r in requests]


KEPT: list = []


def keep_inputs(requests):
    """Keeps every ``x`` it gets; answers the sums of the first three kept (0 for those not yet kept)."""
    results = []
    for r in requests:
        KEPT.append(r["x"])
        sums = [float(kept.sum()) for kept in KEPT[:3]] + [0.0] * (3 - len(KEPT[:3]))
        results.append({"sums": np.array([sums] * len(r["x"]), np.float32)})
    return results


def doomed(requests):
    from pytriton.exceptions import PyTritonUnrecoverableError

    raise PyTritonUnrecoverableError("the GPU caught fire")


class SlowToLoad:
    """An echo whose unpickling takes ``load_s`` seconds, as loading a model in a backend instance's stub would.

    Only the process that unpickles it (the stub) waits; binding it pickles it at once.
    """

    def __init__(self, load_s: float):
        self.load_s = load_s

    def __setstate__(self, state):
        self.__dict__.update(state)
        time.sleep(self.load_s)

    def __call__(self, requests):
        return [{"y": request["x"]} for request in requests]
