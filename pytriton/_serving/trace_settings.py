"""Per-model trace settings (``bind(..., trace_config=...)``), kept by model name and sent to the server.

Triton keeps one trace setting per model name, so every version of a name must be bound with the same
``trace_config``; a new server (a restart) knows none, and a name unbound for good must have its
settings cleared, or a model bound later under that name would inherit them. Where the settings go
is the backend's business (:meth:`pytriton._serving.backend.TracingServer.send_trace_settings`). Owns no
resource. Unit tests: tests/unit/test_tracing.py; with a server: tests/e2e/test_tracing.py.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence

from pytriton._serving.backend import ServerBackend, TracingServer
from pytriton.exceptions import PyTritonServerError, PyTritonValidationError
from pytriton.proxy import _tracing

LOGGER = logging.getLogger("pytriton.triton")


class ModelTraceSettings:
    """The trace settings of each bound model name, for one ``Triton`` and its backend.

    Args:
        backend: where the settings are sent.
        trace_config: ``TritonConfig.trace_config``; OpenTelemetry mode (and a backend that can trace)
            turns tracing on: the stubs forward trace contexts (docs/tracing.md).
    """

    def __init__(self, backend: ServerBackend, trace_config: Optional[List[str]]) -> None:
        # Settings reach only a server that takes them (pytriton/_serving/backend.py); the embedded one does not.
        self._target = backend if isinstance(backend, TracingServer) else None
        self.enabled = _tracing.enabled(trace_config) and self._target is not None
        self.by_name: Dict[str, Dict[str, Any]] = {}
        if self.enabled:
            _tracing.configure_export(trace_config)  # where unconfigured processes send spans

    def parse(self, model_name: str, trace_config: Optional[List[str]], bound: bool) -> Optional[Dict[str, Any]]:
        """``bind``'s ``trace_config`` as Triton's per-model trace settings (None: none given).

        ``bound``: another version of the name is bound already (its settings must be the same).
        """
        if trace_config is None:
            return None
        settings = _tracing.model_settings(trace_config, model_name)
        if not self.enabled:
            raise PyTritonValidationError(
                f"Model {model_name!r}: bind(trace_config=...) needs a server that traces in OpenTelemetry mode: "
                "TritonConfig(trace_config=['mode=opentelemetry', 'opentelemetry,url=<collector>/v1/traces', ...])"
                + ("" if self._target is not None else " (Triton(embedded=True) cannot trace)")
                + "."
            )
        known = self.by_name.get(model_name)
        if known is not None and known != settings and bound:
            raise PyTritonValidationError(
                f"Model {model_name!r}: Triton keeps one trace setting per model name, and another version was "
                f"bound with trace_config giving {known}; bind every version with the same trace_config."
            )
        return settings

    def apply(self, model_names: Sequence[str]) -> None:
        """Send the settings of ``model_names`` to the loaded server (after each load)."""
        for name in model_names:
            settings = self.by_name.get(name)
            if settings is not None and self._target is not None:
                self._target.send_trace_settings(name, settings)

    def clear(self, model_name: str) -> None:
        """Before the last version is unloaded: null values restore the server's own settings."""
        settings = self.by_name.get(model_name)
        if settings is not None and self._target is not None:
            try:
                self._target.send_trace_settings(model_name, dict.fromkeys(settings))
            except (PyTritonServerError, OSError) as exc:
                LOGGER.warning("Model %s: could not clear its trace settings: %s", model_name, exc)
