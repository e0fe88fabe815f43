"""The server backend of ``RemoteTriton``: a Triton server started elsewhere (docs/remote.md).

The server runs in another process, container or pod, started with ``--model-control-mode=explicit``.
:class:`RemoteBackend` starts nothing: ``run()`` connects, loads the bound models through the server's
model-repository API (with the access token when that API is restricted) and ``stop()`` unloads them
again, leaving the server running.

Where the model files go (``TritonLifecyclePolicy.local_model_store``):

- False (the default): they are written into this process's workspace and sent with the load request
  (Triton's file override: the ``config`` and ``file:<path>`` parameters); the server keeps them in a
  temporary directory of its own. Nothing but the transport needs to be shared.
- True: they are written into a directory the server uses as its ``--model-repository``
  (``TritonConfig.model_repository``, else the ``workspace`` path), and loaded by name.

How the stubs reach this process (``transport``): ``"unix"`` (Unix sockets and shared memory, the
server on this host as the same user) or ``"tcp"`` (ZeroMQ over TCP, tensors inside the messages,
``proxy/stubside/_zmq_channel.py``; the server's stub environment needs pyzmq).

Resource contract: the TCP hub (one thread, one listening port) when ``transport="tcp"``, closed by
:meth:`RemoteBackend.release`; no server, no watchdog, no scratch directory (the remote server's
``/tmp/python_env_*`` is not ours to claim or remove). Unit tests: tests/unit/test_remote.py,
tests/unit/test_backends.py; with a server: tests/e2e/test_remote.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import secrets
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from pytriton._platform import paths as _paths
from pytriton._serving.backend import Registry, StopHooks
from pytriton._serving.supervisor import wait_detached
from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonModelConfigError,
    PyTritonServerError,
)
from pytriton.model_config.generator import to_dict
from pytriton.proxy._binding import BindingContext, BoundModel, WorkerStarts
from pytriton.proxy.stubside import _zmq_channel
from pytriton.server.settings import Settings
from pytriton.server.workspace import Workspace

if TYPE_CHECKING:
    from pytriton.client._url import TritonUrl

LOGGER = logging.getLogger("pytriton.triton")
TRANSPORTS = ("unix", "tcp")
CONNECT_TIMEOUT_S = 30.0
LOAD_TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class TcpOptions:
    """``RemoteTriton``'s TCP transport settings (see its docstring)."""

    address: str = "127.0.0.1"
    port: int = 0
    advertised_address: Optional[str] = None
    encryption: bool = True


