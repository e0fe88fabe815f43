"""The in-process server of tests/e2e/test_local_users.py, in a process of its own.

Why a child: the test is about who may open the backend's regions, and it reloads a model four
times; Triton 2.51's server library can crash its process in a reload (docs/inprocess.md, "Known
limitation of the server library"). In a child such a crash fails this one test, which says so,
instead of ending the whole pytest run.

Protocol (stdout, one JSON object a line): ``{"prefix": ...}`` once the server object exists; it then
waits for a line on stdin (the watcher is ready) before it starts; ``{"created": [...], "answer": x}``
at the end. Usage: ``python -m tests.e2e.inprocess_regions_child REPOSITORY``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np


def main(repository: str) -> None:
    import pytriton.inprocess as tritonserver
    from pytriton.proxy.stubside import _arena

    def regions(prefix: str) -> set:
        return {name for name in os.listdir(_arena.SHM_DIR) if name.startswith(prefix)}

    options = tritonserver.Options()
    options.model_control_mode = tritonserver.ModelControlMode.EXPLICIT
    options.model_repository = repository
    options.startup_models = ["identity", "add_sub"]
    server = tritonserver.Server(options)
    prefix = server.shm_region_prefix
    print(json.dumps({"prefix": prefix}), flush=True)
    sys.stdin.readline()  # the watcher is ready
    created = set()
    try:
        server.start(wait_until_ready=True, timeout=120)
        assert server.shm_region_prefix == prefix  # no other in-process server chose the backend's prefix
        created |= regions(prefix)
        for _ in range(4):  # each reload: a new stub, a new region
            server.unload("identity", wait_until_unloaded=True, timeout=60)
            server.load("identity")
            created |= regions(prefix)
        (response,) = server.model("identity").infer(inputs={"INPUT0": np.array([[3]], np.float32)})
        answer = float(np.from_dlpack(response.outputs["OUTPUT0"]).flat[0])
    finally:
        server.stop()
    print(json.dumps({"created": sorted(created), "answer": answer}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
