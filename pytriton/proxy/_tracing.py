"""OpenTelemetry spans for bound models, in the user's process (docs/tracing.md).

How a traced request travels: Triton, started with ``--trace-config mode=opentelemetry``, opens
its ``InferRequest`` span and a span named after the model, and gives the Python backend the
model span's W3C trace context. The stub forwards it unparsed in the INFER message's optional
``TRACE`` field, with the time it received the batch (``pytriton/proxy/stubside/_stub_trace.py``; the
stub runs no OpenTelemetry SDK). Here the worker opens one span per traced request,
``proxy_inference_callable`` (the name NVIDIA PyTriton uses), a child of Triton's model span that
starts when the stub received the batch and ends once the reply is ready: it is
:attr:`Request.span`. ``Request.traced_span(name)`` opens a child of it, and ``@batch`` opens a
``batch`` child of every traced request's span around the batched call.

Spans are created with the process's global tracer provider (``opentelemetry.trace``). If the
process has not configured one by the first traced batch, pytriton sets one up as NVIDIA PyTriton
does: exporting to the collector URL (and with the ``resource`` attributes) of
``TritonConfig.trace_config``, where Triton sends its own spans, provided the OTLP/HTTP exporter
(``opentelemetry-exporter-otlp-proto-http``) is installed (:func:`configure_export`). OpenTelemetry
is an optional extra (``pip install pytriton[tracing]``): without it, or for a request Triton does not
trace, ``Request.span`` is None, ``traced_span`` does nothing and nothing here is imported.

Cost: while the server does not trace in OpenTelemetry mode, the stub checks one flag per batch
and sends no field, the worker checks the message's length and ``@batch`` checks
``State.seen`` (a one-off benchmark, ``bench/history.md``); per traced request, one span (two under
``@batch``).

Per-model settings (``Triton.bind(..., trace_config=[...])``): :func:`model_settings` turns them
into the body of Triton's ``POST /v2/models/<model>/trace/setting``; Triton keeps the OpenTelemetry
mode and collector URL server-wide (``TritonConfig.trace_config``).

Unit tests: tests/unit/test_tracing.py; with a server: tests/e2e/test_tracing.py.
"""

from __future__ import annotations

import json
import logging
import time
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
)

from pytriton.exceptions import PyTritonBadParameterError, PyTritonServerError
from pytriton.proxy.stubside._messages import Error, FinalReply, TraceFields

LOGGER = logging.getLogger(__name__)

REQUEST_SPAN = "proxy_inference_callable"
BATCH_SPAN = "batch"
TRACER_NAME = "pytriton"
_MISSING = "opentelemetry is not installed"

if TYPE_CHECKING:
    from pytriton.proxy.types import Request


class Span(Protocol):
    """What this module calls on an OpenTelemetry span (``opentelemetry.trace.Span``; an optional extra)."""

    def add_event(self, name: str, timestamp: int) -> None: ...

    def record_exception(self, exception: BaseException) -> None: ...

    def set_status(self, status: object) -> None: ...

    def end(self) -> None: ...


class State:
    """Process-wide tracing state: the lazily imported OpenTelemetry API (``None`` until first
    needed, ``False`` if absent), whether a traced batch has arrived, and the export settings of
    :func:`configure_export` (the last ``Triton`` in OpenTelemetry mode constructed sets them)."""

    api: Any = None
    propagator: Any = None
    tracer: Any = None
    seen = False  # a traced batch arrived once: from then on @batch looks for spans
    warned = False
    export_url: Optional[str] = None  # TritonConfig.trace_config's collector, for configure_export
    export_resource: Dict[str, str] = {}
    export_checked = False


def _api() -> Any:
    """``opentelemetry.trace``, or None if OpenTelemetry is not importable (checked once)."""
    if State.api is None:
        try:
            from opentelemetry import trace  # type: ignore[import-not-found]  # optional extra
            from opentelemetry.trace.propagation.tracecontext import (  # type: ignore[import-not-found]
                TraceContextTextMapPropagator,
            )
        except ImportError:
            State.api = False
        else:
            State.api = trace
            State.propagator = TraceContextTextMapPropagator()
            # A ProxyTracer follows a tracer provider that the user sets later.
            State.tracer = trace.get_tracer(TRACER_NAME)
    return State.api or None


