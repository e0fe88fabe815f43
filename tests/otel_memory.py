"""An in-memory OpenTelemetry span exporter on the process's global tracer provider (tests only).

The global provider can be set once per process, so every test module that needs spans adds its
own exporter to the one SDK provider (setting it first if nobody did).
"""

from __future__ import annotations

from typing import Any, Dict, List


def memory_exporter() -> Any:
    """A fresh ``InMemorySpanExporter`` receiving every span ended from now on (until its shutdown)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def by_name(spans: List[Any]) -> Dict[str, List[Any]]:
    """Finished spans grouped by name."""
    named: Dict[str, List[Any]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named
