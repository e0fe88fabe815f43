"""Stop (or unload) an in-process server while one of its stubs is stopped inside a Python-backend lock.

Why a child: the Python backend, finalizing a model instance whose stub does not answer its health
check within 1 s, SIGKILLs the stub wherever it is and then frees the stub's IPC control block,
which locks the shared-memory allocator's mutex. A stub killed holding that mutex makes the lock
throw ``boost::interprocess::lock_exception``, which nothing catches: ``std::terminate`` aborts the
whole process inside ``stop()`` (docs/inprocess.md, "Known limitations of the server library"). In a
child such an abort fails the one test that drives it (tests/e2e/test_inprocess_stop.py) instead of
ending the pytest run.

The server starts with ``identity`` and ``add_sub``. ``identity``'s model, once it answered a request
for 1, takes its region's allocator mutex in a thread of its own and stops its process (``SIGSTOP``),
as a stub preempted inside an allocation and then stopped would be; the mutex's address is the
region's start plus a fixed offset (:func:`allocator_mutex`). With ``--in-request`` gdb stops the stub
inside that mutex while a request is in flight instead (a diagnostic; no test runs it). Beside it a
second thread sends requests to ``add_sub``: every one must succeed until the stop. Then ``stop()``
(or, with ``--unload``, ``unload("identity", wait_until_unloaded=True)``, a request to ``add_sub``
and ``stop()``).

Output (stdout): one JSON line at the end: ``held`` (whether the stopped stub held a robust mutex,
read from its robust list), ``gdb_ok`` (the stall was set up), ``traffic_ok``/``traffic_failed`` (``add_sub``),
``stub_left`` (whether the stub still exists after the call), ``call_s`` (how long ``stop()`` or
``unload()`` took), ``answer`` (``add_sub``'s answer after an unload, else None).
Exit status: 0, or the signal that killed it (negative, as ``subprocess`` reports it).

Usage: ``python -m tests.e2e.inprocess_stop_child REPOSITORY [--unload]``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import pathlib
import resource
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from pytriton._platform import native, proc
from pytriton.server._recycle import model_stubs
from tests.conftest import shm_span
from tests.e2e.inprocess_models import _body


def _traffic(model: Any, inputs: Dict[str, Any], stop: threading.Event, counts: Dict[str, int]) -> None:
    """Requests to ``model`` until ``stop``; counts answers and failures."""
    while not stop.is_set():
        try:
            list(model.infer(inputs=inputs))
            counts["ok"] += 1
        except Exception as exc:  # noqa: BLE001  (counted; the test asserts on the counts)
            counts["failed"] += 1
            counts.setdefault("error", repr(exc))  # type: ignore[arg-type]
            stop.wait(0.01)


LOCK_AT = "lock_at"  # beside the repository: the address of the stub's allocator mutex, for STALLING_MODEL
# The identity model, which after answering a request for 1 stalls in a thread of its own inside the
# allocator's lock: it takes the mutex, stops its process (SIGSTOP) and lets go once continued, as a
# stub preempted inside an allocation and then stopped (or starved) would. The server has finished
# with the request by then, so none of its threads waits for that mutex.
STALLING_MODEL = _body(
    """\
    def execute(self, requests):
        import ctypes, signal, threading

        def stall(address):
            time.sleep(0.5)
            libc = ctypes.CDLL(None)
            libc.pthread_mutex_lock(ctypes.c_void_p(address))
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
            time.sleep(0.05)  # the stop takes the whole process at once; this thread lets go after SIGCONT
            libc.pthread_mutex_unlock(ctypes.c_void_p(address))

        if float(_in(requests[0], "INPUT0").flat[0]) == 1.0:
            here = os.path.dirname(os.path.abspath(__file__))
            with open(os.path.join(here, "..", "..", "..", "LOCK_AT")) as source:
                threading.Thread(target=stall, args=(int(source.read()),), daemon=True).start()
        return [pb_utils.InferenceResponse([_out("OUTPUT0", _in(r, "INPUT0"))]) for r in requests]
    """.replace("LOCK_AT", LOCK_AT)
)
ALLOCATOR_HEADER = 0x100  # bytes at the region's start that hold the allocator's mutex (0xb8 in r24.10's stub)
ALLOCATOR_MUTEX_OFFSET = 0xB8  # the allocator mutex's offset in the region, in the stub Triton 2.51 ships (r24.10)


def stop_inside_the_allocator_lock(stub: int) -> str:
    """Stop ``stub`` (SIGSTOP) right after it took its shared-memory allocator's mutex; gdb's output.

    A breakpoint on ``pthread_mutex_lock`` in the stub's main thread for the mutex at the start of its
    ``/dev/shm`` region (the allocator's, taken by the stub's ``SharedMemoryManager`` to allocate or
    release a block), run to the end of the call (the lock is held), then a SIGSTOP queued and gdb
    detached: the stub stops there.
    """
    low, _ = shm_span(stub)
    if not low:
        return f"stub {stub} maps no shared-memory region"
    # The allocator's header (boost's managed_external_buffer, its mutex first) lies at the start of
    # the region; the main thread (gdb's thread 1) is the one that allocates for requests. Other
    # mutexes in the region (the health flag's, at 0x190 in r24.10's stub; the queues') lie further on.
    condition = f"$_thread == 1 && (unsigned long)$rdi >= {low} && (unsigned long)$rdi < {low + ALLOCATOR_HEADER}"
    commands = [
        "set pagination off",
        f"break pthread_mutex_lock if {condition}",
        "continue",
        "delete",
        "bt 4",
        "finish",
        "queue-signal SIGSTOP",
        "detach",
    ]
    args = ["gdb", "-q", "-batch", "-p", str(stub)] + [word for command in commands for word in ("-ex", command)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)  # noqa: S603
    return result.stdout + result.stderr


def allocator_mutex(stub: int) -> Tuple[int, str]:
    """The address of ``stub``'s allocator mutex in the stub's own address space, and how it was found.

    The allocator's header (boost's ``managed_external_buffer``, its segment manager's mutex among
    the first fields) lies at the start of the region, so the mutex sits at a fixed offset from the
    region's lowest mapping: :data:`ALLOCATOR_MUTEX_OFFSET`, read once with gdb (a breakpoint on the
    stub's ``pthread_mutex_lock`` for a request; 0xb8 in each of several runs). Why not gdb on every
    run: a conditional breakpoint on ``pthread_mutex_lock`` traps every lock of the stub, and on a
    loaded host a request then stays in the stub for more than the backend's 1 s health wait; the
    backend gives up on it and the resumed stub works on a message already freed, which aborted
    the whole child (``lock_exception``) in one CI run before the test began. The test checks the
    address by its effect: the stalled stub's robust list must show a mutex held (``held``).
    """
    low, _ = shm_span(stub)
    if not low:
        return 0, f"stub {stub} maps no shared-memory region"
    return low + ALLOCATOR_MUTEX_OFFSET, f"region at {low:#x}, allocator mutex at +{ALLOCATOR_MUTEX_OFFSET:#x}"


def _wait(condition: Any, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("repository")
    parser.add_argument("--unload", action="store_true")
    parser.add_argument("--in-request", action="store_true")
    args = parser.parse_args(argv)
    faulthandler.enable(all_threads=True)
    import pytriton.inprocess as tritonserver

    (pathlib.Path(args.repository) / "identity" / "1" / "model.py").write_text(STALLING_MODEL)
    options = tritonserver.Options()
    options.model_control_mode = tritonserver.ModelControlMode.EXPLICIT
    options.model_repository = args.repository
    options.startup_models = ["identity", "add_sub"]
    server = tritonserver.Server(options).start(wait_until_ready=True, timeout=120)
    a = np.arange(4, dtype=np.float32)
    healthy: Dict[str, int] = {"ok": 0, "failed": 0}
    stop_healthy = threading.Event()
    sender = threading.Thread(
        target=_traffic, args=(server.model("add_sub"), {"INPUT0": a, "INPUT1": a}, stop_healthy, healthy), daemon=True
    )
    sender.start()
    (stub,) = model_stubs(os.getpid(), "identity")
    identity = server.model("identity")
    if args.in_request:
        loading: Dict[str, int] = {"ok": 0, "failed": 0}
        stop_loading = threading.Event()
        inputs = {"INPUT0": np.zeros((1, 1), np.float32)}
        loader = threading.Thread(target=_traffic, args=(identity, inputs, stop_loading, loading), daemon=True)
        loader.start()
        gdb = stop_inside_the_allocator_lock(stub)
        gdb_ok = "hit Breakpoint 1" in gdb and "Value returned is $1 = 0" in gdb
        stop_loading.set()
        loader.join(60)  # its request in flight fails once the backend sees the stub unhealthy (about 2 s)
    else:
        mutex, gdb = allocator_mutex(stub)
        gdb_ok = bool(mutex)
        if mutex:
            (pathlib.Path(args.repository).parent / LOCK_AT).write_text(str(mutex))
            list(identity.infer(inputs={"INPUT0": np.ones((1, 1), np.float32)}))  # answered; then the stub stalls
    stopped = _wait(lambda: (proc.stat(stub) or proc.Stat("?", 0, 0, 0)).state == "T", 10)
    held = native.robust_locks_held(stub) if stopped else None
    time.sleep(1.0)  # add_sub keeps being served beside the stopped stub
    stop_healthy.set()
    sender.join(60)
    print(f"stub {stub} stopped={stopped} held={held}; set-up:\n{gdb}", file=sys.stderr, flush=True)
    if os.environ.get("PYTRITON_TEST_CORE") == "1":  # a core of this process only (its stubs started with none)
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    answer = None
    started = time.monotonic()
    if args.unload:
        server.unload("identity", wait_until_unloaded=True, timeout=120)
        call_s = time.monotonic() - started
        (response,) = server.model("add_sub").infer(inputs={"INPUT0": a, "INPUT1": a})
        answer = float(np.from_dlpack(response.outputs["OUTPUT0"]).flat[3])
        server.stop()
    else:
        server.stop()
        call_s = time.monotonic() - started
    result = {
        "held": held,
        "gdb_ok": gdb_ok,
        "traffic_ok": healthy["ok"],
        "traffic_failed": healthy["failed"],
        "stub_left": proc.stat(stub) is not None,
        "call_s": round(call_s, 2),
        "answer": answer,
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
