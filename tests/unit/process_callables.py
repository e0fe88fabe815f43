"""Callables for tests/unit/test_process_instances.py, importable by a worker process."""

from __future__ import annotations

import ctypes
import logging
import os
import time

import numpy as np

from pytriton.decorators import batch, fill_optionals
from pytriton.exceptions import PyTritonUnrecoverableError

LOGGER = logging.getLogger("tests.process_callables")


def echo(requests):
    """``k`` back as ``y``; k == -1: segfault; k == -2: log a warning first; k == -3: unrecoverable."""
    value = int(requests[0]["k"].ravel()[0])
    if value == -1:
        ctypes.string_at(0)  # SIGSEGV in the worker process
    if value == -2:
        LOGGER.warning("worker %d saw -2", os.getpid())
    if value == -3:
        raise PyTritonUnrecoverableError("cannot go on")
    return [{"y": r["k"]} for r in requests]


def sleeps_on_negative(requests):
    """``k`` back as ``y``; a negative k first sleeps -k seconds (a call that runs too long)."""
    value = int(requests[0]["k"].ravel()[0])
    if value < 0:
        time.sleep(-value)
    return [{"y": r["k"]} for r in requests]


def pid(requests):
    return [{"y": np.full((len(r["k"]), 1), os.getpid(), dtype=np.int32)} for r in requests]


@batch
def doubled(k):
    return {"y": k * 2}


@fill_optionals(k=np.array([5], dtype=np.int32))
@batch
def needs_the_model_config(k):
    """``fill_optionals`` reads the model config through the Triton context attached in the worker."""
    return {"y": k}


class Counter:
    """A callable object: its state (``start``) travels by pickling, ``calls`` grows in the worker only."""

    def __init__(self, start: int):
        self.start = start
        self.calls = 0

    @batch
    def infer(self, k):
        self.calls += 1
        return {"y": k + self.start + self.calls - 1}

    def __call__(self, requests):
        return self.infer(requests)


class Offset:
    """Takes arrays, not requests: for ``batch(Offset(n))`` applied at bind time."""

    def __init__(self, offset: int):
        self.offset = offset

    def __call__(self, k):
        return {"y": k + self.offset}
