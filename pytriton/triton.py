"""``Triton``: bind Python callables and serve them with a real ``tritonserver``.

Typical use::

    with Triton() as triton:
        triton.bind("Identity", infer_fn, inputs=[Tensor(shape=(-1,), dtype=np.float32)],
                    outputs=[Tensor(shape=(-1,), dtype=np.float32)])
        triton.serve()

Resource contract: ``run()`` starts one ``tritonserver`` process (which starts one stub process per
model instance), one worker thread per model instance, a small watchdog process, unix sockets in a
private directory and shared-memory segments named ``pytriton-<pid>-<token>-*``. ``stop()`` (also
called by ``__exit__``, ``serve()`` on SIGINT/SIGTERM, and at interpreter exit) removes all of it;
if the process is killed, the watchdog and the kernel (``PR_SET_PDEATHSIG``) remove it.
"""

from __future__ import annotations

import atexit
import http.client
import json
import logging
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from pytriton.decorators import TritonContext
from pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonServerError,
    PyTritonValidationError,
)
from pytriton.model_config.model_config import ModelConfig
from pytriton.model_config.tensor import Tensor
from pytriton.proxy import _wire
from pytriton.proxy._binding import BindingContext, BoundModel, short_socket_dir, validate_model_name
from pytriton.server._scratch import ScratchDirTracker
from pytriton.server.command import LaunchSettings, build_command, effective_options
from pytriton.server.distribution import find_server, shared_libpython_dir, stub_environment
from pytriton.server.process import TritonServerProcess, check_ports_free, grpc_ready_probe, http_ready_probe
from pytriton.server.triton_config import TritonConfig
from pytriton.server.workspace import Workspace, cleanup_paths

__all__ = ["Triton", "TritonConfig", "Workspace"]

LOGGER = logging.getLogger("pytriton.triton")
MONITORING_PERIOD_SEC = 5.0
STARTUP_TIMEOUT_S = 120.0
_WATCHDOG = pathlib.Path(__file__).parent / "server" / "_watchdog.py"


def _merge_config(config: Optional[TritonConfig]) -> TritonConfig:
    """Explicit config over ``PYTRITON_TRITON_CONFIG_*`` variables over defaults."""
    merged = {key: value for key, value in TritonConfig.from_env().to_dict().items() if value is not None}
    if config is not None:
        merged.update({key: value for key, value in config.to_dict().items() if value is not None})
    return TritonConfig(**merged)


