"""Stub side of tracing: the trace context Triton gives each request, for the user's process.

Part of the stub-side package (``stubside/__init__.py``); like the stub itself it may use only the standard library. The stub calls :func:`collect` only
when the server runs in OpenTelemetry trace mode (the ``trace`` flag of the model's private file,
see ``pytriton/proxy/_tracing.py``); otherwise it never touches the requests' traces, so an
untraced server pays nothing for this (asking Triton for a context costs about 3.5 us a request
even when there is none).

The stub opens no span itself: it has no OpenTelemetry SDK or exporter configured, and its
environment may not even have the package. Instead it forwards Triton's context strings unparsed,
with the time it received the batch, and the user's process opens the proxy's span, a child of
Triton's model span, starting at that time.

Unit tests: tests/unit/test_tracing.py.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from ._pb_types import PbRequest


def collect(requests: Sequence[PbRequest]) -> Optional[Tuple[int, List[Optional[str]]]]:
    """``(now in ns since the epoch, [context or None per request])``, or None if no request is traced.

    A context is what the Python backend's ``request.trace().get_context()`` returns: a JSON object
    as a string, with the W3C ``traceparent`` (and ``tracestate`` when the client sent one), or
    None for a request Triton does not trace (sampling, rate).
    """
    started_ns = time.time_ns()
    contexts: List[Optional[str]] = []
    traced = False
    for request in requests:
        try:
            context = request.trace().get_context()
        except Exception:  # noqa: BLE001 - a backend without traces: the request is simply not traced
            context = None
        if context:
            traced = True
            contexts.append(str(context))
        else:
            contexts.append(None)
    return (started_ns, contexts) if traced else None
