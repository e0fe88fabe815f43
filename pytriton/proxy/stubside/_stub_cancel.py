"""Requests whose client cancelled while they waited in Triton's queue are answered, not run.

Part of the stub-side package (``stubside/__init__.py``); only the standard library is imported.

Why. Triton 2.51 hands a request that waited for a busy instance to the model's ``execute`` even
when its gRPC client cancelled it (or its deadline passed) meanwhile: 750 gRPC calls cancelled right
after sending all ran the callable in full (issue 42, item 5). The stub drops them before the batch
reaches the callable (the worker of a thread or process instance, or the callable of a backend
instance): each such request is answered with Triton's ``CANCELLED`` error and counted in
``pytriton_requests_cancelled_total`` (docs/metrics.md); the rest of the batch runs as usual.

Cost. ``request.is_cancelled()`` is an inter-process round trip from the stub to the server (tens of
microseconds), so it is not asked for every request. A request can only have been cancelled while
it waited, and it only waits long behind a long batch of the same instance: Triton gives a queued
request to the instance that frees first, right after that instance's previous batch ended. So a
:class:`Gate` asks only about batches that start within :data:`GAP_S` of the end of a batch that
ran :data:`CHECK_AFTER_S` or longer, or of a batch in which cancelled requests were dropped (more
may be queued behind them). Every other batch pays one clock read and one comparison. What is not
covered: a request cancelled while it queued behind many short batches (each shorter than
``CHECK_AFTER_S``) still runs; so does a request of a sequence model (its callable needs every
request of the sequence, the end flag included); a callable that polls ``Request.is_cancelled()``
sees it there (docs/cancellation.md).

Unit tests: tests/unit/test_stub_cancel.py.
"""

from __future__ import annotations

import time
from typing import Callable, List, Optional, Sequence

# A batch that ran at least this long may have had requests waiting behind it.
CHECK_AFTER_S = 0.01
# How soon after such a batch the next one must start to count as queued behind it. Triton hands a
# queued request to the freed instance at once, but on a loaded 2-core machine more than 50 ms passed
# now and then; a request that did not queue and is asked anyway costs one round trip, next to a
# batch of at least CHECK_AFTER_S.
GAP_S = 0.5

CANCELLED_TEXT = "pytriton: the client cancelled the request before it started; the callable did not run"


class Gate:
    """When to ask Triton which requests of a batch were cancelled (see the module docstring).

    Used by one stub's execute thread only; no lock.
    """

    __slots__ = ("until", "check_after_s", "gap_s", "clock")

    def __init__(
        self, check_after_s: float = CHECK_AFTER_S, gap_s: float = GAP_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.until = 0.0  # a batch starting before this (clock time) is checked
        self.check_after_s = check_after_s
        self.gap_s = gap_s
        self.clock = clock

    def ran(self, started: float, ended: float) -> None:
        """A batch ran from ``started`` to ``ended``: arm the check for the next one if it was long."""
        if ended - started >= self.check_after_s:
            self.until = ended + self.gap_s

    def dropped(self) -> None:
        """Cancelled requests were dropped just now: more of them may be queued."""
        self.until = self.clock() + self.gap_s


def cancelled(requests: Sequence[object]) -> List[int]:
    """Indices of the requests whose client cancelled (Triton's ``is_cancelled()``, one ask each).

    A request whose question fails (the server is going away) counts as not cancelled: it runs.
    """
    found = []
    for index, request in enumerate(requests):
        try:
            if request.is_cancelled():  # type: ignore[attr-defined]
                found.append(index)
        except Exception:  # noqa: BLE001 - never drop a request on a failed question
            continue
    return found


def merge(
    n_requests: int, dropped: Sequence[int], error: Callable[[], object], kept_responses: Optional[Sequence[object]]
) -> List[object]:
    """The batch's responses in request order: ``error()`` for each dropped index, the kept ones' in between."""
    skip = set(dropped)
    kept = iter(kept_responses or ())
    return [error() if index in skip else next(kept) for index in range(n_requests)]
