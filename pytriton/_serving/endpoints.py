"""How pytriton talks to a ``tritonserver`` it launched: the repository API, trace settings, probes, the drain's connection.

:class:`ServerEndpoints` is the network client of :class:`pytriton._serving.launched.LaunchedBackend`: every request
pytriton itself makes to the server's endpoints goes through here, with the access token of
:class:`~pytriton.server.security.AccessPolicy` for the restricted endpoint groups. Nothing here owns a
resource beyond one call, except :meth:`ServerEndpoints.hold_http`, whose connection the caller closes.
Covered by tests/unit/test_triton_config.py, tests/unit/test_settings.py, tests/unit/test_check.py and
tests/unit/test_drain.py (and end to end by tests/e2e/test_lifecycle.py, test_security.py, test_drain.py
and test_tracing.py).
"""

from __future__ import annotations

import http.client
import json
import logging
from typing import Any, Callable, Dict, Optional, Tuple

from pytriton.constants import DEFAULT_TRITON_STARTUP_TIMEOUT_S
from pytriton.exceptions import PyTritonModelConfigError
from pytriton.proxy import _tracing
from pytriton.server import _drain
from pytriton.server.process import check_ports_free, grpc_ready_probe, http_ready_probe, listening_probe
from pytriton.server.security import AccessPolicy
from pytriton.server.settings import Settings

LOGGER = logging.getLogger(__name__)
STARTUP_TIMEOUT_S = float(DEFAULT_TRITON_STARTUP_TIMEOUT_S)  # also for a restarted server and each load


class ServerEndpoints:
    """The calls pytriton makes to the endpoints of the server it launched, as ``settings`` and ``access`` say."""

    def __init__(self, settings: Settings, access: AccessPolicy) -> None:
        self._settings = settings
        self._access = access

    def send_trace_settings(self, model_name: str, settings: Dict[str, Any]) -> None:
        """Set ``model_name``'s trace settings on the server (``None`` values restore the server's own)."""
        _tracing.send_model_settings(*self._trace_endpoints(), self._access, model_name, settings, STARTUP_TIMEOUT_S)

    def repository_request(self, action: str, model_name: str) -> None:
        """``POST /v2/repository/models/<model_name>/<action>`` (``load``/``unload``), over HTTP or gRPC.

        Every model-repository call pytriton makes goes through here: it carries the header that the
        server's restriction expects (see :class:`~pytriton.server.security.AccessPolicy`).
        """
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

    def endpoints_line(self) -> str:
        """One line: where each enabled endpoint listens and which endpoint groups need the token."""
        parts = []
        for (_, endpoint), shown in zip(self._settings.endpoints, ("HTTP", "GRPC", "metrics")):
            if endpoint.enabled:
                parts.append(f"{shown} {endpoint.address}:{endpoint.port}")
        restricted = []
        for protocol in ("http", "grpc"):
            groups = self._access.restricted(protocol)
            restricted.append(f"{protocol}: {','.join(groups) if groups else 'none'}")
        return f"Triton listening on {', '.join(parts)}; restricted endpoints ({'; '.join(restricted)})"

    def check_ports(self) -> None:
        """Raise ``PyTritonServerError`` naming the holder if an enabled endpoint's port is taken."""
        for label, endpoint in self._settings.endpoints:
            if endpoint.enabled:
                check_ports_free({label: endpoint.port}, endpoint.address)

    def ready_probe(self) -> Callable[[], bool]:
        """A check that the server answers ready (HTTP if enabled, else gRPC) and, when the metrics
        endpoint is on, that it accepts connections too.

        Why the metrics port as well: Triton starts its metrics endpoint after HTTP and gRPC, so a
        ready answer can come a moment before ``/metrics`` listens, and a scrape right after
        ``run()`` returned was refused (seen in CI).
        """
        http_endpoint, grpc_endpoint, metrics = self._settings.http, self._settings.grpc, self._settings.metrics
        if http_endpoint.enabled:
            ready = http_ready_probe(
                http_endpoint.client_host, http_endpoint.port, headers=self._access.http_headers("health")
            )
        else:
            ready = grpc_ready_probe(
                grpc_endpoint.client_host, grpc_endpoint.port, headers=self._access.grpc_headers("health")
            )
        if not metrics.enabled or metrics.port == 0:  # port 0: Triton picks one, which is not known here
            return ready
        listening = listening_probe(metrics.client_host, metrics.port)
        return lambda: ready() and listening()

    def _trace_endpoints(self) -> Tuple[Optional[Tuple[str, int]], Tuple[str, int]]:
        """Where this process reaches the HTTP endpoint (None if off) and the gRPC endpoint."""
        http_endpoint, grpc_endpoint = self._settings.http, self._settings.grpc
        http_at = (http_endpoint.client_host, http_endpoint.port) if http_endpoint.enabled else None
        return http_at, (grpc_endpoint.client_host, grpc_endpoint.port)

    def hold_http(self) -> Optional[_drain.HeldConnection]:
        """An idle connection that keeps Triton serving while it drains (None without HTTP); the caller closes it."""
        http_endpoint = self._settings.http
        if not http_endpoint.enabled:
            return None
        return _drain.HeldConnection.open(
            http_endpoint.client_host, http_endpoint.port, headers=self._access.http_headers("health")
        )

    def pending_requests(self) -> Dict[Tuple[str, str], int]:
        """What Triton has queued per (model, version), from its metrics; empty when they are off."""
        metrics = self._settings.metrics
        if not metrics.enabled:
            return {}  # nothing tells what Triton has queued: refuse at once (docs/architecture.md)
        return _drain.pending_requests(metrics.client_host, metrics.port)
