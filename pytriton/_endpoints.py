"""How ``Triton`` talks to its running server: the repository API, trace settings, probes, the drain.

A mixin of :class:`pytriton.triton.Triton` (kept apart so that ``triton.py`` stays about the
object's lifecycle): every request pytriton itself makes to ``tritonserver``'s endpoints goes
through here, with the access token of :class:`~pytriton.server.security.AccessPolicy` for the
restricted endpoint groups. Nothing here owns a resource beyond one call, except
:meth:`ServerEndpoints._hold_http`, whose connection the caller closes. Covered by
tests/unit/test_triton_config.py, tests/unit/test_settings.py and tests/unit/test_drain.py (and
end to end by tests/e2e/test_lifecycle.py, test_security.py, test_drain.py and test_tracing.py).
"""

from __future__ import annotations

import http.client
import json
import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from pytriton._healing import STARTUP_TIMEOUT_S
from pytriton.exceptions import PyTritonModelConfigError, PyTritonServerError, PyTritonValidationError
from pytriton.proxy import _tracing
from pytriton.proxy._binding import BoundModel
from pytriton.server import _drain
from pytriton.server.process import TritonServerProcess, check_ports_free, grpc_ready_probe, http_ready_probe
from pytriton.server.security import AccessPolicy
from pytriton.server.settings import Settings

LOGGER = logging.getLogger(__name__)
# When batches were still running as a stop began, it waits this much longer after the last one:
# the worker marks a batch done before its reply reaches the stub, and Triton then writes the
# responses; with 8 instances finishing together on 2 cores that took over 0.1 s
# (tests/e2e/test_drain.py). A stop of an idle server does not pay it.
RESPONSE_SETTLE_S = 0.4


