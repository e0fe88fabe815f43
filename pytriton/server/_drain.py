"""Graceful drain for ``Triton.stop()``: readiness false first, requests in flight finish, new ones refused.

What Triton 2.51 itself does after SIGINT (measured, docs/architecture.md "Graceful drain"): it
first stops its HTTP endpoint, closing every *new* HTTP connection at once without a response (so
``/v2/health/ready`` fails for a probe that connects anew, as kubelet's and most load balancers'
do), while connections already open and the whole gRPC endpoint keep being served, models loaded.
That phase lasts until the last HTTP connection has closed or its exit timeout has passed. Only
then does it unload the models, and a request arriving after that fails with NOT_FOUND ("unknown
model"), which no client or load balancer treats as retryable.

pytriton therefore drives the drain itself (:func:`drain`, called by ``TritonServerProcess.stop``
right after its SIGINT), in phases:

1. *hold*: before the signal, ``Triton.stop`` opens one idle HTTP keep-alive connection to its own
   server (:class:`HeldConnection`), so Triton stays in its first phase for the whole drain and
   every refusal comes from pytriton, never Triton's NOT_FOUND;
2. *not ready*: SIGINT; readiness fails for new connections, everything else is still served;
3. *delay*: ``TritonConfig.drain_delay_secs`` (default 0) of that, for load balancers that poll
   readiness to stop sending;
4. *refuse*: every worker answers each new batch with UNAVAILABLE (HTTP 503, gRPC UNAVAILABLE;
   ``BoundModel.refuse_new``), except the requests Triton had already queued for the model when
   this phase began: Triton's scheduler queue is first in, first out, so the next ``n`` requests
   to reach the instances, ``n`` read from Triton's ``nv_inference_pending_request_count`` metric,
   are those (:class:`Admission`). Batches already in a callable finish;
5. *wait*: until no batch is in a callable and the quiet period has passed since the last one
   finished (``Triton._wait_models_detached``), at most ``exit_timeout_secs``; then the caller
   ends the server's process group.

Lifetimes: the held connection is closed by ``Triton.stop`` once the server is gone. Nothing here
starts a thread or a process. Unit tests: tests/unit/test_drain.py.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import time
from typing import Callable, Dict, Optional, Protocol, Sequence, Tuple

from pytriton.proxy._admission import Admission

_DELAY_STEP_S = 0.02  # how often the delay checks whether the server is still alive


# One line of Triton's Prometheus text: requests waiting in a model version's scheduler queue.
_PENDING = re.compile(r'^nv_inference_pending_request_count\{model="([^"]*)",version="([^"]*)"\} (\d+)', re.M)


class Refusable(Protocol):
    """A bound model as the drain sees it (``pytriton.proxy._binding.BoundModel``)."""

    name: str
    version: int

    def refuse_new(self, admission: Admission) -> None: ...


def pending_requests(host: str, port: int, timeout_s: float = 1.0) -> Dict[Tuple[str, str], int]:
    """``(model, version) -> requests queued in Triton``, from its metrics endpoint ({} if unreadable)."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        text = response.read().decode("utf-8", "replace") if response.status == 200 else ""
    except (OSError, http.client.HTTPException):
        text = ""
    finally:
        connection.close()
    return {(model, version): int(count) for model, version, count in _PENDING.findall(text)}


class HeldConnection:
    """One idle HTTP/1.1 keep-alive connection to the server, opened before its SIGINT.

    Triton 2.51 finishes its HTTP phase of shutting down only once every HTTP connection has
    closed; while this one is open it keeps its models loaded and serves the connections and the
    gRPC calls it already has, which is what the drain needs. :meth:`close` is idempotent.
    """

    def __init__(self, connection: http.client.HTTPConnection):
        self._connection: Optional[http.client.HTTPConnection] = connection

    @classmethod
    def open(
        cls, host: str, port: int, headers: Optional[Dict[str, str]] = None, timeout_s: float = 1.0
    ) -> Optional[HeldConnection]:
        """Connect and complete one ``GET /v2/health/live``; ``None`` if the server does not answer it."""
        connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
        try:
            connection.request("GET", "/v2/health/live", headers=headers or {})
            response = connection.getresponse()
            response.read()
            if response.status != 200 or response.will_close:
                connection.close()
                return None
        except (OSError, http.client.HTTPException):
            connection.close()
            return None
        return cls(connection)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.close()


def drain(
    deadline: float,
    delay_s: float,
    models: Callable[[], Sequence[Refusable]],
    wait_detached: Callable[[float], bool],
    alive: Callable[[], bool],
    pending: Callable[[], Dict[Tuple[str, str], int]] = dict,
) -> bool:
    """Phases 3 to 5 above, after the SIGINT; True once the server may be ended (nothing in flight).

    ``delay_s`` is cut short by ``deadline`` or by the server dying; ``pending()`` gives the
    requests queued per ``(model, version)`` (:func:`pending_requests`; a model it does not name
    refuses at once); ``wait_detached(deadline)`` is the wait for the batches in flight and
    returns its answer.
    """
    end = min(deadline, time.monotonic() + max(0.0, delay_s))
    while alive():
        left = end - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(_DELAY_STEP_S, left))
    queued = pending()  # read before refusing starts: a request dequeued meanwhile only adds to it
    for model in models():
        model.refuse_new(Admission(queued.get((model.name, str(model.version)), 0)))
    return wait_detached(deadline)