def _reset() -> None:
    """Forget what was imported (tests simulate an environment without OpenTelemetry)."""
    State.api = State.propagator = State.tracer = None
    State.seen = State.warned = State.export_checked = False


def enabled(trace_config: Optional[Sequence[str]]) -> bool:
    """True if ``TritonConfig.trace_config`` puts the server in OpenTelemetry trace mode."""
    return any(entry.replace(" ", "").lower() == "mode=opentelemetry" for entry in trace_config or ())


# Where Triton 2.51 exports when trace_config names no URL.
DEFAULT_COLLECTOR_URL = "http://localhost:4318/v1/traces"


def configure_export(trace_config: Optional[Sequence[str]]) -> None:
    """Remember the collector URL and resource attributes of a tracing server's ``trace_config``."""
    State.export_url = DEFAULT_COLLECTOR_URL
    State.export_resource = {}
    for entry in trace_config or ():
        key, _, value = entry.strip().partition("=")
        key = key.replace(" ", "").lower()
        if key == "opentelemetry,url":
            State.export_url = value.strip()
        elif key == "opentelemetry,resource":
            name, sep, attribute = value.partition("=")
            if sep:
                State.export_resource[name.strip()] = attribute.strip()


def export_provider(url: str, resource: Dict[str, str]) -> Any:
    """An SDK tracer provider exporting over OTLP/HTTP to ``url``; None if those packages are missing."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource  # type: ignore[import-not-found]
        from opentelemetry.sdk.trace import TracerProvider  # type: ignore[import-not-found]
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # type: ignore[import-not-found]
    except ImportError:
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": "pytriton", **resource}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    return provider


def _ensure_export(trace_api: Any) -> None:
    """Once, at the first traced batch: set up :func:`export_provider` unless the process has a provider."""
    if State.export_checked or State.export_url is None:
        return
    State.export_checked = True
    if not isinstance(trace_api.get_tracer_provider(), trace_api.ProxyTracerProvider):
        return  # the application configured OpenTelemetry itself: its provider gets the spans
    provider = export_provider(State.export_url, State.export_resource)
    if provider is None:
        LOGGER.info(
            "pytriton's spans are not exported: configure an OpenTelemetry TracerProvider in this process, or "
            "install opentelemetry-exporter-otlp-proto-http to send them to %s with Triton's.",
            State.export_url,
        )
        return
    trace_api.set_tracer_provider(provider)
    LOGGER.info("pytriton exports its spans to %s (OTLP/HTTP), as Triton does", State.export_url)


def start_spans(
    trace: TraceFields, requests: Sequence[Request], model_name: str, model_version: int
) -> Optional[List[Optional[Span]]]:
    """Open the span of every traced request and set it as ``request.span``.

    ``trace`` is the INFER message's ``trace`` field. Returns the spans, one per request (None for
    an untraced one), for :func:`end_spans`, or None when nothing was opened.
    """
    State.seen = True
    trace_api = _api()
    if trace_api is None:
        if not State.warned:
            State.warned = True
            LOGGER.warning(
                "Triton traces requests to model %r (OpenTelemetry mode) but %s in this process: Request.span "
                "stays None. Install it with: pip install 'pytriton[tracing]'",
                model_name,
                _MISSING,
            )
        return None
    _ensure_export(trace_api)
    started_ns, contexts = trace
    decoded_ns = time.time_ns()
    spans: List[Optional[Span]] = []
    attributes = {
        "pytriton.model_name": model_name,
        "pytriton.model_version": model_version,
        "pytriton.batch.requests": len(requests),
    }
    for request, context in zip(requests, contexts):
        if not context:
            spans.append(None)
            continue
        try:
            parent = State.propagator.extract(carrier=json.loads(context))
        except ValueError:
            LOGGER.debug("Unreadable trace context from Triton: %r", context)
            spans.append(None)
            continue
        span = State.tracer.start_span(REQUEST_SPAN, context=parent, start_time=started_ns, attributes=attributes)
        # Up to here the time went to the stub reading the inputs and to the hop to this process.
        span.add_event("inputs_ready", timestamp=decoded_ns)
        request.span = span
        spans.append(span)
    return spans


def end_spans(spans: Optional[Sequence[Optional[Span]]], reply: Optional[FinalReply]) -> None:
    """End the spans of :func:`start_spans` once the batch's final reply is built (ERROR: failed)."""
    if not spans:
        return
    error = None
    if type(reply) is Error:
        error = reply.text
    status = None
    if error is not None:
        from opentelemetry.trace import Status, StatusCode  # type: ignore[import-not-found]

        status = Status(StatusCode.ERROR, error)
    for span in spans:
        if span is not None:
            if status is not None:
                span.set_status(status)
            span.end()


