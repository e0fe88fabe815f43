"""The stub's exit deadline (``pytriton/proxy/stubside/_stub_exit.py``), each timer in a child process.

A child arms the deadline and then cannot exit on its own: a non-daemon thread that never ends
keeps the interpreter's shutdown waiting, as a stuck stub would keep Triton's unload waiting. The
watchdog must end it with its threads' stacks on stderr; with the watchdog cancelled, the alarm
must still end it. Each child is bounded by ``LIMIT_S`` and killed past it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from pytriton.proxy.stubside import _stub_exit

LIMIT_S = 60.0

HANGS_AT_EXIT = """
import threading
from pytriton.proxy.stubside import _stub_exit

def stuck_in_unload():
    threading.Event().wait()

threading.Thread(target=stuck_in_unload).start()  # not a daemon: the interpreter's shutdown waits for it
{before}
_stub_exit.arm(1.0)
{after}
"""


def _run(after: str = "", before: str = "") -> subprocess.CompletedProcess:
    code = textwrap.dedent(HANGS_AT_EXIT.format(before=before, after=after))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=LIMIT_S)  # noqa: S603


def test_a_stub_that_cannot_exit_is_ended_with_its_stacks():
    child = _run()
    assert child.returncode == 1
    assert "Timeout (0:00:01)!" in child.stderr
    assert "stuck_in_unload" in child.stderr  # the stuck thread's stack, for the server's log
    assert "_shutdown" in child.stderr  # the main thread: waiting in the interpreter's shutdown


def test_the_alarm_ends_it_when_the_watchdog_is_gone():
    # The watchdog stops with the interpreter's very last steps; cancelling it stands for a hang after them.
    # The alarm 1 s after the watchdog instead of ALARM_AFTER_S (5 s): the same path, 4 s sooner.
    child = _run("import faulthandler; faulthandler.cancel_dump_traceback_later()", "_stub_exit.ALARM_AFTER_S = 1")
    assert child.returncode == -signal.SIGALRM
    assert "Timeout" not in child.stderr


def test_zero_arms_nothing():
    pending = signal.alarm(0)  # pytest-timeout's own alarm, put back below
    try:
        _stub_exit.arm(0)
        assert signal.alarm(0) == 0  # arm(0) set none
    finally:
        signal.alarm(pending)
