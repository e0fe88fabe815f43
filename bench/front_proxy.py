"""What a process in front of Triton's HTTP port would cost, at the least (issue 25, crashing bodies).

Usage::

    python -m bench.front_proxy [REQUESTS]

Triton 2.51 crashes on some small HTTP bodies (docs/configuration.md, "Request size"). Refusing them
before Triton parses them needs a process that reads every request in front of the HTTP port, which
pytriton is not. This measures the floor of that design: a relay (asyncio, in this process) that
only copies bytes, no HTTP parsing and no JSON inspection, which a real filter would add. It serves
an identity model (FP32 ``[16]``) and sends ``REQUESTS`` (default 3000) JSON requests on one
keep-alive connection each, alternating direct and relayed, and prints both medians and their
ratio (the first 200 of each are warm-up).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import statistics
import sys
import threading
import time
from typing import Dict, List

import numpy as np

from bench.__main__ import free_ports
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

WARMUP = 200


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


def _relay(listen_port: int, target_port: int, ready: threading.Event) -> None:
    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(
            _pipe(client_reader, server_writer), _pipe(server_reader, client_writer), return_exceptions=True
        )

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def main() -> None:
    requests = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    http_port, grpc_port, metrics_port, relay_port = free_ports(4)
    with Triton(config=TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)) as triton:
        triton.bind(
            "Identity",
            lambda batch: [{"y": r["x"]} for r in batch],
            [Tensor(name="x", shape=(-1,), dtype=np.float32)],
            [Tensor(name="y", shape=(-1,), dtype=np.float32)],
            config=ModelConfig(batching=False),
        )
        triton.run()
        ready = threading.Event()
        threading.Thread(target=_relay, args=(relay_port, http_port, ready), daemon=True).start()
        ready.wait(10)
        body = json.dumps({"inputs": [{"name": "x", "shape": [16], "datatype": "FP32", "data": [1.0] * 16}]})
        connections = {port: http.client.HTTPConnection("127.0.0.1", port) for port in (http_port, relay_port)}
        times: Dict[int, List[float]] = {port: [] for port in connections}
        for _ in range(requests):
            for port, connection in connections.items():
                started = time.perf_counter()
                connection.request("POST", "/v2/models/Identity/infer", body=body)
                response = connection.getresponse()
                response.read()
                assert response.status == 200, response.status
                times[port].append(time.perf_counter() - started)
        direct, relayed = (statistics.median(times[port][WARMUP:]) * 1e3 for port in (http_port, relay_port))
        print(
            f"HTTP p50 direct {direct:.3f} ms, through a byte relay {relayed:.3f} ms: "
            f"+{relayed - direct:.3f} ms ({relayed / direct:.2f}x), {requests} requests each"
        )


if __name__ == "__main__":
    main()
