"""Stub side of unloading: a stub that is being unloaded ends, however its shutdown goes.

Part of the stub-side package (``stubside/__init__.py``); like the stub itself it may use only the standard library.

Why. When Triton unloads a Python-backend model instance it sends the stub its finalize message and
then waits for the stub process to exit with ``waitpid``, without a time limit. Until it exits, the
unload does not complete: the model's name cannot be loaded again and a server stop hangs too. The
stub's own shutdown (pytriton's ``finalize``, then the interpreter's: its threads, its modules,
the extension libraries' teardown) is normally over in well under a second, but any part of it
that blocks would block the server's model management for good.

What. :func:`arm` starts, at the beginning of ``finalize``, two timers that run outside Python's
interpreter, so they fire whether the interpreter is shutting down or a thread holds the GIL:

- ``faulthandler``'s watchdog (a C thread): at ``deadline_s`` it writes every Python thread's
  stack to the stub's stderr, which is the server's log, under the line ``Timeout (h:mm:ss)!``,
  and ends the process (exit status 1). It works until the very end of the interpreter's shutdown.
- ``alarm(2)`` a few seconds later: after the interpreter is gone (C++ teardown), SIGALRM's
  default action ends the process. The stub installs no SIGALRM handler.

A stub that exits in time never sees either. The deadline comes from the model's private file
(``exit_deadline_s``, :data:`DEADLINE_S` from ``Triton.bind``); 0 turns this off (the unit tests,
which call ``finalize`` in the test process itself).

Unit tests: tests/unit/test_stub_exit.py.
"""

from __future__ import annotations

import faulthandler
import math
import signal

# pytriton's own finalize waits at most about 12 s (5 s for each of its two threads, 1 s for the
# worker's goodbye, 1 s for a TCP connection's last message), and is normally done in
# milliseconds; the interpreter's shutdown takes well under a second.
DEADLINE_S = 20.0
# How much later than the watchdog the alarm fires (it only matters if the watchdog is gone).
ALARM_AFTER_S = 5


def arm(deadline_s: float) -> None:
    """End this process (stacks first) if it still runs ``deadline_s`` seconds from now; 0: do nothing.

    Call once, when the process has started to go away: nothing cancels it.
    """
    if deadline_s <= 0:
        return
    faulthandler.dump_traceback_later(deadline_s, exit=True)
    signal.alarm(math.ceil(deadline_s) + ALARM_AFTER_S)
