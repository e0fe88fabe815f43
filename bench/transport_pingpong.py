"""Round trip of a 100-byte message between two processes: ZeroMQ ipc:// vs a plain Unix socket.

``python -m bench.transport_pingpong`` prints the median round trip of each. This is the
measurement behind the choice of transport for the proxy (docs/architecture.md).
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import statistics
import tempfile
import time

ROUNDS = 3000


def _zmq_server(address: str, ready) -> None:
    import zmq

    context = zmq.Context()
    server = context.socket(zmq.REP)
    server.bind(address)
    ready.set()
    for _ in range(ROUNDS + 200):
        server.send(server.recv())
    server.close(0)
    context.term()


def _unix_server(path: str, ready) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    ready.set()
    connection, _ = listener.accept()
    for _ in range(ROUNDS + 200):
        connection.sendall(connection.recv(65536))
    connection.close()
    listener.close()


def measure_zmq(directory: str) -> float:
    import zmq

    address = f"ipc://{directory}/zmq.ipc"
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_zmq_server, args=(address, ready))
    server.start()
    ready.wait(10)
    context = zmq.Context()
    client = context.socket(zmq.REQ)
    client.connect(address)
    samples = []
    for index in range(ROUNDS + 200):
        started = time.perf_counter()
        client.send(b"x" * 100)
        client.recv()
        if index >= 200:
            samples.append(time.perf_counter() - started)
    client.close(0)
    context.term()
    server.join(10)
    return statistics.median(samples) * 1e6


def measure_unix(directory: str) -> float:
    path = os.path.join(directory, "unix.sock")
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_unix_server, args=(path, ready))
    server.start()
    ready.wait(10)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    samples = []
    for index in range(ROUNDS + 200):
        started = time.perf_counter()
        client.sendall(b"x" * 100)
        client.recv(65536)
        if index >= 200:
            samples.append(time.perf_counter() - started)
    client.close()
    server.join(10)
    return statistics.median(samples) * 1e6


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        print(f"ZeroMQ ipc:// REQ/REP round trip: {measure_zmq(directory):.1f} us (median of {ROUNDS})")
        print(f"Unix stream socket round trip:    {measure_unix(directory):.1f} us (median of {ROUNDS})")
