"""Callables of tests/e2e/test_data_path.py that are also bound with ``instance_kind="backend"``.

Kept apart from the test module so that each backend stub, which imports a callable's module to
unpickle it, imports numpy and pytriton only (not pytest, tritonclient and the test's fixtures).
"""

from __future__ import annotations

import asyncio
import json

import numpy as np


def identity(requests):
    return [dict(request.items()) for request in requests]


def identity_renamed(requests):
    return [{"out_" + name[3:]: value for name, value in request.items()} for request in requests]


def add_sub(requests):
    return [{"add": r["a"] + r["b"], "sub": r["a"] - r["b"]} for r in requests]


def echo_parameters(requests):
    return [
        {"params": np.array([[json.dumps(r.parameters or {}, sort_keys=True).encode()]] * len(r["x"]), dtype=object)}
        for r in requests
    ]


class Scaler:
    def __init__(self, factor):
        self.factor = factor

    def __call__(self, requests):
        return [{"y": r["x"] * self.factor} for r in requests]


async def async_double(requests):
    await asyncio.sleep(0)
    return [{"y": r["x"] * 2} for r in requests]


def streamer(requests):
    count = int(requests[0]["n"].flat[0])
    for step in range(count):
        yield [{"step": np.array([[step]], dtype=np.int32)} for _ in requests]
    if int(requests[0]["fail"].flat[0]):
        raise RuntimeError("stream broke at the end")


def failing(requests):
    raise ValueError("bad thing happened")


def strict_bad_dtype(requests):
    return [{"y": r["x"].astype(np.float64)} for r in requests]


def large_layouts(requests):
    """Large outputs in every layout: the input itself, a slice of it, Fortran order, strided, strings."""
    results = []
    for r in requests:
        x = r["x"]
        results.append({
            "same": x,
            "tail": x[:, x.shape[1] // 2 :],
            "fortran": np.asfortranarray(np.repeat(x * 2, 2, axis=0)[: len(x)]),
            "strided": x[:, ::2],
            "text": np.array([[b"%d" % int(v) for v in row[:20_000]] for row in x], dtype=object),
        })  # fmt: skip
    return results


def numeric_layouts(requests):
    """Small numeric outputs in every layout (no BYTES output: the backend kind's one-pass path)."""
    return [{"same": r["x"], "strided": r["x"][:, ::2], "fortran": np.asfortranarray(r["x"] * 2)} for r in requests]


def wrong_type(requests):
    return {"y": requests[0]["x"]}


def wrong_count(requests):
    return [{"y": r["x"]} for r in requests] + [{"y": requests[0]["x"]}]


def in_place(requests):
    for r in requests:
        r["x"] += 1
    return [{"y": r["x"]} for r in requests]