class Triton:
    """A Triton Inference Server serving bound Python callables.

    Args:
        config: server settings; fields left ``None`` fall back to ``PYTRITON_TRITON_CONFIG_*``
            environment variables, then to defaults.
        workspace: directory for the model repository and other files (see :class:`Workspace`);
            a temporary one under ``$PYTRITON_HOME`` when ``None``. Removed by :meth:`stop`.
    """

    def __init__(
        self,
        *,
        config: Optional[TritonConfig] = None,
        workspace: Union[Workspace, str, pathlib.Path, None] = None,
    ):
        self._config = _merge_config(config)
        self._options = effective_options(self._config)
        self._workspace = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
        self._token = secrets.token_hex(4)
        self._pid = os.getpid()
        self._shm_prefix = _wire.shm_prefix(self._pid, self._token)
        self._models: Dict[str, BoundModel] = {}
        self._server: Optional[TritonServerProcess] = None
        self._lock = threading.RLock()
        self._wakeup = threading.Event()
        self._state = "created"
        self._socket_dir: Optional[pathlib.Path] = None
        self._watchdog_fd: Optional[int] = None
        self._watchdog: Optional[subprocess.Popen[bytes]] = None
        self._repository: Optional[pathlib.Path] = None
        self._model_counter = 0
        self._stub_numpy2 = False
        self._scratch = ScratchDirTracker()  # the Python backend's /tmp directory (server/_scratch.py)
        self.triton_context = TritonContext()
        # Even a Triton that is never run owns a workspace (and, once a model is bound, a socket
        # directory): make sure interpreter exit removes them. stop() unregisters this.
        atexit.register(self.stop)

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> Triton:
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()

    # -- binding ---------------------------------------------------------------------------
    def _binding_context(self) -> BindingContext:
        if self._socket_dir is None:
            self._socket_dir = short_socket_dir(self._pid, self._token)
        assert self._socket_dir is not None
        return BindingContext(
            user_pid=self._pid,
            shm_prefix=self._shm_prefix,
            socket_dir=self._socket_dir,
            on_unrecoverable=self._on_unrecoverable,
        )

    def bind(
        self,
        model_name: str,
        infer_func: Union[Callable[..., Any], Sequence[Callable[..., Any]]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: Optional[ModelConfig] = None,
        strict: bool = False,
    ) -> None:
        """Serve ``infer_func`` as model ``model_name``.

        ``infer_func`` receives a ``List[Request]`` and returns one dict of output arrays per
        request (or yields such lists, for ``decoupled`` models). A list of callables creates one
        model instance per callable. Binding after :meth:`run` loads the model into the running
        server before returning. ``strict=True`` also checks output dtypes and shapes.
        """
        validate_model_name(model_name)
        with self._lock:
            if self._state == "stopped":
                raise PyTritonInvalidOperationError("This Triton instance is stopped; create a new one to bind models.")
            if model_name in self._models:
                raise PyTritonValidationError(f"A model named {model_name!r} is already bound.")
            self._model_counter += 1
            model = BoundModel(
                index=self._model_counter,
                model_name=model_name,
                model_version=model_version,
                infer_funcs=infer_func,
                inputs=inputs,
                outputs=outputs,
                config=config if config is not None else ModelConfig(),
                strict=strict,
                context=self._binding_context(),
            )
            self._models[model_name] = model
            self._attach_context(model)
            if self._state == "running":
                try:
                    self._load_live(model)
                except BaseException:
                    del self._models[model_name]
                    model.stop_workers()
                    assert self._repository is not None
                    model.remove_files(self._repository)
                    raise

    def _attach_context(self, model: BoundModel) -> None:
        """Let decorators find the model config: ``__triton_context__`` on each callable (or its instance)."""
        for func in model.infer_funcs:
            self.triton_context.model_configs[func] = model.config
            owner = getattr(func, "__self__", None)
            target: Any = owner if owner is not None and not isinstance(owner, type(sys)) else func
            try:
                target.__triton_context__ = self.triton_context
            except (AttributeError, TypeError):
                LOGGER.debug("Cannot attach the Triton context to %r; decorators needing it will fail.", func)

    def _check_stub_support(self, model: BoundModel) -> None:
        if self._stub_numpy2 and model.has_bytes_tensors:
            raise PyTritonBadParameterError(
                f"Model {model.name!r} declares BYTES (string) tensors, which Triton's Python backend stub cannot "
                f"handle with numpy 2, and numpy 1.x does not exist for Python {sys.version_info.major}."
                f"{sys.version_info.minor}. Use Python 3.9-3.12 for string tensors."
            )

    def _load_live(self, model: BoundModel) -> None:
        assert self._repository is not None
        self._check_stub_support(model)
        model.write_repository(self._repository)
        model.start_workers()
        self._scratch.before_first_load()
        loaded = False
        try:
            self._request_load(model)
            loaded = True
        finally:
            self._claim_scratch(loaded)

    def _request_load(self, model: BoundModel) -> None:
        if self._options.get("allow_http", True):
            host, port = self._options["http_address"], self._options["http_port"]
            connection = http.client.HTTPConnection(_client_host(host), port, timeout=STARTUP_TIMEOUT_S)
            try:
                connection.request("POST", f"/v2/repository/models/{model.name}/load", body=b"{}")
                response = connection.getresponse()
                body = response.read()
            finally:
                connection.close()
            if response.status != 200:
                detail = json.loads(body or b"{}").get("error", body.decode(errors="replace"))
                raise PyTritonModelConfigError(f"Triton could not load model {model.name!r}: {detail}")
        else:
            import tritonclient.grpc as grpcclient
            from tritonclient.utils import InferenceServerException

            client = grpcclient.InferenceServerClient(
                f"{_client_host(self._options['grpc_address'])}:{self._options['grpc_port']}"
            )
            try:
                client.load_model(model.name)
            except InferenceServerException as exc:
                raise PyTritonModelConfigError(f"Triton could not load model {model.name!r}: {exc.message()}") from None
            finally:
                client.close()

    # -- lifecycle -------------------------------------------------------------------------
    def run(self) -> None:
        """Start the server with every bound model and return once all of them are ready."""
        with self._lock:
            if self._state == "stopped":
                raise PyTritonInvalidOperationError("This Triton instance is stopped; create a new one.")
            if self._state == "running":
                return
            started = time.monotonic()
            distribution = find_server(self._config.tritonserver_dir)
            libpython = shared_libpython_dir()
            stub_env = stub_environment()
            self._stub_numpy2 = stub_env.numpy2
            for model in self._models.values():
                self._check_stub_support(model)
            self._check_ports()
            _wire.sweep_dead_owners()
            self._binding_context()
            self._repository = self._config.model_repository or self._workspace.subdir("model-store")
            self._repository.mkdir(parents=True, exist_ok=True)
            for model in self._models.values():
                model.write_repository(self._repository)
                model.start_workers()
            argv = build_command(
                distribution.binary,
                self._config,
                LaunchSettings(
                    model_repository=self._repository,
                    backend_directory=distribution.backend_dir,
                    cache_directory=distribution.cache_dir,
                    shm_region_prefix=f"{self._shm_prefix}-pb",
                    startup_models=list(self._models),
                ),
            )
            argv = [arg for arg in argv if not arg.startswith("--log-file=")]
            env = _server_environment(stub_env.bin_dir, [libpython, *distribution.library_dirs])
            self._server = TritonServerProcess(argv, env, log_path=self._config.log_file)
            self._server.register_on_exit(self._on_server_exit)
            self._state = "running"
            if self._models:
                self._scratch.before_first_load()
            try:
                self._server.start()
                self._start_watchdog()
                self._server.wait_until(self._ready_probe(), STARTUP_TIMEOUT_S, "Triton failed to start")
            except BaseException:
                self._claim_scratch(False)
                self.stop()
                raise
            self._claim_scratch(True)
            LOGGER.info("Triton ready with %d model(s) in %.2f s", len(self._models), time.monotonic() - started)

    def _check_ports(self) -> None:
        ports: Dict[str, int] = {}
        if self._options.get("allow_http", True):
            ports["http"] = self._options["http_port"]
        if self._options.get("allow_grpc", True):
            ports["grpc"] = self._options["grpc_port"]
        if self._options.get("allow_metrics", True):
            ports["metrics"] = self._options["metrics_port"]
        for label, port in ports.items():
            address = self._options.get(f"{label}_address", "127.0.0.1")
            check_ports_free({label: port}, address)

    def _ready_probe(self) -> Callable[[], bool]:
        if self._options.get("allow_http", True):
            return http_ready_probe(_client_host(self._options["http_address"]), self._options["http_port"])
        return grpc_ready_probe(_client_host(self._options["grpc_address"]), self._options["grpc_port"])

    def _claim_scratch(self, loaded: bool) -> None:
        """End the first-load window; hand a claimed scratch directory to the watchdog as well."""
        known = self._scratch.path
        path = self._scratch.after_first_load(loaded)
        if path is not None and path != known and self._watchdog_fd is not None:
            os.write(self._watchdog_fd, f"scratch {path}\n".encode())

    def _start_watchdog(self) -> None:
        assert self._server is not None and self._server.pid is not None
        read_fd, write_fd = os.pipe()
        paths = [str(self._socket_dir)]
        owned = cleanup_paths(self._workspace)
        if owned is not None:
            paths.append(str(owned))
        self._watchdog = subprocess.Popen(  # noqa: S603
            [
                sys.executable,
                "-S",
                str(_WATCHDOG),
                str(read_fd),
                str(self._server.pid),
                self._shm_prefix,
                *paths,
            ],
            pass_fds=(read_fd,),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        os.close(read_fd)
        os.set_inheritable(write_fd, False)
        self._watchdog_fd = write_fd

    def serve(self, monitoring_period_sec: float = MONITORING_PERIOD_SEC) -> None:
        """Run the server and block until SIGINT/SIGTERM, an unrecoverable error or server death.

        Always stops the server before returning.
        """
        self.run()
        previous: Dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[int(signum)] = signal.signal(signum, lambda *_: self._wakeup.set())
        try:
            while not self._wakeup.wait(monitoring_period_sec):
                if not self.is_alive():
                    LOGGER.error("Triton is no longer alive; stopping.")
                    break
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
            self.stop()

    def is_alive(self) -> bool:
        """True while the server runs and every model's workers are up."""
        with self._lock:
            return self._state == "running" and self._server is not None and self._server.is_alive()

    def stop(self) -> None:
        """Stop the server and release every resource. Idempotent; safe from any thread."""
        with self._lock:
            if self._state == "stopped":
                return
            self._state = "stopped"
        atexit.unregister(self.stop)
        started = time.monotonic()
        if self._server is not None:
            grace = float(self._config.exit_timeout_secs if self._config.exit_timeout_secs is not None else 30)
            self._server.stop(grace_s=grace, wait_idle=self._wait_models_detached)
            self._scratch.remove()
        for model in self._models.values():
            model.stop_workers()
        _wire.sweep_segments(self._shm_prefix)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        self._workspace.clean()
        self._release_watchdog()
        self._wakeup.set()
        LOGGER.debug("Triton stopped in %.2f s", time.monotonic() - started)

    def _wait_models_detached(self, deadline: float) -> bool:
        """After SIGINT: True once nothing can still be in flight, so the server may be killed.

        Triton keeps serving open keep-alive connections after SIGINT and only unloads models when
        they close (or after ``exit_timeout_secs``), then polls once per second. Waiting for that
        would make every stop take seconds, so pytriton watches its own workers instead: when
        every instance has said goodbye, or none has worked for a quiet period longer than any
        batcher queue delay, no request is left to finish.
        """
        quiet_s = 0.1 + max((model.max_queue_delay_s for model in self._models.values()), default=0.0)
        signalled = time.monotonic()
        while time.monotonic() < deadline:
            if self._server is None or not self._server.is_alive():
                return False
            models = list(self._models.values())
            if not any(model.busy for model in models):
                if not any(model.connected for model in models):
                    return True
                last = max([signalled, *(model.last_active for model in models)])
                if time.monotonic() - last >= quiet_s:
                    return True
            time.sleep(0.005)
        return False

    def _release_watchdog(self) -> None:
        if self._watchdog_fd is not None:
            try:
                os.write(self._watchdog_fd, b"done\n")
            finally:
                os.close(self._watchdog_fd)
                self._watchdog_fd = None
        if self._watchdog is not None:
            try:
                self._watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
            self._watchdog = None

    def _on_server_exit(self, returncode: int) -> None:
        LOGGER.error("tritonserver exited with code %s; serve() will stop.", returncode)
        self._wakeup.set()

    def _on_unrecoverable(self, exc: BaseException) -> None:
        LOGGER.error("Unrecoverable error in an inference callable (%s); stopping Triton.", exc)
        self._wakeup.set()
        threading.Thread(target=self.stop, name="pytriton-unrecoverable-stop", daemon=True).start()

    # -- introspection ---------------------------------------------------------------------
    @property
    def server_log(self) -> List[str]:
        """The last lines the server printed."""
        return self._server.log_lines if self._server is not None else []

    @property
    def http_url(self) -> str:
        """``http://host:port`` of the HTTP endpoint."""
        return f"http://{_client_host(self._options['http_address'])}:{self._options['http_port']}"

    @property
    def grpc_url(self) -> str:
        """``grpc://host:port`` of the gRPC endpoint."""
        return f"grpc://{_client_host(self._options['grpc_address'])}:{self._options['grpc_port']}"


def _client_host(address: str) -> str:
    """Where a local client connects for a bind address (wildcards mean loopback)."""
    return "127.0.0.1" if address in ("0.0.0.0", "", "::") else address


def _server_environment(stub_bin: pathlib.Path, library_dirs: List[pathlib.Path]) -> Dict[str, str]:
    """Environment of the server: the stub's python3 first on PATH, this libpython first to load."""
    env = dict(os.environ)
    # The stub's embedded interpreter must see its own environment only.
    for name in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"):
        env.pop(name, None)
    env["PATH"] = os.pathsep.join([str(stub_bin), env.get("PATH", "")])
    existing = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(path) for path in library_dirs] + ([existing] if existing else []))
    if sys.platform != "linux":
        raise PyTritonServerError("pytriton runs tritonserver on Linux only.")
    return env