# -- @batch ---------------------------------------------------------------------------------------
def open_batch_spans(requests: Sequence[object]) -> Optional[List[Span]]:
    """A ``batch`` child span for every traced request (None if there is none, the common case)."""
    if not State.seen:
        return None
    parents = [span for span in (getattr(request, "span", None) for request in requests) if span is not None]
    trace_api = _api() if parents else None
    if trace_api is None:
        return None
    attributes = {"pytriton.batch.requests": len(requests)}
    return [
        State.tracer.start_span(BATCH_SPAN, context=trace_api.set_span_in_context(parent), attributes=attributes)
        for parent in parents
    ]


def _end_all(spans: Sequence[Span], exc: Optional[BaseException]) -> None:
    for span in spans:
        if exc is not None:
            span.record_exception(exc)
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end()


class _EndingSpans:
    """Ends ``spans`` when a streaming callable's generator finishes: as errors if it raised, plainly
    when it returned or was closed early (``GeneratorExit``: the stream was cancelled, not failed)."""

    def __init__(self, spans: Sequence[Span]):
        self._spans = spans

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: Optional[BaseException], traceback: object) -> None:
        _end_all(self._spans, None if isinstance(exc, GeneratorExit) else exc)  # the exception goes on


def call_in_spans(
    spans: Sequence[Span], func: Callable[..., object], args: Sequence[object], kwargs: Mapping[str, object]
) -> object:
    """``func(*args, **kwargs)`` with the first of ``spans`` (from :func:`open_batch_spans`) as the
    current span, so spans the callable opens itself nest under it; a failure ends ``spans`` as errors."""
    try:
        with State.api.use_span(spans[0], end_on_exit=False):
            return func(*args, **kwargs)
    except BaseException as exc:
        _end_all(spans, exc)
        raise


def finish_in_spans(spans: Sequence[Span], finish: Callable[[], object]) -> object:
    """``finish()`` (post-processing the call's result), then end ``spans``: at once for a plain result,
    when it completes, fails or is closed for a coroutine or (async) generator."""
    try:
        result = finish()
    except BaseException as exc:
        _end_all(spans, exc)
        raise
    return _end_when_done(result, spans)


def _end_when_done(result: object, spans: Sequence[Span]) -> object:
    import inspect

    if inspect.isawaitable(result):

        async def awaiting() -> object:
            try:
                value = await result
            except BaseException as exc:
                _end_all(spans, exc)
                raise
            _end_all(spans, None)
            return value

        return awaiting()
    if inspect.isgenerator(result):

        def iterating() -> Iterator[object]:
            with _EndingSpans(spans):
                yield from result

        return iterating()
    if inspect.isasyncgen(result):

        async def iterating_async() -> AsyncIterator[object]:
            with _EndingSpans(spans):
                async for item in result:
                    yield item

        return iterating_async()
    _end_all(spans, None)
    return result


# -- per-model settings -----------------------------------------------------------------------------
_LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
_MODEL_KEYS = {"level": "trace_level", "rate": "trace_rate", "count": "trace_count"}


