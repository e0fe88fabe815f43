"""``RemoteTriton``: bind Python callables into a Triton server started elsewhere (docs/remote.md).

The server runs in another process, container or pod, started with ``--model-control-mode=explicit``
(:func:`server_command` builds such a command line from pytriton's install). ``RemoteTriton``
binds models exactly like :class:`~pytriton.triton.Triton` (same ``bind``, same worker threads in
this process, same proxy model in the server's stubs) but starts no server: :meth:`RemoteTriton.run`
connects, loads the bound models through the server's model-repository API (with the access token
when that API is restricted) and :meth:`RemoteTriton.stop` unloads them again, leaving the server
running.

Where the model files go (:class:`~pytriton.triton.TritonLifecyclePolicy`):

- ``local_model_store=False`` (the default): they are written into this process's workspace and
  sent with the load request (Triton's file override: the ``config`` and ``file:<path>``
  parameters); the server keeps them in a temporary directory of its own. Nothing but the
  transport needs to be shared.
- ``local_model_store=True``: they are written into a directory the server uses as its
  ``--model-repository`` (``TritonConfig.model_repository``, else the ``workspace`` path), and
  loaded by name.

How the stubs reach this process (``transport``):

- ``"unix"`` (default): Unix sockets and shared memory, as ``Triton`` does. The server must run
  on this host as the same user (it opens the sockets under ``/tmp`` and the ``/dev/shm`` segments,
  all mode 0600); in Kubernetes, two containers of one pod sharing ``/tmp`` and ``/dev/shm``.
- ``"tcp"``: ZeroMQ over TCP, tensors inside the messages (``proxy/stubside/_zmq_channel.py``); the
  server's stub environment needs pyzmq.

Resource contract: worker threads, the Unix socket directory or the TCP hub (one thread, one
listening port), staging files in the workspace; all released by :meth:`RemoteTriton.stop` (also
``__exit__``, ``serve()`` on SIGINT/SIGTERM and interpreter exit), which first unloads the models.

Unit tests: tests/unit/test_remote.py; with a server: tests/e2e/test_remote.py.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import pathlib
import secrets
import shutil
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from pytriton._healing import _State
from pytriton._plan import LaunchPlan
from pytriton.client._url import TritonUrl, parse_url
from pytriton.client.auth import create_auth_headers
from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonServerError,
)
from pytriton.model_config.generator import to_dict
from pytriton.proxy._binding import BindingContext, backend_region_prefix
from pytriton.proxy.stubside import _segments, _zmq_channel
from pytriton.server.command import LaunchSettings
from pytriton.server.distribution import find_server, shared_libpython_dir, stub_environment
from pytriton.server.security import AccessPolicy, TritonSecurityConfig
from pytriton.server.triton_config import TritonConfig
from pytriton.server.workspace import Workspace
from pytriton.triton import Triton, TritonLifecyclePolicy, _server_environment

LOGGER = logging.getLogger("pytriton.triton")
TRANSPORTS = ("unix", "tcp")
REMOTE_LIFECYCLE_POLICY = TritonLifecyclePolicy(launch_triton_on_startup=False, local_model_store=False)
CONNECT_TIMEOUT_S = 30.0
LOAD_TIMEOUT_S = 120.0


class _NoScratch:
    """``Triton`` claims the Python backend's ``/tmp/python_env_*`` directory of a server it starts;
    the remote server's directory is not ours to claim or remove."""

    path = None

    def before_first_load(self) -> None:
        pass

    def after_first_load(self, succeeded: bool) -> None:
        return None

    def remove(self) -> None:
        pass


