"""Message latency between two processes: ZeroMQ ipc:// vs a plain Unix stream socket.

``python -m bench.transport_pingpong`` prints, for each transport, the median round trip of a
100-byte message and the one-way time until the peer holds it, both back to back and after the
sender has been idle for a while (as a server is between sequential requests). This is the
measurement behind the choice of transport for the proxy (docs/architecture.md) and behind the
latency figures in docs/performance.md. Every loop is bounded in count.

The one-way time compares ``time.perf_counter()`` readings taken in the two processes; on Linux
that clock is CLOCK_MONOTONIC, shared by all processes.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import statistics
import struct
import tempfile
import time
from typing import Any, Callable, Dict, Tuple

ROUNDS = 2000
WARMUP = 200
GAPS_US = (0, 100, 300, 600)
_STAMP = struct.Struct("<d")


def _zmq_server(address: str, ready: Any, total: int) -> None:
    import zmq

    context = zmq.Context()
    server = context.socket(zmq.REP)
    server.bind(address)
    ready.set()
    for _ in range(total):
        server.recv()
        server.send(_STAMP.pack(time.perf_counter()))
    server.close(0)
    context.term()


def _unix_server(path: str, ready: Any, total: int) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    ready.set()
    connection, _ = listener.accept()
    for _ in range(total):
        if not connection.recv(65536):
            break
        connection.sendall(_STAMP.pack(time.perf_counter()))
    connection.close()
    listener.close()


def _zmq_client(address: str) -> Tuple[Callable[[bytes], bytes], Callable[[], None]]:
    import zmq

    context = zmq.Context()
    client = context.socket(zmq.REQ)
    client.connect(address)

    def exchange(message: bytes) -> bytes:
        client.send(message)
        return client.recv()

    def close() -> None:
        client.close(0)
        context.term()

    return exchange, close


def _unix_client(path: str) -> Tuple[Callable[[bytes], bytes], Callable[[], None]]:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)

    def exchange(message: bytes) -> bytes:
        client.sendall(message)
        return client.recv(65536)

    return exchange, client.close


def measure(transport: str, directory: str) -> Dict[int, Dict[str, float]]:
    """Median round trip and one-way time in µs, per idle gap in µs before each message."""
    total = len(GAPS_US) * (ROUNDS + WARMUP)
    ready = multiprocessing.Event()
    if transport == "zmq":
        address = f"ipc://{directory}/zmq.ipc"
        server = multiprocessing.Process(target=_zmq_server, args=(address, ready, total))
    else:
        address = os.path.join(directory, "unix.sock")
        server = multiprocessing.Process(target=_unix_server, args=(address, ready, total))
    server.start()
    if not ready.wait(10):
        raise RuntimeError(f"{transport} server did not start")
    exchange, close = _zmq_client(address) if transport == "zmq" else _unix_client(address)
    message = b"x" * 100
    results = {}
    try:
        for gap_us in GAPS_US:
            round_trips, one_way = [], []
            for index in range(ROUNDS + WARMUP):
                if gap_us:
                    time.sleep(gap_us / 1e6)
                started = time.perf_counter()
                reply = exchange(message)
                finished = time.perf_counter()
                if index >= WARMUP:
                    round_trips.append(finished - started)
                    one_way.append(_STAMP.unpack(reply[: _STAMP.size])[0] - started)
            results[gap_us] = {
                "round_trip_us": statistics.median(round_trips) * 1e6,
                "one_way_us": statistics.median(one_way) * 1e6,
            }
    finally:
        close()
        server.join(10)
        if server.is_alive():
            server.kill()
    return results


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        table = {name: measure(name, directory) for name in ("unix", "zmq")}
    labels = {"unix": "Unix stream socket", "zmq": "ZeroMQ ipc:// REQ/REP"}
    print(f"median of {ROUNDS} messages of 100 bytes; one-way = until the peer process holds the message")
    print(f"{'transport':<24}{'idle gap':>10}{'round trip':>14}{'one way':>11}")
    for name, rows in table.items():
        for gap_us, row in rows.items():
            print(f"{labels[name]:<24}{gap_us:>7} us{row['round_trip_us']:>11.1f} us{row['one_way_us']:>8.1f} us")


if __name__ == "__main__":
    main()
