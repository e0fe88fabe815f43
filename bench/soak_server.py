"""The server side of ``python -m bench.soak``: a pytriton process serving the soak's models.

Run as ``python -m bench.soak_server INFO_PATH``. It binds the models below, starts Triton on free
loopback ports, writes ``INFO_PATH`` (JSON: ports, its pid, the access token if the installed
pytriton has one) and serves until SIGTERM or SIGINT. Running the server in its own process lets
the soak measure the user's process (this one) apart from the load generator.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import pathlib
import signal
import socket
import sys
from typing import Any, Dict, List

import numpy as np

from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

# Values of the "raises" model's CODE input, each a way a callable can fail badly.
RAISE_OK = 0
# Well above the soak's largest request (8 MiB), small enough for the oversized probe to cross.
MAX_REQUEST_BYTES = 64 << 20
RAISES = {1: "SystemExit", 2: "KeyboardInterrupt", 3: "GeneratorExit", 4: "bad __str__", 5: "BaseException"}


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ of this exception raises")


def identity(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    return [{"OUTPUT": request["INPUT"]} for request in requests]


def raises(requests: List[Any]) -> List[Dict[str, np.ndarray]]:
    """Fails the whole batch in the way its first request's CODE asks; CODE 0 answers normally."""
    code = int(requests[0]["CODE"].flat[0])
    if code == 1:
        raise SystemExit(3)
    if code == 2:
        raise KeyboardInterrupt
    if code == 3:
        raise GeneratorExit
    if code == 4:
        raise _Unprintable
    if code == 5:
        raise BaseException("a bare BaseException")
    return [{"OUTPUT": request["CODE"]} for request in requests]


def _free_ports(count: int) -> List[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def main(info_path: pathlib.Path) -> int:
    # The soak sends SIGUSR1 when the server does not recover from a probe: every thread's stack
    # then lands in this process's log, which the soak keeps (what was pytriton waiting for?).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(level=logging.WARNING, format="soak-server %(levelname)s %(name)s: %(message)s")
    http_port, grpc_port, metrics_port = _free_ports(3)
    config = TritonConfig(
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        max_request_bytes=MAX_REQUEST_BYTES,
        # bench.soak --allocator: which malloc the server runs with (None: pytriton's default)
        server_allocator=os.environ.get("PYTRITON_TRITON_CONFIG_SERVER_ALLOCATOR") or None,
    )
    with Triton(config=config) as triton:
        triton.bind(
            "identity_f32",
            identity,
            inputs=[Tensor(name="INPUT", shape=(-1,), dtype=np.float32)],
            outputs=[Tensor(name="OUTPUT", shape=(-1,), dtype=np.float32)],
            config=ModelConfig(max_batch_size=64),
        )
        triton.bind(
            "identity_u8",
            [identity, identity],
            inputs=[Tensor(name="INPUT", shape=(-1,), dtype=np.uint8)],
            outputs=[Tensor(name="OUTPUT", shape=(-1,), dtype=np.uint8)],
            config=ModelConfig(max_batch_size=1),
        )
        triton.bind(
            "raises",
            raises,
            inputs=[Tensor(name="CODE", shape=(1,), dtype=np.int32)],
            outputs=[Tensor(name="OUTPUT", shape=(1,), dtype=np.int32)],
            config=ModelConfig(max_batch_size=1),
        )
        triton.run()
        get_token = getattr(triton, "get_access_token", None)
        info = {
            "pid": os.getpid(),
            "http_port": http_port,
            "grpc_port": grpc_port,
            "metrics_port": metrics_port,
            "access_token": get_token() if get_token is not None else None,
            "max_request_bytes": MAX_REQUEST_BYTES,
        }
        partial = info_path.with_suffix(".partial")
        partial.write_text(json.dumps(info))
        partial.rename(info_path)  # the soak reads a complete file or none
        triton.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1])))
