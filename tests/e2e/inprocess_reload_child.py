"""Unload a model right after loading it, in a loop, in a process of its own (Triton's unload-after-load crash).

Why a child: an unload right after a load could crash the whole process (SIGSEGV in the model
deleter's ``TritonBackendThread::StopBackendThread``; pytriton/inprocess/_settle.py says why and
how ``load()`` now avoids it). In a child such a crash fails the one test that drives it
(tests/e2e/test_inprocess_reload.py, which reads the exit status) instead of ending the pytest run.
The test runs it with tests/e2e/payload_window_shim.c preloaded, which keeps the backend thread
busy in the window the crash needs, as a preempted thread would be.

The server starts with ``identity`` and ``add_sub`` loaded. Each round: ``unload(identity,
wait_until_unloaded=True)`` (the first right after the start), then ``load(identity)``; the next
round unloads it at once. Beside it a thread sends requests to ``add_sub`` the whole time: every one
must succeed (the loop must not disturb healthy traffic).

Output (stdout): one JSON line at the end, ``{"rounds": n, "answer": x, "traffic_ok": n, "traffic_failed": n, "errors": [...]}``.
Exit status: 0, or the signal that killed it (negative, as ``subprocess`` reports it).
With ``--stop-after-load`` each round is instead a server of its own (``add_sub`` loaded and answering
one request) that loads ``identity`` and is stopped at once: ``stop()`` destroys the models through
the same deleter. Its output is ``{"rounds": n, "answers": [...]}``.

Usage: ``python -m tests.e2e.inprocess_reload_child REPOSITORY ROUNDS [--stop-after-load]``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import threading
from typing import Any, Dict, List, Optional

import numpy as np


def _traffic(server: Any, stop: threading.Event, counts: Dict[str, int], errors: List[str]) -> None:
    """Requests to add_sub until ``stop``; each answer is checked."""
    model = server.model("add_sub")
    a = np.arange(4, dtype=np.float32)
    while not stop.is_set():
        try:
            (response,) = model.infer(inputs={"INPUT0": a, "INPUT1": a})
            total = np.from_dlpack(response.outputs["OUTPUT0"]).copy()
            if not np.array_equal(total, a + a):
                raise AssertionError(f"wrong answer {total}")
            counts["ok"] += 1
        except Exception as exc:  # noqa: BLE001  (counted and reported, the test asserts none)
            counts["failed"] += 1
            errors.append(repr(exc))
            stop.wait(0.01)


def _stop_after_load(tritonserver: Any, repository: str, rounds: int) -> None:
    """Each round: a server serving add_sub (one request answered), ``load(identity)``, ``stop()`` at once."""
    answers = []
    for _ in range(rounds):
        options = tritonserver.Options()
        options.model_control_mode = tritonserver.ModelControlMode.EXPLICIT
        options.model_repository = repository
        options.startup_models = ["add_sub"]
        server = tritonserver.Server(options).start(wait_until_ready=True, timeout=120)
        try:
            a = np.arange(4, dtype=np.float32)
            (response,) = server.model("add_sub").infer(inputs={"INPUT0": a, "INPUT1": a})
            answers.append(float(np.from_dlpack(response.outputs["OUTPUT0"]).flat[3]))
            server.load("identity")
        finally:
            server.stop()  # right after the load
    print(json.dumps({"rounds": rounds, "answers": answers}), flush=True)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("repository")
    parser.add_argument("rounds", type=int)
    parser.add_argument("--stop-after-load", action="store_true")
    args = parser.parse_args(argv)
    faulthandler.enable(all_threads=True)
    import pytriton.inprocess as tritonserver

    if args.stop_after_load:
        _stop_after_load(tritonserver, args.repository, args.rounds)
        return

    options = tritonserver.Options()
    options.model_control_mode = tritonserver.ModelControlMode.EXPLICIT
    options.model_repository = args.repository
    options.startup_models = ["identity", "add_sub"]
    server = tritonserver.Server(options)
    counts = {"ok": 0, "failed": 0}
    errors: List[str] = []
    stop = threading.Event()
    sender = threading.Thread(target=_traffic, args=(server, stop, counts, errors), daemon=True)
    try:
        server.start(wait_until_ready=True, timeout=120)
        sender.start()
        for _ in range(args.rounds):
            server.unload("identity", wait_until_unloaded=True, timeout=60)
            server.load("identity")  # the next round unloads it at once
        (response,) = server.model("identity").infer(inputs={"INPUT0": np.array([[3]], np.float32)})
        answer = float(np.from_dlpack(response.outputs["OUTPUT0"]).flat[0])
        stop.set()
        if sender.is_alive():
            sender.join(60)
    finally:
        stop.set()
        server.stop()
    result = {"rounds": args.rounds, "answer": answer, "traffic_ok": counts["ok"], "traffic_failed": counts["failed"]}
    print(json.dumps({**result, "errors": errors[:3]}), flush=True)


if __name__ == "__main__":
    main()