class ServerEndpoints:
    """The calls ``Triton`` makes to its server (a mixin; the annotations below are ``Triton``'s state)."""

    _settings: Settings
    _access: AccessPolicy
    _embedded: bool
    _tracing: bool
    _models: Dict[Tuple[str, int], BoundModel]
    _server: Optional[TritonServerProcess]
    _trace_settings: Dict[str, Dict[str, Any]]
    # Implemented by Triton and EmbeddedTriton: annotations only, so that nothing here shadows them.
    _versions: Callable[[str], List[BoundModel]]
    _embedded_request: Callable[[str, str], None]

    def _model_trace_settings(self, model_name: str, trace_config: Optional[List[str]]) -> Optional[Dict[str, Any]]:
        """``bind``'s ``trace_config`` as Triton's per-model trace settings (None: none given)."""
        if trace_config is None:
            return None
        settings = _tracing.model_settings(trace_config, model_name)
        if not self._tracing:
            raise PyTritonValidationError(
                f"Model {model_name!r}: bind(trace_config=...) needs a server that traces in OpenTelemetry mode: "
                "TritonConfig(trace_config=['mode=opentelemetry', 'opentelemetry,url=<collector>/v1/traces', ...])"
                + (" (Triton(embedded=True) cannot trace)." if self._embedded else ".")
            )
        known = self._trace_settings.get(model_name)
        if known is not None and known != settings and self._versions(model_name):
            raise PyTritonValidationError(
                f"Model {model_name!r}: Triton keeps one trace setting per model name, and another version was "
                f"bound with trace_config giving {known}; bind every version with the same trace_config."
            )
        return settings

    def _apply_trace_settings(self, model_names: Sequence[str]) -> None:
        """Send the per-model trace settings of ``model_names`` to the loaded server (after each load)."""
        for name in model_names:
            settings = self._trace_settings.get(name)
            if settings is not None and not self._embedded:
                _tracing.send_model_settings(*self._trace_endpoints(), self._access, name, settings, STARTUP_TIMEOUT_S)

    def _clear_trace_settings(self, model_name: str) -> None:
        """Before the last version is unloaded: Triton keeps a model's trace settings by name, so a
        model bound later under this name would inherit them; null values restore the server's."""
        settings = self._trace_settings.get(model_name)
        if settings is not None and not self._embedded:
            try:
                cleared = dict.fromkeys(settings)
                _tracing.send_model_settings(
                    *self._trace_endpoints(), self._access, model_name, cleared, STARTUP_TIMEOUT_S
                )
            except (PyTritonServerError, OSError) as exc:
                LOGGER.warning("Model %s: could not clear its trace settings: %s", model_name, exc)

    def _repository_request(self, action: str, model_name: str) -> None:
        """``POST /v2/repository/models/<model_name>/<action>`` (``load``/``unload``), over HTTP or gRPC.

        Every model-repository call pytriton makes goes through here: it carries the header that the
        server's restriction expects (see :class:`~pytriton.server.security.AccessPolicy`).
        """
        if self._embedded:
            return self._embedded_request(action, model_name)
        http_endpoint = self._settings.http
        if http_endpoint.enabled:
            connection = http.client.HTTPConnection(
                http_endpoint.client_host, http_endpoint.port, timeout=STARTUP_TIMEOUT_S
            )
            try:
                connection.request(
                    "POST",
                    f"/v2/repository/models/{model_name}/{action}",
                    body=b"{}",
                    headers=self._access.http_headers("model-repository"),
                )
                response = connection.getresponse()
                body = response.read()
            finally:
                connection.close()
            if response.status != 200:
                try:
                    detail = json.loads(body or b"{}").get("error", body.decode(errors="replace"))
                except ValueError:
                    detail = body.decode(errors="replace")
                raise PyTritonModelConfigError(f"Triton could not {action} model {model_name!r}: {detail}")
        else:
            import tritonclient.grpc as grpcclient
            from tritonclient.utils import InferenceServerException

            client = grpcclient.InferenceServerClient(f"{self._settings.grpc.client_host}:{self._settings.grpc.port}")
            try:
                call = client.load_model if action == "load" else client.unload_model
                call(model_name, headers=self._access.grpc_headers("model-repository"))
            except InferenceServerException as exc:
                raise PyTritonModelConfigError(
                    f"Triton could not {action} model {model_name!r}: {exc.message()}"
                ) from None
            finally:
                client.close()

    def _endpoints_line(self) -> str:
        """One line: where each enabled endpoint listens and which endpoint groups need the token."""
        if self._embedded:
            return "Triton runs embedded in this process: no network endpoints"
        parts = []
        for (_, endpoint), shown in zip(self._settings.endpoints, ("HTTP", "GRPC", "metrics")):
            if endpoint.enabled:
                parts.append(f"{shown} {endpoint.address}:{endpoint.port}")
        restricted = []
        for protocol in ("http", "grpc"):
            groups = self._access.restricted(protocol)
            restricted.append(f"{protocol}: {','.join(groups) if groups else 'none'}")
        return f"Triton listening on {', '.join(parts)}; restricted endpoints ({'; '.join(restricted)})"

    def _check_ports(self) -> None:
        for label, endpoint in self._settings.endpoints:
            if endpoint.enabled:
                check_ports_free({label: endpoint.port}, endpoint.address)

    def _ready_probe(self) -> Callable[[], bool]:
        http_endpoint, grpc_endpoint = self._settings.http, self._settings.grpc
        if http_endpoint.enabled:
            return http_ready_probe(
                http_endpoint.client_host, http_endpoint.port, headers=self._access.http_headers("health")
            )
        return grpc_ready_probe(
            grpc_endpoint.client_host, grpc_endpoint.port, headers=self._access.grpc_headers("health")
        )

    def _trace_endpoints(self) -> Tuple[Optional[Tuple[str, int]], Tuple[str, int]]:
        """Where this process reaches the HTTP endpoint (None if off) and the gRPC endpoint."""
        http_endpoint, grpc_endpoint = self._settings.http, self._settings.grpc
        http_at = (http_endpoint.client_host, http_endpoint.port) if http_endpoint.enabled else None
        return http_at, (grpc_endpoint.client_host, grpc_endpoint.port)

    def _hold_http(self) -> Optional[_drain.HeldConnection]:
        """An idle connection that keeps Triton serving while it drains (None without HTTP)."""
        http_endpoint = self._settings.http
        if not http_endpoint.enabled:
            return None
        return _drain.HeldConnection.open(
            http_endpoint.client_host, http_endpoint.port, headers=self._access.http_headers("health")
        )

    def _drain(self, deadline: float) -> bool:
        """After SIGINT: the drain delay, then refuse new batches and wait for those in flight."""

        def alive() -> bool:
            server = self._server
            return server is not None and server.is_alive()

        def pending() -> Dict[Tuple[str, str], int]:
            metrics = self._settings.metrics
            if not metrics.enabled:
                return {}  # nothing tells what Triton has queued: refuse at once (docs/architecture.md)
            return _drain.pending_requests(metrics.client_host, metrics.port)

        return _drain.drain(
            deadline,
            self._settings.drain_delay_s,
            lambda: list(self._models.values()),
            self._wait_models_detached,
            alive,
            pending,
        )

    def _wait_models_detached(self, deadline: float) -> bool:
        """After SIGINT: True once nothing can still be in flight, so the server may be killed.

        Triton keeps serving open keep-alive connections after SIGINT and only unloads models when
        they close (or after ``exit_timeout_secs``), then polls once per second. Waiting for that
        would make every stop take seconds, so pytriton watches its own workers instead: when
        every instance has said goodbye, or none has worked for a quiet period longer than any
        batcher queue delay (plus ``RESPONSE_SETTLE_S`` when batches ran during the stop or ended
        less than ``RESPONSE_SETTLE_S`` before it, so that their responses are written), no request
        is left to finish. Batches refused while draining do not count as
        work (their answer needs no callable).
        """
        quiet_s = 0.1 + max((model.max_queue_delay_s for model in self._models.values()), default=0.0)
        signalled = time.monotonic()
        busy_at_start = any(model.busy for model in self._models.values())
        while time.monotonic() < deadline:
            if self._server is None or not self._server.is_alive():
                return False
            models = list(self._models.values())
            # A batch cannot legitimately run past its model's execution timeout: stop waiting then.
            busy = [
                model
                for model in models
                if model.busy
                and (model.execution_timeout_s is None or time.monotonic() - signalled < model.execution_timeout_s)
            ]
            if not busy:
                if not any(model.connected for model in models):
                    return True
                worked = max((model.last_active for model in models), default=0.0)
                # A batch that ended just before the stop (the one that raised an unrecoverable error,
                # which is what started it) may not have its response written yet either.
                recent = busy_at_start or worked > signalled - RESPONSE_SETTLE_S
                settle = quiet_s + (RESPONSE_SETTLE_S if recent else 0.0)
                if time.monotonic() - max(signalled, worked) >= settle:
                    return True
            time.sleep(0.005)
        return False