class RemoteBackend:
    """A Triton server that runs elsewhere, reached at ``url`` (see the module doc)."""

    loads_at_startup = False  # run() loads every bound model through the repository API
    offers_pipelines = False  # pytriton.pipeline.model(name, url=...) reaches them
    # Capabilities (pytriton/_serving/backend.py): TracingServer only. The server is not a LocalServer:
    # its process, scratch directory, regions, exit and log belong to whoever started it, so it is never
    # restarted from here and has no in-process server.

    def __init__(
        self,
        url: str,
        access_token: Optional[str],
        settings: Settings,
        local_model_store: bool,
        transport: str = "unix",
        tcp: TcpOptions = TcpOptions(),
    ) -> None:
        if transport not in TRANSPORTS:
            raise PyTritonBadParameterError(f"transport must be one of {TRANSPORTS}, got {transport!r}.")
        if access_token is not None and (not isinstance(access_token, str) or not access_token):
            raise PyTritonBadParameterError("access_token must be a non-empty string or None.")
        from pytriton.client._url import parse_url  # pytriton.client imports tritonclient: only for RemoteTriton

        self.url: TritonUrl = parse_url(url)
        self._token = access_token
        self._settings = settings
        self._local_model_store = local_model_store
        self._registry: Optional[Registry] = None
        self._running = False
        self.connected = False
        self.hub: Optional[_zmq_channel.Hub] = None
        if transport == "tcp":
            self.hub = _zmq_channel.Hub(
                tcp.address,
                tcp.port,
                secrets.token_urlsafe(32),
                advertised=tcp.advertised_address,
                encrypt=bool(tcp.encryption),
            )

    def attach(self, registry: Registry) -> None:
        self._registry = registry

    # -- the connection ---------------------------------------------------------------------------
    def _client(self) -> Any:
        if self.url.protocol == "grpc":
            import tritonclient.grpc as grpcclient

            return grpcclient.InferenceServerClient(self.url.address, ssl=self.url.tls)
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(
            self.url.address, connection_timeout=CONNECT_TIMEOUT_S, network_timeout=LOAD_TIMEOUT_S
        )

    def _headers(self) -> Optional[Dict[str, str]]:
        from pytriton.client.auth import create_auth_headers

        return create_auth_headers(self._token, self.url.protocol) if self._token else None

    def connect(self, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Wait (up to ``timeout_s``) until the server at ``url`` is live; raises ``PyTritonServerError``."""
        deadline = time.monotonic() + timeout_s
        problem = "no answer"
        while True:
            client = self._client()
            try:
                if client.is_server_live(headers=self._headers()):
                    self.connected = True
                    LOGGER.info("Connected to Triton at %s", self.url)
                    return
                problem = "the server is not live"
            except Exception as exc:  # noqa: BLE001 - connection refused, DNS, TLS...: retried until the deadline
                problem = f"{type(exc).__name__}: {exc}"
            finally:
                client.close()
            if time.monotonic() >= deadline:
                raise PyTritonServerError(
                    f"Cannot reach Triton at {self.url} within {timeout_s:g} s ({problem}). Start the server first "
                    "(docs/remote.md) and check the URL."
                )
            time.sleep(0.1)

    # -- ServerBackend ----------------------------------------------------------------------------
    def prepare(self, timeout_s: Optional[float] = None) -> bool:
        if not self.connected:
            self.connect(CONNECT_TIMEOUT_S if timeout_s is None else timeout_s)
        return False  # the stubs' numpy is the remote environment's: nothing to check here

    def model_store(self, workspace: Workspace) -> pathlib.Path:
        if not self._local_model_store:
            return workspace.subdir("model-store")  # staging; the files travel with the load request
        if self._settings.config.model_repository is None:
            return workspace.path  # checked when the workspace was made
        # The server's stubs run what is written there: only this user may change it (docs/security.md).
        return _paths.private_directory(self._settings.config.model_repository, "model repository")

    def binding_context(self, context: BindingContext) -> BindingContext:
        return dataclasses.replace(context, tcp=self.hub)

    def start(
        self,
        repository: pathlib.Path,
        startup_models: List[str],
        has_models: bool,
        socket_dir: pathlib.Path,
        workers: WorkerStarts,
    ) -> bool:
        workers.wait()  # nothing to start here: run() loads the models next, and their stubs need the workers
        self._running = True
        return True

    def started(self) -> None:
        LOGGER.info("%d model(s) loaded into Triton at %s", len(self._names()), self.url)

    def _names(self) -> List[str]:
        return self._registry.model_names() if self._registry is not None else []

    def repository_request(self, action: str, model_name: str) -> None:
        """Load (with the model files unless the store is shared) or unload ``model_name`` on the server."""
        from tritonclient.utils import InferenceServerException

        client = self._client()
        try:
            if action == "load" and not self._local_model_store:
                config, files = self.model_files(model_name)
                client.load_model(model_name, headers=self._headers(), config=config, files=files)
            elif action == "load":
                client.load_model(model_name, headers=self._headers())
            else:
                client.unload_model(model_name, headers=self._headers())
        except InferenceServerException as exc:
            raise PyTritonModelConfigError(
                f"Triton at {self.url} could not {action} model {model_name!r}: {exc.message()}"
            ) from None
        finally:
            client.close()

    def model_files(self, model_name: str) -> Tuple[str, Dict[str, bytes]]:
        """The load request's override: the config as JSON and every file under the model's directory."""
        assert self._registry is not None
        repository = self._registry.repository()
        assert repository is not None
        versions = self._registry.versions(model_name)
        config = to_dict(versions[0].config)
        model_dir = repository / model_name
        files = {
            f"file:{path.relative_to(model_dir).as_posix()}": path.read_bytes()
            for path in sorted(model_dir.rglob("*"))
            # Bytecode stays here: a server elsewhere may run another Python, and it compiles what it lacks.
            if path.is_file() and path.name != "config.pbtxt" and "__pycache__" not in path.parts
        }
        return json.dumps(config), files

    def send_trace_settings(self, model_name: str, settings: Dict[str, object]) -> None:
        """Set ``model_name``'s trace settings on the server at ``url``, with the access token.

        They go where the models are loaded: ``TritonConfig``'s ports describe a server this
        process would start, which a ``RemoteTriton`` never does (sending there reached nothing,
        or another server on this host).
        """
        from tritonclient.utils import InferenceServerException

        client = self._client()
        try:
            client.update_trace_settings(model_name=model_name, settings=settings, headers=self._headers())
        except InferenceServerException as exc:
            raise PyTritonServerError(
                f"Triton at {self.url} refused the trace settings {settings} of model {model_name!r}: {exc.message()}"
            ) from None
        finally:
            client.close()

    def is_serving(self) -> bool:
        """True while the server answers that it is live."""
        client = self._client()
        try:
            return bool(client.is_server_live(headers=self._headers()))
        except Exception:  # noqa: BLE001 - unreachable counts as not live
            return False
        finally:
            client.close()

    def stub_loss_is_ours(self, server_pid: int) -> bool:
        # With the Unix transport the stubs run on this host and their deaths are checked in /proc
        # (proxy/_worker.py), so a lost stub is replaced as under Triton. Over TCP the stub's process
        # is not visible here: a dropped connection cannot be told from a dead stub, and a live
        # stub connects again by itself at its next batch.
        return self.hub is None

    def stop(self, hooks: StopHooks, running: bool) -> None:
        """Unload the bound models (the server keeps running); waits up to ``exit_timeout_secs`` for batches."""
        hooks.join(LOAD_TIMEOUT_S)  # a replacement it is loading ends first
        if not running or self._registry is None:
            return
        unloaded: List[BoundModel] = []
        for name in self._registry.model_names():
            try:
                self.repository_request("unload", name)
                unloaded.extend(self._registry.versions(name))
            except Exception as exc:  # noqa: BLE001 - the server may be gone; release our side anyway
                LOGGER.warning("Model %s: unloading it from Triton at %s failed: %s", name, self.url, exc)
        # Only an unloaded model's stubs say goodbye; waiting for the others would only time out.
        wait_detached(unloaded, time.monotonic() + self._settings.exit_timeout_s)

    def release(self, models: List[BoundModel], repository: Optional[pathlib.Path]) -> None:
        if self._running and repository is not None and self._local_model_store:
            for model in models:
                model.remove_files(repository)
        if self.hub is not None:
            self.hub.close()
        self.connected = False

    # -- what users see ---------------------------------------------------------------------------
    def http_url(self) -> str:
        """The server URL given (when it is an HTTP one)."""
        return self.url.with_scheme if self.url.protocol == "http" else ""

    def grpc_url(self) -> str:
        """The server URL given (when it is a gRPC one)."""
        return self.url.with_scheme if self.url.protocol == "grpc" else ""

    def access_token(self) -> Optional[str]:
        """The token given for the server's restricted endpoints (``None`` if none was given)."""
        return self._token

    def endpoints_line(self) -> str:
        return f"Triton at {self.url} serves the models of this process"
