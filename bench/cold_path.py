"""What the proxy's Python work costs back to back and right after the thread was idle.

``python -m bench.cold_path [ROUNDS]`` runs, in this one process, the user-side steps of a
sequential ``[1,16]`` float32 request (the bench's identity model) over a socket pair: the stub's
send and the worker's receive, decoding into ``Request`` objects, the callable, checking and
encoding the outputs, and the reply. Each step is timed back to back ("hot") and after sleeping
``GAP_US`` first ("after idle", as a server is between sequential requests). The ratio of the
two shows how much of a request's cost on this host comes from code running on a CPU that had
gone idle rather than from the work itself (docs/performance.md). Every loop is bounded in count.
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

import numpy as np

from bench.models import identity
from pytriton.model_config import Tensor
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy._binding import _resolve_tensors
from pytriton.proxy._worker import InstanceWorker
from pytriton.proxy.stubside import _arena, _messages, _tensors, _wire

GAP_US = 500
ROUNDS = 1500


def _median_us(step: Callable[[], Any], gap_s: float, rounds: int) -> float:
    samples: List[int] = []
    for _ in range(rounds):
        if gap_s:
            time.sleep(gap_s)
        started = time.perf_counter_ns()
        step()
        samples.append(time.perf_counter_ns() - started)
    return round(statistics.median(samples) / 1e3, 2)


def measure(rounds: int = ROUNDS, gap_us: int = GAP_US) -> Dict[str, Dict[str, float]]:
    """Median µs per step, ``{"step": {"hot": .., "after_idle": ..}}``."""
    spec = [Tensor(name="INPUT", shape=(16,), dtype=np.float32)]
    config = TritonModelConfig(
        model_name="cold_path",
        batching=True,
        max_batch_size=32,
        inputs=_resolve_tensors(spec, "INPUT", "cold_path"),
        outputs=_resolve_tensors([Tensor(name="OUTPUT", shape=(16,), dtype=np.float32)], "OUTPUT", "cold_path"),
    )
    with tempfile.TemporaryDirectory() as directory:
        # The worker is never started: its steps are called directly, on this thread.
        worker = InstanceWorker(
            path=f"{directory}/unused.sock", infer_func=identity, config=config, strict=False,
            shm_prefix="pytriton-bench-cold", on_unrecoverable=lambda exc: None, name="cold_path",
        )  # fmt: skip
        stub_end, worker_end = socket.socketpair()
        try:
            stub, user = _wire.SocketChannel(stub_end), _wire.SocketChannel(worker_end)
            segment, metas = _tensors.write_tensors(
                _arena.SharedArena("unused"), [[("INPUT", np.ones((1, 16), np.float32))]]
            )
            message = _messages.Infer(segment, [_messages.Entry(metas[0])])
            requests = worker._decode(message, [])
            result = identity(requests)
            reply = worker._infer(message, user)

            def request_over_socket() -> None:
                stub.send(message)
                user.recv()

            def reply_over_socket() -> None:
                user.send(reply)
                stub.recv()

            def whole_exchange() -> None:
                stub.send(message)
                received = user.recv()
                assert type(received) is _messages.Infer
                user.send(worker._infer(received, user))
                stub.recv()

            steps: Dict[str, Callable[[], Any]] = {
                "request over the socket (send + receive)": request_over_socket,
                "decode into Request objects": lambda: worker._decode(message, []),
                "the callable (identity)": lambda: identity(requests),
                "check + encode the outputs": lambda: worker._encode(result, 1),
                "reply over the socket (send + receive)": reply_over_socket,
                "whole exchange": whole_exchange,
            }
            return {
                name: {"hot": _median_us(step, 0.0, rounds), "after_idle": _median_us(step, gap_us / 1e6, rounds)}
                for name, step in steps.items()
            }
        finally:
            stub_end.close()
            worker_end.close()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else ROUNDS
    results = measure(rounds)
    print(f"median us per step, back to back / after {GAP_US} us idle ({rounds} rounds each)")
    for name, figures in results.items():
        ratio = figures["after_idle"] / figures["hot"] if figures["hot"] else float("nan")
        print(f"  {name:42s} {figures['hot']:7.2f} / {figures['after_idle']:7.2f}  ({ratio:.1f}x)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
