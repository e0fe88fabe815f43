"""When a dead ``tritonserver`` is started again, and when pytriton gives up: :class:`RestartPolicy`.

Two kinds of failure are told apart, because they call for opposite answers:

* **A crash of a server that was serving.** Triton 2.51 can be crashed by unauthenticated requests
  (a 200 KB body of ``[``, a shape whose element count overflows, a tensor declared larger than the
  memory cap; docs/security.md). A budget of crashes per window would let anyone end the service by
  spending it, so such crashes never make pytriton give up: the first ``burst`` crashes within
  ``window_s`` are restarted at once, later ones after a delay that doubles from ``base_s`` up to
  ``cap_s``. The cap is small (0.5 s) because it bounds how long the service stays down after a
  flood stops: at most the cap plus one start-up.
* **A restart that fails** (the server exits before it is ready or is not ready in time: a bad flag,
  a port taken meanwhile; or a step of the restart raises: ``EMFILE`` with every descriptor taken,
  ``ENOMEM`` or ``EAGAIN`` on fork, a missing file). Such a failure may be transient, so the
  attempt is retried after a delay that doubles from ``retry_base_s`` up to ``retry_cap_s``; after
  ``max_failed_starts`` failed attempts in a row (about 20 s of waiting with the defaults) pytriton
  gives up and ``serve()`` raises, so that the program exits non-zero and its process manager
  (systemd, Kubernetes) starts it afresh. A process that stays alive serving nothing is never a state.

``burst == 0`` turns restarts off: the first crash is final (``Triton(max_server_restarts=0)``).

The clock is injectable so that the policy is tested without waiting (tests/unit/test_restarts.py).
Not thread-safe: only the supervisor thread calls it.
"""

from __future__ import annotations

import collections
import time
from typing import Callable, Deque, Optional

BACKOFF_BASE_S = 0.05
"""The first delayed restart waits this long; each further crash in the window doubles it."""
BACKOFF_CAP_S = 0.5
"""No restart after a crash waits longer than this."""
MAX_FAILED_STARTS = 8
"""Restart attempts in a row that may fail (the server exits or is not ready in time, or a step raises) before pytriton gives up."""
RETRY_BASE_S = 0.5
"""The wait after the first failed restart attempt; each further failure in a row doubles it."""
RETRY_CAP_S = 4.0
"""No retry of a failed restart attempt waits longer than this."""


class RestartPolicy:
    """Decides the delay before each restart and when to give up (see the module docstring)."""

    def __init__(
        self,
        burst: int,
        window_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        base_s: float = BACKOFF_BASE_S,
        cap_s: float = BACKOFF_CAP_S,
        max_failed_starts: int = MAX_FAILED_STARTS,
        retry_base_s: float = RETRY_BASE_S,
        retry_cap_s: float = RETRY_CAP_S,
    ):
        self.burst = burst
        self.window_s = window_s
        self._clock = clock
        self._base_s = base_s
        self._cap_s = cap_s
        self.max_failed_starts = max_failed_starts
        self._retry_base_s = retry_base_s
        self._retry_cap_s = retry_cap_s
        self._crashes: Deque[float] = collections.deque()
        self.failed_starts = 0  # failed starts since the server last came up

    @property
    def enabled(self) -> bool:
        """False when restarts are turned off (``burst == 0``)."""
        return self.burst > 0

    def recent_crashes(self) -> int:
        """Crashes of a serving server within the last ``window_s`` seconds."""
        self._forget_old(self._clock())
        return len(self._crashes)

    def crashed(self) -> Optional[float]:
        """Record a crash of a server that had been serving.

        Returns:
            the seconds to wait before starting it again, or ``None`` when restarts are off.
        """
        if not self.enabled:
            return None
        now = self._clock()
        self._crashes.append(now)
        self._forget_old(now)
        beyond = len(self._crashes) - self.burst
        if beyond <= 0:
            return 0.0
        return min(self._cap_s, self._base_s * 2.0 ** (beyond - 1))

    def start_failed(self) -> bool:
        """Record a restart attempt that failed; True to try again (after :meth:`retry_delay`), False to give up."""
        self.failed_starts += 1
        return self.enabled and self.failed_starts < self.max_failed_starts

    def retry_delay(self) -> float:
        """The seconds to wait before the next attempt after ``failed_starts`` failures in a row.

        ``retry_base_s`` after the first, doubling with each further failure, at most ``retry_cap_s``;
        0 before any failure.
        """
        if self.failed_starts <= 0:
            return 0.0
        return float(min(self._retry_cap_s, self._retry_base_s * 2.0 ** (self.failed_starts - 1)))

    def started(self) -> None:
        """The server came up (ready): a later failed start counts from zero again."""
        self.failed_starts = 0

    def _forget_old(self, now: float) -> None:
        while self._crashes and now - self._crashes[0] > self.window_s:
            self._crashes.popleft()
