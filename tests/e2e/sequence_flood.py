"""Measure what never-ended sequence starts cost (docs/security.md, "Sequence ids are capabilities").

Run from the repository root:
``python -m tests.e2e.sequence_flood [N] [IDLE_US] [CANDIDATES] [SLOTS] [NEW_TIMEOUT_MS]``
(defaults 3000, 0: Triton's 1 s idle timeout, 0: the direct strategy, 4, 0; CANDIDATES > 0: the
oldest strategy with that ``max_candidate_sequences``; SLOTS: ``max_batch_size``, the direct
strategy's slots of the one instance; NEW_TIMEOUT_MS > 0: the new sequence's requests carry Triton's
request ``timeout``, as pytriton's clients send their ``inference_timeout_s``). Binds a sequence
model on free loopback ports, opens one sequence over HTTP, sends N gRPC starts of distinct ids at
once that are never ended, then continues and ends the open sequence and starts, continues and ends
a new one, printing Triton's resident memory and each wait. Each client wait is bounded (300 s).
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pytriton.model_config import ModelConfig, SequenceBatcher, SequenceStrategy, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports

WAIT_S = 300.0


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


_STARTS_SEEN = [0]  # starts that reached the callable (a thread instance: counted in this process)


def _echo(requests):
    _STARTS_SEEN[0] += sum(1 for request in requests if request.sequence_start)
    return [{"total": np.full((1, 1), float(request["value"].sum()), np.float32)} for request in requests]


def _http_step(client, sequence_id, start=False, end=False, timeout_us=None):
    tensor = httpclient.InferInput("value", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0]], np.float32))
    client.infer("Seq", [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end, timeout=timeout_us)


def main(count: int, idle_us: int, candidates: int, slots: int = 4, new_timeout_ms: int = 0) -> None:
    ports = triton_ports()
    batcher = SequenceBatcher(max_sequence_idle_microseconds=idle_us)
    if candidates:
        batcher.strategy, batcher.max_candidate_sequences = SequenceStrategy.OLDEST, candidates
    config = ModelConfig(max_batch_size=slots, sequence_batcher=batcher)
    with Triton(config=TritonConfig(**ports)) as triton:
        triton.bind(
            "Seq",
            _echo,
            inputs=[Tensor(name="value", shape=(1,), dtype=np.float32)],
            outputs=[Tensor(name="total", shape=(1,), dtype=np.float32)],
            config=config,
        )
        triton.run()
        pid = triton._backend.server.pid
        strategy = f"oldest, {candidates} candidates" if candidates else "direct"
        print(
            f"N={count} idle_us={idle_us or 'default (1 s)'} {strategy} slots={slots} "
            f"new_timeout_ms={new_timeout_ms or 'none'}; Triton resident before: {_rss_mib(pid):.0f} MiB"
        )
        http = httpclient.InferenceServerClient(
            f"127.0.0.1:{ports['http_port']}", connection_timeout=WAIT_S, network_timeout=WAIT_S
        )
        _http_step(http, 5, start=True)  # the sequence opened before the flood
        flood = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc_port']}")
        answered = threading.Semaphore(0)
        refused = []
        for index in range(count):
            tensor = grpcclient.InferInput("value", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[1.0]], np.float32))
            flood.async_infer(
                "Seq",
                [tensor],
                lambda result, error: (refused.append(error) if error is not None else None, answered.release()),
                sequence_id=1_000_000 + index,
                sequence_start=True,
                client_timeout=WAIT_S,
            )
        flooded = time.monotonic()
        time.sleep(0.3)
        print(f"Triton resident with the starts waiting: {_rss_mib(pid):.0f} MiB")
        began = time.monotonic()
        try:
            _http_step(http, 5)
            _http_step(http, 5, end=True)
            print(f"the sequence opened before the flood: continued and ended in {time.monotonic() - began:.2f} s")
        except Exception as exc:  # noqa: BLE001 - a measurement: say what happened
            print(f"the sequence opened before the flood failed after {time.monotonic() - began:.2f} s: {exc}")
        began = time.monotonic()
        try:
            timeout_us = new_timeout_ms * 1000 or None
            _http_step(http, 7, start=True, timeout_us=timeout_us)
            _http_step(http, 7, end=True, timeout_us=timeout_us)
            print(f"a new sequence: served in {time.monotonic() - began:.2f} s")
        except Exception as exc:  # noqa: BLE001
            print(f"a new sequence failed after {time.monotonic() - began:.2f} s: {exc}")
        deadline = time.monotonic() + WAIT_S
        for _ in range(count):  # every flood start is answered once the backlog drains
            if not answered.acquire(timeout=max(0.0, deadline - time.monotonic())):
                break
        print(
            f"Triton resident once the starts were answered: {_rss_mib(pid):.0f} MiB "
            f"(the flood drained {time.monotonic() - flooded:.1f} s after it was sent)"
        )
        print(f"starts that reached the callable: {_STARTS_SEEN[0]}; flood starts refused: {len(refused)}")
        if refused:
            print(f"first refusal: {refused[0]}")
        flood.close()
        http.close()


if __name__ == "__main__":
    arguments = [int(value) for value in sys.argv[1:6]]
    main(*(arguments + [3000, 0, 0, 4, 0][len(arguments) :]))
