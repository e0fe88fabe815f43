"""Shared vocabulary of inference callables: ``Request`` and the result types.

Unit tests: tests/unit/test_api_drift.py (``Request``'s argument order, ``traced_span``),
tests/unit/test_tracing.py (``span`` and ``traced_span`` with and without OpenTelemetry),
tests/unit/test_decorators.py (``Request`` as callables see it).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from typing import (
    Any,
    ContextManager,
    Dict,
    ItemsView,
    Iterator,
    KeysView,
    List,
    Optional,
    Protocol,
    Tuple,
    Union,
    ValuesView,
)

import numpy as np
import numpy.typing as npt

__all__ = [
    "Request",
    "Requests",
    "Response",
    "Responses",
    "InferenceRequest",
    "InferenceRequests",
    "InferenceResult",
    "InferenceResults",
]


class _CancelProbe(Protocol):
    """How a ``Request`` of a batch asks whether its client cancelled (one object per batch)."""

    def __call__(self, index: int) -> bool:
        """Whether request ``index`` of the batch is cancelled (may ask the server)."""

    def known(self, index: int) -> bool:
        """Whether request ``index`` is known to be cancelled, without asking."""


class Request:
    """One inference request as the bound callable sees it.

    Behaves like a read-write ``dict`` from input name to ``np.ndarray`` (``data``). The arrays
    belong to the callable and stay valid for as long as it keeps them. Inputs up to 64 KiB and
    string (BYTES) inputs are copies made for this request. Larger numeric inputs are not copied:
    they are writable views into the shared-memory segment the stub wrote them to. If the callable
    still holds any of them (or a view of one) when it returns, the stub moves to a fresh segment
    for the next batch, so kept arrays are never overwritten (docs/architecture.md, "Arrays you keep
    stay valid"). Changing an input in place is allowed; returning it sends it back without a copy.

    Attributes:
        data: input tensors by name (absent optional inputs are simply missing).
        parameters: request parameters sent by the client, plus headers forwarded by Triton's
            ``*_header_forward_pattern`` options (``None`` when there are none).
        span: the request's OpenTelemetry span (``proxy_inference_callable``, a child of Triton's
            model span) when Triton traces the request, else ``None`` (docs/tracing.md; see
            :meth:`traced_span`).
        requested_output_names: outputs the client asked for (``None`` means all; always
            ``None`` for a model with a single output, where there is nothing to choose).
        sequence_id: for a sequence model (``ModelConfig(sequence_batcher=...)``), the id of the
            sequence this request belongs to (an int, or a str with ``string_ids``); else ``None``.
        sequence_start: the request opens its sequence (the client's ``sequence_start``).
        sequence_end: the request closes its sequence; state kept for it can be dropped
            (docs/sequences.md).
        timeout_s: the request's timeout as the client sent it (Triton's ``timeout`` request
            parameter, in seconds), or ``None``; :meth:`is_cancelled` turns true once it has
            passed, counted from when the callable got the request (docs/cancellation.md).

    :meth:`is_cancelled` tells whether the client still waits for the answer.

    The positional order is ``Request(data, parameters, span, requested_output_names)``, as in
    NVIDIA PyTriton 0.7. For code written against pytriton's earlier order, a list or tuple given
    as the third positional argument (with no fourth) is read as ``requested_output_names``: a span
    is never a sequence.
    """

    __slots__ = (
        "data",
        "parameters",
        "span",
        "requested_output_names",
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "timeout_s",
        "_deadline",
        "_probe",
        "_index",
    )
    # Every slot is written by _fill (below), for __init__ and for pytriton's own builder alike.
    data: Dict[str, npt.NDArray[np.generic]]
    parameters: Optional[Dict[str, Any]]
    span: Any
    requested_output_names: Optional[List[str]]
    sequence_id: Union[int, str, None]
    sequence_start: bool
    sequence_end: bool
    timeout_s: Optional[float]
    _deadline: Optional[float]
    _probe: Optional[_CancelProbe]  # the batch's, set by pytriton (proxy._worker, proxy._backend_kind)
    _index: int

    def __init__(
        self,
        data: Dict[str, npt.NDArray[np.generic]],
        parameters: Optional[Dict[str, Any]] = None,
        span: Any = None,
        requested_output_names: Optional[List[str]] = None,
        *,
        sequence_id: Union[int, str, None] = None,
        sequence_start: bool = False,
        sequence_end: bool = False,
        timeout_s: Optional[float] = None,
    ):
        if span is not None and requested_output_names is None and isinstance(span, (list, tuple)):
            span, requested_output_names = None, list(span)  # the earlier 3-argument order
        _fill(
            self,
            data,
            parameters,
            requested_output_names,
            timeout_s,
            None,
            0,
            (sequence_id, sequence_start, sequence_end),
            span,
        )

    def is_cancelled(self) -> bool:
        """True once nobody waits for this request's answer any more.

        That is when the client cancelled it (a cancelled gRPC call, a gRPC deadline that passed:
        whatever Triton reports as cancelled) or when :attr:`timeout_s` has passed. A long callable
        can poll it and stop early; what it then returns (or raises) is discarded by Triton for a
        cancelled request. Each call that finds the request still wanted asks Triton's stub (one
        round trip on the instance's connection, tens of microseconds), so poll it between steps
        of work, not in a tight loop. Call it from the callable while it runs (any thread); after
        the callable returned it answers with the last known state. Always False for a request
        built by hand (tests).
        """
        if self._deadline is not None and time.monotonic() >= self._deadline:
            return True
        probe = self._probe
        return probe is not None and probe(self._index)

    def _known_cancelled(self) -> bool:
        """:meth:`is_cancelled` without asking the stub: past the timeout, or cancelled at an earlier ask."""
        if self._deadline is not None and time.monotonic() >= self._deadline:
            return True
        probe = self._probe
        return probe is not None and probe.known(self._index)

    def traced_span(self, span_name: str) -> ContextManager[Any]:
        """A context manager timing a block of the callable as a child span of :attr:`span`.

        Without a span (OpenTelemetry absent, or tracing not set up) it does nothing and yields
        ``None``, so callables can use it unconditionally::

            with request.traced_span("preprocess"):
                ...
        """
        if self.span is None:
            return contextlib.nullcontext()
        try:
            from opentelemetry import trace  # type: ignore[import-not-found]  # optional extra
        except ImportError:
            return contextlib.nullcontext()
        context = trace.set_span_in_context(self.span)  # type: ignore[attr-defined,unused-ignore]
        return trace.get_tracer("pytriton").start_as_current_span(span_name, context=context)  # type: ignore[no-any-return,attr-defined,unused-ignore]

    def __getitem__(self, name: str) -> npt.NDArray[np.generic]:
        return self.data[name]

    def __setitem__(self, name: str, value: npt.NDArray[np.generic]) -> None:
        self.data[name] = value

    def __delitem__(self, name: str) -> None:
        del self.data[name]

    def __contains__(self, name: object) -> bool:
        return name in self.data

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return (
            self.data.keys() == other.data.keys()
            and all(np.array_equal(self.data[k], other.data[k]) for k in self.data)
            and self.parameters == other.parameters
        )

    __hash__ = None  # type: ignore[assignment]

    def keys(self) -> KeysView[str]:
        """Input names."""
        return self.data.keys()

    def values(self) -> ValuesView[npt.NDArray[np.generic]]:
        """Input arrays."""
        return self.data.values()

    def items(self) -> ItemsView[str, npt.NDArray[np.generic]]:
        """(name, array) pairs."""
        return self.data.items()

    def get(self, name: str, default: object = None) -> Any:
        """Input ``name`` or ``default``."""
        return self.data.get(name, default)

    def __repr__(self) -> str:
        shapes: List[Tuple[str, object]] = [(k, getattr(v, "shape", None)) for k, v in self.data.items()]
        return f"Request(data={dict(shapes)}, parameters={self.parameters!r})"


_new_object = object.__new__


def _fill(
    request: Request,
    data: Dict[str, npt.NDArray[np.generic]],
    parameters: Optional[Dict[str, object]],
    requested: Optional[List[str]],
    timeout_s: Optional[float],
    probe: Optional[_CancelProbe],
    index: int,
    sequence: Optional[Tuple[Union[int, str, None], bool, bool]] = None,
    span: object = None,
) -> None:
    """Set every slot of ``request``: the one place a ``Request``'s fields are written.

    ``sequence``: ``(sequence_id, sequence_start, sequence_end)``, ``None`` outside a sequence.

    ``Request.__init__`` (callables and tests build requests with it) and :func:`_wire_request`
    (pytriton's own per-request path) both end here, so a slot added to ``Request`` is set in one
    place. ``probe`` and ``index``: the batch's cancellation probe and this request's place in it.
    """
    request.data = data
    request.parameters = parameters
    request.span = span
    request.requested_output_names = requested
    if sequence is None:
        request.sequence_id = None
        request.sequence_start = False
        request.sequence_end = False
    else:
        request.sequence_id, request.sequence_start, request.sequence_end = sequence
    request.timeout_s = timeout_s
    request._deadline = time.monotonic() + timeout_s if timeout_s else None
    request._probe = probe
    request._index = index


def _wire_request(
    data: Dict[str, npt.NDArray[np.generic]],
    parameters: Optional[Dict[str, Any]],
    requested: Optional[List[str]],
    timeout_s: Optional[float],
    probe: Optional[_CancelProbe] = None,
    index: int = 0,
    sequence: Optional[Tuple[Union[int, str], bool, bool]] = None,
) -> Request:
    """The ``Request`` of one request read off the wire: every pytriton path builds its requests here.

    The worker (thread and process instances) and backend instances, on the stub's short and general
    paths alike (``proxy/_backend_kind.py``, ``stubside/_inline.py``). It is what
    ``Request(data, parameters, None, requested, timeout_s=..., sequence_id=...)`` makes, with the
    batch's cancellation probe and the request's index set; not for callables (use ``Request``).

    Why not ``__init__``: it runs for every request of every batch, often with cold caches, and
    skipping the argument handling saves 0.2-0.3 us per request with the caches evicted (340-440 ns
    against 560-760 ns in two runs of ``python -m bench.request_build``). tests/unit/test_api_drift.py
    compares the result with ``__init__``'s, slot by slot.
    """
    request: Request = _new_object(Request)
    _fill(request, data, parameters, requested, timeout_s, probe, index, sequence)
    return request


Requests = List[Request]

# The requests of the batch whose callable is running on this thread (or in this task): set by the
# worker around each call, read by pipeline handles (pytriton.pipeline) to propagate cancellation,
# deadlines and trace context to the models the callable calls.
CURRENT_BATCH: contextvars.ContextVar[Optional[List[Request]]] = contextvars.ContextVar(
    "pytriton_current_batch", default=None
)
# The name of the model whose callable runs on this thread: set by the worker when it starts serving a
# connection, read by pipeline handles to refuse a call that would re-enter a model already waiting on
# the calling chain (pytriton.pipeline, "Cycles").
CURRENT_MODEL: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("pytriton_current_model", default=None)
Response = Dict[str, npt.NDArray[np.generic]]
Responses = List[Response]
# Names used by the decorators module of the reference API.
InferenceRequest = Request
InferenceRequests = Requests
InferenceResult = Response
InferenceResults = Responses
