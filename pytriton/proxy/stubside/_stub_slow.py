"""Stub side of loading: a model instance whose ``initialize`` takes long says where it is.

Part of the stub-side package (``stubside/__init__.py``); like the stub itself it may use only the standard library.

Why. Triton waits for a Python-backend instance's ``initialize`` without a time limit, and
``Triton.run()`` only sees that the server is not ready yet: when a load hangs, the user gets a
timeout with the server's last lines, which say which models did load, not what the missing one is
doing. Most of ``initialize`` is quick (claiming a slot, the hello to the worker); what can take
long is the wait for the worker's answer (a process instance's worker that is still importing the
user's module) and, for a backend instance, importing the user's module and unpickling the
callable in the stub, which may load a model.

What. :func:`reporting` runs the ``initialize`` under a timer thread: if it has not returned after
``after_s`` seconds, and every ``after_s`` seconds after that, the thread writes one line to the
stub's stderr (which is the server's log, so it is among the last lines a startup timeout shows):
the model instance, how long it has run, and the innermost frames of the thread that runs it. One
line, because the timeout quotes a limited number of the server's last lines. Nothing is written
for an ``initialize`` that returns in time; the thread ends when it returns.

Unit tests: tests/unit/test_stub_slow.py.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Iterator

# Long enough that a healthy load of a light model never reports; short enough that a hang shows
# well within Triton.run()'s 120 s startup timeout (pytriton/_serving/launched.py, STARTUP_TIMEOUT_S).
# The stub inherits the server's environment, which is the user's process's.
AFTER_S = float(os.environ.get("PYTRITON_STUB_SLOW_INITIALIZE_S", "30"))
# Frames named in a report, innermost first.
FRAMES = 6


def where(thread_id: int, frames: int = FRAMES) -> str:
    """The innermost ``frames`` frames of thread ``thread_id``, innermost first, on one line."""
    # Imported here: about 1 ms of every stub's start otherwise, and only a slow load gets here.
    import traceback

    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return "(the thread is gone)"
    stack = traceback.extract_stack(frame)[-frames:]
    return " <- ".join(f"{entry.name} ({entry.filename}:{entry.lineno})" for entry in reversed(stack))


@contextlib.contextmanager
def reporting(what: str, after_s: float = AFTER_S) -> Iterator[None]:
    """Report where the calling thread is, every ``after_s`` seconds, until the block ends.

    ``what`` names the instance in the report. The timer thread is a daemon: it never keeps the
    process alive, and it is told to stop (and joined) when the block ends, however it ends.
    """
    caller = threading.get_ident()
    started = time.monotonic()
    done = threading.Event()

    def report() -> None:
        while not done.wait(after_s):
            line = (
                f"pytriton: {what}: initialize has run for {time.monotonic() - started:.1f} s and is still "
                f"running; now at: {where(caller)}\n"
            )
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):  # no usable stderr: nothing to report to
                return

    thread = threading.Thread(target=report, name="pytriton-slow-initialize", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
