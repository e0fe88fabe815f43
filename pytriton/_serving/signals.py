"""How ``Triton.serve()`` is stopped by SIGINT and SIGTERM: its handlers, installed before ``run()``.

The handlers are installed before ``run()``: the server answers ready inside ``run()``, and a SIGINT
sent right after that must stop it even where the parent started this process with SIGINT ignored (no
``KeyboardInterrupt`` then). A Ctrl-C during the start still aborts the start at once where Python's own
SIGINT handler was in place. Only the main thread can install handlers; elsewhere nothing is installed and
``serve()`` waits for ``stop()`` from another thread. Unit test: tests/unit/test_serve_signals.py.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Dict


class StopSignals:
    """SIGINT and SIGTERM set ``wakeup`` (``serve()``'s wait) from construction until :meth:`restore`.

    Lifetime: the previous handlers are kept and put back by :meth:`restore` (idempotent), which
    ``serve()`` calls before it stops the server, so that a second Ctrl-C interrupts a stop as it always did.
    """

    def __init__(self, wakeup: threading.Event) -> None:
        self._wakeup = wakeup
        self._previous: Dict[int, Any] = {}
        #: True until ``run()`` returned: a SIGINT then raises ``KeyboardInterrupt`` where Python's own
        #: handler was in place, aborting the start.
        self.starting = True
        if threading.current_thread() is threading.main_thread():
            handler = self._on_signal  # one object for both signals
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[int(signum)] = signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._wakeup.set()
        if self.starting and signum == signal.SIGINT and self._previous.get(signum) is signal.default_int_handler:
            raise KeyboardInterrupt

    def restore(self) -> None:
        """Put the previous handlers back."""
        while self._previous:
            number, handler = self._previous.popitem()
            signal.signal(number, handler)
