"""Callables of e2e test modules that serve them on every instance kind (tests/e2e/_kinds.py).

A backend instance's stub unpickles its callable, which imports the callable's module: kept apart
from the test modules so that each stub imports numpy and pytriton only (not pytest, tritonclient
and the tests' fixtures). What a test must observe of a call from another process travels in the
call's outputs or in files (the stub does not share this process's memory).
"""

from __future__ import annotations

import json
import time

import numpy as np

from pytriton.decorators import batch, current_requests

# tests/e2e/test_clients.py


@batch
def add_sub(a, b):
    return {"add": a + b, "sub": a - b}


@batch
def params_echo(x):
    encoded = [json.dumps(r.parameters or {}, sort_keys=True).encode() for r in current_requests()]
    return {"params": np.array([[e] for e in encoded], dtype=object)}


def no_batch(requests):
    return [{"y": r["x"] * 2} for r in requests]


@batch
def slow(x):
    time.sleep(float(x[0, 0]))
    return {"y": x}


def fails(requests):
    raise KeyError("missing vocabulary entry")


@batch
def tokens(n):
    for step in range(int(n[0, 0])):
        yield {"token": np.full((len(n), 1), step, dtype=np.int32)}