class RemoteTriton(Triton):
    """Serve bound callables through a Triton server that runs elsewhere.

    Args:
        url: the server, ``[http://|grpc://]host[:port]`` (HTTP and port 8000 by default); the
            model-repository calls go over this protocol.
        workspace: staging directory for the model files (a temporary one when ``None``), or,
            with ``local_model_store=True`` and no ``TritonConfig.model_repository``, the
            server's model repository itself.
        access_token: the token of the server's restricted model-repository endpoints
            (``triton-access-token``), if it restricts them.
        triton_lifecycle_policy: ``launch_triton_on_startup`` must be False (the server runs
            already); ``local_model_store`` picks where the model files go (see the module doc).
            Default: ``TritonLifecyclePolicy(launch_triton_on_startup=False, local_model_store=False)``.
        config: ``model_repository`` (with ``local_model_store=True``), ``max_request_bytes`` and
            ``exit_timeout_secs`` (how long ``stop`` waits for batches in flight) are used; server
            flags are not (the server is not started here).
        transport: ``"unix"`` (same host and user) or ``"tcp"`` (ZeroMQ; tensors in the messages).
        tcp_address: the address the TCP transport listens on (``"127.0.0.1"``; ``"0.0.0.0"`` for
            every interface).
        tcp_port: its port (0: a free one, see :attr:`tcp_endpoint`).
        tcp_advertised_address: the name the server's stubs connect to, when it differs from
            ``tcp_address`` (e.g. a Kubernetes Service name).
        tcp_encryption: encrypt the TCP transport with ZeroMQ's CURVE (the default; pyzmq's wheels
            include it). False sends tensors in clear, for a network you trust.
    """

    def __init__(
        self,
        url: str,
        workspace: Union[Workspace, str, pathlib.Path, None] = None,
        access_token: Optional[str] = None,
        *,
        triton_lifecycle_policy: Optional[TritonLifecyclePolicy] = None,
        config: Optional[TritonConfig] = None,
        transport: str = "unix",
        tcp_address: str = "127.0.0.1",
        tcp_port: int = 0,
        tcp_advertised_address: Optional[str] = None,
        tcp_encryption: bool = True,
    ):
        policy = REMOTE_LIFECYCLE_POLICY if triton_lifecycle_policy is None else triton_lifecycle_policy
        if isinstance(policy, TritonLifecyclePolicy) and policy.launch_triton_on_startup:
            raise PyTritonBadParameterError(
                "RemoteTriton binds into a server that already runs: give it a TritonLifecyclePolicy with "
                "launch_triton_on_startup=False."
            )
        if transport not in TRANSPORTS:
            raise PyTritonBadParameterError(f"transport must be one of {TRANSPORTS}, got {transport!r}.")
        if access_token is not None and (not isinstance(access_token, str) or not access_token):
            raise PyTritonBadParameterError("access_token must be a non-empty string or None.")
        self._url: TritonUrl = parse_url(url)
        # Nothing of this object's own security config reaches a server: it starts none.
        super().__init__(
            config=config,
            workspace=workspace,
            triton_lifecycle_policy=policy,
            security_config=TritonSecurityConfig(restricted_endpoints=[]),
            max_server_restarts=0,
        )
        self._remote_token = access_token
        self._scratch = _NoScratch()  # type: ignore[assignment]
        self._connected = False
        self._hub: Optional[_zmq_channel.Hub] = None
        if transport == "tcp":
            token = secrets.token_urlsafe(32)
            self._hub = _zmq_channel.Hub(
                tcp_address, tcp_port, token, advertised=tcp_advertised_address, encrypt=bool(tcp_encryption)
            )

    # -- what differs from Triton -----------------------------------------------------------
    @property
    def tcp_endpoint(self) -> Optional[str]:
        """``tcp://host:port`` the server's stubs connect to (``None`` with the Unix transport)."""
        return self._hub.endpoint if self._hub is not None else None

    def _binding_context(self) -> BindingContext:
        return dataclasses.replace(super()._binding_context(), tcp=self._hub)

    def get_access_token(self) -> Optional[str]:
        """The token given for the server's restricted endpoints (``None`` if none was given)."""
        return self._remote_token

    def _client(self) -> Any:
        if self._url.protocol == "grpc":
            import tritonclient.grpc as grpcclient

            return grpcclient.InferenceServerClient(self._url.address, ssl=self._url.tls)
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(
            self._url.address, connection_timeout=CONNECT_TIMEOUT_S, network_timeout=LOAD_TIMEOUT_S
        )

    def _headers(self) -> Optional[Dict[str, str]]:
        return create_auth_headers(self._remote_token, self._url.protocol) if self._remote_token else None

    def connect(self, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Wait (up to ``timeout_s``) until the server at ``url`` is live; raises ``PyTritonServerError``."""
        if self._state is _State.STOPPED:
            raise PyTritonInvalidOperationError("This RemoteTriton is stopped; create a new one.")
        deadline = time.monotonic() + timeout_s
        problem = "no answer"
        while True:
            client = self._client()
            try:
                if client.is_server_live(headers=self._headers()):
                    self._connected = True
                    LOGGER.info("Connected to Triton at %s", self._url)
                    return
                problem = "the server is not live"
            except Exception as exc:  # noqa: BLE001 - connection refused, DNS, TLS...: retried until the deadline
                problem = f"{type(exc).__name__}: {exc}"
            finally:
                client.close()
            if time.monotonic() >= deadline:
                raise PyTritonServerError(
                    f"Cannot reach Triton at {self._url} within {timeout_s:g} s ({problem}). Start the server first "
                    "(docs/remote.md) and check the URL."
                )
            time.sleep(0.1)

    def is_connected(self) -> bool:
        """True once :meth:`connect` (or :meth:`run`) reached the server, until :meth:`stop`."""
        return self._connected and self._state is not _State.STOPPED

    def _repository_request(self, action: str, model_name: str) -> None:
        """Load (with the model files unless the store is shared) or unload ``model_name`` on the server."""
        from tritonclient.utils import InferenceServerException

        client = self._client()
        try:
            if action == "load" and not self.triton_lifecycle_policy.local_model_store:
                config, files = self._model_files(model_name)
                client.load_model(model_name, headers=self._headers(), config=config, files=files)
            elif action == "load":
                client.load_model(model_name, headers=self._headers())
            else:
                client.unload_model(model_name, headers=self._headers())
        except InferenceServerException as exc:
            raise PyTritonModelConfigError(
                f"Triton at {self._url} could not {action} model {model_name!r}: {exc.message()}"
            ) from None
        finally:
            client.close()

    def _model_files(self, model_name: str) -> Tuple[str, Dict[str, bytes]]:
        """The load request's override: the config as JSON and every file under the model's directory."""
        assert self._repository is not None
        versions = self._versions(model_name)
        config = to_dict(versions[0].config)
        model_dir = self._repository / model_name
        files = {
            f"file:{path.relative_to(model_dir).as_posix()}": path.read_bytes()
            for path in sorted(model_dir.rglob("*"))
            if path.is_file() and path.name != "config.pbtxt"
        }
        return json.dumps(config), files

    def run(self) -> None:
        """Connect (if needed) and load every bound model into the server; return once they are ready."""
        with self._lock:
            if self._state is _State.STOPPED:
                raise PyTritonInvalidOperationError("This RemoteTriton is stopped; create a new one.")
            if self._state is _State.RUNNING:
                return
            if not self._connected:
                self.connect()
            self._repository = self._store()
            self._repository.mkdir(parents=True, exist_ok=True)
            self._state = _State.RUNNING
            for name in self._model_names():
                self._write_name(name)
                for model in self._versions(name):
                    self._check_stub_support(model)
                    model.start_workers()
                self._request_load(name)
            # Replaces the stubs that die (SelfHealing._replace_stubs; the Unix transport only).
            self._supervisor = threading.Thread(
                target=self._supervise, name=f"pytriton-supervisor-{self._token}", daemon=True
            )
            self._supervisor.start()
            LOGGER.info("%d model(s) loaded into Triton at %s", len(self._model_names()), self._url)

    def _store(self) -> pathlib.Path:
        if not self.triton_lifecycle_policy.local_model_store:
            return self._workspace.subdir("model-store")  # staging; the files travel with the load request
        return self._config.model_repository or self._workspace.path

    def is_alive(self) -> bool:
        """True while the server is live and every bound model has all its instances attached."""
        with self._lock:
            if self._state is not _State.RUNNING:
                return False
            models = list(self._models.values())
        return self._server_serving() and all(model.serving for model in models)

    def _server_serving(self) -> bool:
        """True while the server answers that it is live."""
        client = self._client()
        try:
            return bool(client.is_server_live(headers=self._headers()))
        except Exception:  # noqa: BLE001 - unreachable counts as not live
            return False
        finally:
            client.close()

    def _stub_loss_is_ours(self, server_pid: int) -> bool:
        # With the Unix transport the stubs run on this host and their deaths are checked in /proc
        # (proxy/_worker.py), so a lost stub is replaced as under Triton. Over TCP the stub's process
        # is not visible here: a dropped connection cannot be told from a dead stub, and a live
        # stub connects again by itself at its next batch.
        return self._hub is None

    def stop(self) -> bool:
        """Unload the bound models (the server keeps running) and release every resource. Idempotent.

        Waits up to ``exit_timeout_secs`` (30 s) for batches in flight. Returns True if this call
        stopped the instance.
        """
        with self._lock:
            if self._state is _State.STOPPED:
                return False
            running = self._state is _State.RUNNING
            self._state = _State.STOPPED
        atexit.unregister(self.stop)
        self._events.put(("stop", None))
        supervisor = self._supervisor
        if supervisor is not None and supervisor is not threading.current_thread():
            supervisor.join(LOAD_TIMEOUT_S)  # a replacement it is loading ends first
        models = list(self._models.values())
        if running:
            unloaded = []
            for name in self._model_names():
                try:
                    self._repository_request("unload", name)
                    unloaded.extend(self._versions(name))
                except Exception as exc:  # noqa: BLE001 - the server may be gone; release our side anyway
                    LOGGER.warning("Model %s: unloading it from Triton at %s failed: %s", name, self._url, exc)
            # Only an unloaded model's stubs say goodbye; waiting for the others would only time out.
            self._wait_detached(unloaded, time.monotonic() + self._settings.exit_timeout_s)
        for model in models:
            model.stop_workers()
            if running and self._repository is not None and self.triton_lifecycle_policy.local_model_store:
                model.remove_files(self._repository)
        if self._hub is not None:
            self._hub.close()
        _segments.sweep_segments(self._shm_prefix)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        self._workspace.clean()
        self._connected = False
        self._wakeup.set()
        return True

    @property
    def server_log(self) -> List[str]:
        """Always empty: the server's output belongs to whoever started it."""
        return []

    @property
    def http_url(self) -> str:
        """The server URL given (when it is an HTTP one)."""
        return self._url.with_scheme if self._url.protocol == "http" else ""

    @property
    def grpc_url(self) -> str:
        """The server URL given (when it is a gRPC one)."""
        return self._url.with_scheme if self._url.protocol == "grpc" else ""


def server_command(
    model_repository: Union[str, pathlib.Path],
    config: Optional[TritonConfig] = None,
    security_config: Optional[TritonSecurityConfig] = None,
    region_prefix: Optional[str] = None,
) -> Tuple[List[str], Dict[str, str]]:
    """The argv and environment of a ``tritonserver`` that :class:`RemoteTriton` can bind into.

    Built from this machine's pytriton install, like ``Triton`` builds its own: explicit model
    control, no auto-completion, the Python backend, the stub environment first on ``PATH`` and
    this interpreter's ``libpython`` first to load. ``config`` sets the ports and addresses (8000,
    8001, 8002 on 127.0.0.1 by default); ``security_config`` restricts endpoints (by default the
    model-repository and other management endpoints need ``security_config.access_token``).
    ``pytriton server-command`` prints it (docs/remote.md).
    """
    config = config or TritonConfig()
    security = security_config if security_config is not None else TritonSecurityConfig()
    distribution = find_server(config.tritonserver_dir)
    plan = LaunchPlan.build(
        distribution.binary,
        config,
        LaunchSettings(
            model_repository=pathlib.Path(model_repository),
            backend_directory=distribution.backend_dir,
            cache_directory=distribution.cache_dir,
            shm_region_prefix=region_prefix or backend_region_prefix(f"pytriton-remote-{secrets.token_hex(4)}"),
            access=AccessPolicy(config, security),
        ),
    )
    env = _server_environment(
        stub_environment().bin_dir,
        [shared_libpython_dir(), *distribution.library_dirs],
        malloc_arena_max=config.server_malloc_arena_max,
        allocator=config.server_allocator,
    )
    return plan.to_argv(), env


def command_text(
    argv: Sequence[str],
    env: Dict[str, str],
    names: Sequence[str] = ("PATH", "LD_LIBRARY_PATH", "MALLOC_ARENA_MAX", "LD_PRELOAD", "MALLOC_CONF"),
) -> str:
    """``env NAME=value ... argv`` as one shell line (only the variables that matter)."""
    import shlex

    assignments = [f"{name}={env[name]}" for name in names if name in env]
    return " ".join(shlex.quote(part) for part in ["env", *assignments, *argv])
