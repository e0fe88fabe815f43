"""Helper process for the embedded lifecycle tests: serve one model in-process, report what it created.

Calls the model once, prints one JSON line (the stub pids, the shared-memory prefix, the socket
directory, the workspace, the watchdog's pid, the backend's scratch directory), then runs ``serve()``: prints ``serving`` once its
signal handlers are in place and ``served`` when it returns.
"""

import json
import os
import signal
import sys
import threading
import time

import numpy as np

from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton


@batch
def _double(x):
    return {"y": x * 2}


def main() -> None:
    triton = Triton(embedded=True)
    triton.bind(
        "Double",
        _double,
        [Tensor(name="x", shape=(-1,), dtype=np.float32)],
        [Tensor(name="y", shape=(-1,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=4),
    )
    triton.run()
    result = triton.client("Double").infer_sample(np.arange(3, dtype=np.float32))
    assert result["y"].tolist() == [0.0, 2.0, 4.0], result
    stubs = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[-1].split()
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    is_stub = b"triton_python_backend_stub" in cmdline.read()
            except OSError:
                continue
            if is_stub and int(fields[1]) == os.getpid():
                stubs.append(int(entry))
    info = {
        "stubs": stubs,
        "shm_prefix": triton._shm_prefix,
        "socket_dir": str(triton._socket_dir),
        "workspace": str(triton._workspace.path),
        "watchdog_pid": triton._backend.watchdog.pid if triton._backend.watchdog is not None else None,
        "scratch": triton._backend.scratch.path,  # the Python backend's /tmp/python_env_* directory
    }
    print(json.dumps(info), flush=True)

    def report_serving() -> None:  # the parent signals only once serve() has installed its handlers
        while signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            time.sleep(0.01)
        print("serving", flush=True)

    threading.Thread(target=report_serving, daemon=True).start()
    triton.serve(monitoring_period_s=0.2)
    print("served", flush=True)


if __name__ == "__main__":
    sys.exit(main())