def model_settings(trace_config: object, model_name: str) -> Dict[str, Any]:
    """The body of ``POST /v2/models/<model>/trace/setting`` for ``bind(..., trace_config=...)``.

    ``trace_config`` is a list of ``setting=value`` strings, as in ``TritonConfig.trace_config``,
    limited to what Triton sets per model: ``level`` (``OFF``, ``TIMESTAMPS``, ``TENSORS``; may be
    repeated), ``rate`` (trace one request in N) and ``count`` (stop after N traces, -1: no limit).
    """
    where = f"Model {model_name!r}: trace_config"
    if isinstance(trace_config, (str, bytes)) or not isinstance(trace_config, (list, tuple)):
        raise PyTritonBadParameterError(f"{where} must be a list of 'setting=value' strings, got {trace_config!r}.")
    body: Dict[str, Any] = {}
    for entry in trace_config:
        key, sep, value = str(entry).replace(" ", "").partition("=")
        key = key.lower()
        if not sep or not value:
            raise PyTritonBadParameterError(f"{where}: {entry!r} is not a 'setting=value' string.")
        if key == "mode" or key.startswith(("opentelemetry,", "triton,")):
            raise PyTritonBadParameterError(
                f"{where}: {entry!r} is a server-wide setting in Triton; set it in TritonConfig(trace_config=[...]). "
                "Per model, only level, rate and count can be set."
            )
        if key not in _MODEL_KEYS:
            raise PyTritonBadParameterError(
                f"{where}: unknown setting {key!r}; per model Triton accepts level, rate and count."
            )
        if key == "level":
            level = value.upper()
            if level not in _LEVELS:
                raise PyTritonBadParameterError(f"{where}: level must be one of {', '.join(_LEVELS)}, got {value!r}.")
            body.setdefault("trace_level", []).append(level)
            continue
        try:
            number = int(value)
        except ValueError:
            number = -2
        if (key == "rate" and number < 1) or (key == "count" and number < -1):
            smallest = "1" if key == "rate" else "-1 (no limit)"
            raise PyTritonBadParameterError(f"{where}: {key} must be a whole number >= {smallest}, got {value!r}.")
        body[_MODEL_KEYS[key]] = str(number)
    if not body:
        raise PyTritonBadParameterError(f"{where} is empty; give level, rate or count (or leave it None).")
    return body


def send_model_settings(
    http: Optional[Tuple[str, int]],
    grpc: Tuple[str, int],
    access: Any,
    model_name: str,
    settings: Mapping[str, object],
    timeout_s: float,
) -> None:
    """Apply per-model trace ``settings`` on the running server (HTTP, or gRPC when HTTP is off).

    ``http`` and ``grpc`` are ``(host, port)`` where a local client reaches each endpoint (``http``
    is None when the server has no HTTP endpoint), ``access`` the
    :class:`~pytriton.server.security.AccessPolicy` whose headers the restricted ``trace`` endpoint
    needs. Triton forgets the settings when it restarts, so the caller sends them after every load.
    """
    if http is not None:
        import http.client as httpclient

        connection = httpclient.HTTPConnection(http[0], http[1], timeout=timeout_s)
        try:
            connection.request(
                "POST",
                f"/v2/models/{model_name}/trace/setting",
                body=json.dumps(settings).encode(),
                headers={"Content-Type": "application/json", **access.http_headers("trace")},
            )
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        if response.status != 200:
            raise PyTritonServerError(
                f"Triton refused the trace settings {settings} of model {model_name!r}: "
                f"{body.decode(errors='replace').strip()}"
            )
        return
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(f"{grpc[0]}:{grpc[1]}")
    try:
        client.update_trace_settings(model_name=model_name, settings=settings, headers=access.grpc_headers("trace"))
    except InferenceServerException as exc:
        raise PyTritonServerError(
            f"Triton refused the trace settings {settings} of model {model_name!r}: {exc.message()}"
        ) from None
    finally:
        client.close()
