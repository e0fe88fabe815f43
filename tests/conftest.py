"""Shared test helpers: free loopback ports and leak checks."""

from __future__ import annotations

import os
import socket
import time
from typing import Dict, List

import numpy as np
import pytest

# Every numeric dtype Triton carries (BYTES is tested separately).
DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]


def free_ports(count: int) -> List[int]:
    """``count`` distinct TCP ports that are free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def triton_ports() -> Dict[str, int]:
    http, grpc, metrics = free_ports(3)
    return {"http_port": http, "grpc_port": grpc, "metrics_port": metrics}


def shm_entries(prefix: str) -> List[str]:
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(prefix))


def process_group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


@pytest.fixture()
def ports():
    return triton_ports()
