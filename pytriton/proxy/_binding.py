"""One bound model: its resolved configuration, its repository files and its workers (threads or processes)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import pathlib
import re
import shutil
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from pytriton._platform import paths as _paths
from pytriton.exceptions import PyTritonBadParameterError, PyTritonValidationError
from pytriton.model_config.common import DeviceKind, DynamicBatcher, SequenceBatcher, SequenceStrategy
from pytriton.model_config.dtypes import normalize_dtype
from pytriton.model_config.generator import SEQUENCE_CONTROLS, to_dict, to_pbtxt
from pytriton.model_config.model_config import ModelConfig
from pytriton.model_config.tensor import Tensor
from pytriton.model_config.triton_model_config import TensorSpec, TritonModelConfig
from pytriton.model_config.warmup import WARMUP_DIR, resolve_warmup
from pytriton.proxy import _backend_kind, _bytecode, _process, _stub_model, stubside
from pytriton.proxy._admission import Admission
from pytriton.proxy._worker import InstanceWorker
from pytriton.proxy.stubside import _backend_page, _segments, _stub_exit, _wire, _zmq_channel

_MODEL_NAME = re.compile(r"[A-Za-z0-9_.\-]+")  # whole name: fullmatch (a "$" would allow a final newline)
_MAX_IPC_PATH = 100  # sockaddr_un holds 108 bytes


def backend_region_prefix(shm_prefix: str) -> str:
    """Name prefix of the Python backend's shared-memory regions for one ``Triton`` instance."""
    return f"{shm_prefix}-pb"


def validate_model_name(name: object) -> str:
    """Check a model name; Triton uses it as a directory name and in URLs."""
    if not isinstance(name, str) or not _MODEL_NAME.fullmatch(name) or name in (".", ".."):
        raise PyTritonValidationError(
            f"Invalid model name {name!r}: use only letters, digits, dots, underscores and dashes."
        )
    return name


def poll_window_us(variable: str, default: int, environ: Optional[Mapping[str, str]] = None) -> int:
    """A polling window in microseconds from ``environ`` (default ``os.environ``; see docs/configuration.md)."""
    raw = (os.environ if environ is None else environ).get(variable, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 1_000_000:
        raise PyTritonValidationError(
            f"{variable}={raw!r} is not a polling window: give whole microseconds from 0 (off) to 1000000."
        )
    return value


# Default polling windows in microseconds (docs/configuration.md, docs/performance.md).
# Off: with the stub's reply poll on (1000 us), sequential p50 was no lower, p90 on the 2-core host
# doubled (the poll held a CPU the worker needed) and the server side used 15-25% more CPU per request,
# on the 2-core host and on a 16-core one alike (bench/history.md, "The stub's reply poll").
PROXY_SPIN_US = 0
WORKER_SPIN_US = 0  # off: a worker polling between requests keeps a CPU busy while traffic lasts


@dataclasses.dataclass(frozen=True)
class PollingWindows:
    """How long the stubs poll for a reply and the workers for a request before sleeping, in microseconds.

    Resolved once, when ``Triton`` is constructed, from ``PYTRITON_PROXY_SPIN_US`` and
    ``PYTRITON_WORKER_SPIN_US`` (:meth:`from_env`); every model it binds gets them through its
    :class:`BindingContext`.
    """

    proxy_us: int = PROXY_SPIN_US
    worker_us: int = WORKER_SPIN_US

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> PollingWindows:
        """The windows from ``environ`` (default ``os.environ``); raises ``PyTritonValidationError`` if invalid."""
        return cls(
            proxy_us=poll_window_us("PYTRITON_PROXY_SPIN_US", PROXY_SPIN_US, environ),
            worker_us=poll_window_us("PYTRITON_WORKER_SPIN_US", WORKER_SPIN_US, environ),
        )


def _resolve_tensors(tensors: Sequence[Tensor], prefix: str, model: str) -> List[TensorSpec]:
    specs = []
    for index, tensor in enumerate(tensors, start=1):
        if not isinstance(tensor, Tensor):
            raise PyTritonBadParameterError(
                f"Model {model!r}: {prefix.lower()}s must be pytriton.model_config.Tensor objects, "
                f"got {type(tensor).__name__} at position {index}."
            )
        name = tensor.name or f"{prefix}_{index}"
        if 0 in tensor.shape:
            # Triton refuses such a config with only "failed to poll from model repository".
            raise PyTritonBadParameterError(
                f"Model {model!r}: tensor {name!r} has shape {tensor.shape}; Triton's model configuration "
                "allows only sizes >= 1 or -1 (dynamic). Declare -1 to accept arrays that may be empty."
            )
        dtype = normalize_dtype(tensor.dtype, what=f"Model {model!r}: tensor {name!r}")  # object/bytes -> np.bytes_
        specs.append(TensorSpec(name=name, shape=tensor.shape, dtype=dtype, optional=bool(tensor.optional)))
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise PyTritonBadParameterError(f"Model {model!r}: duplicate {prefix.lower()} names {duplicates}.")
    reserved = sorted(set(names) & set(SEQUENCE_CONTROLS.values()))
    if reserved:
        raise PyTritonBadParameterError(f"Model {model!r}: tensor names {reserved} are reserved by pytriton.")
    if prefix == "OUTPUT" and any(spec.optional for spec in specs):
        raise PyTritonBadParameterError(f"Model {model!r}: outputs cannot be optional.")
    return specs


@dataclasses.dataclass
class BindingContext:
    """What every model of one ``Triton`` instance shares."""

    user_pid: int
    shm_prefix: str
    socket_dir: pathlib.Path
    on_unrecoverable: Callable[[BaseException], None]
    max_request_bytes: int = 0  # 0: no limit (TritonConfig.max_request_bytes)
    # Called with (model name, stub generation, server pid) when a stub process died without saying goodbye.
    on_stub_lost: Optional[Callable[[str, int, int], None]] = None
    polling: PollingWindows = PollingWindows()  # resolved by Triton at construction
    # The TCP transport's endpoint in this process (RemoteTriton(transport="tcp")); None: Unix sockets.
    tcp: Optional[_zmq_channel.Hub] = None
    metrics: bool = False  # the callables' metrics on Triton's /metrics (TritonConfig.callable_metrics)
    # Where the stub package's bytecode is kept between runs (proxy/_bytecode.py); None: none is written.
    bytecode_dir: Optional[pathlib.Path] = None
    tracing: bool = False  # the server traces in OpenTelemetry mode (proxy/_tracing.py)


class BoundModel:
    """A callable (or one callable per instance) bound under a model name.

    Lifetime: created by ``Triton.bind``; :meth:`write_repository` writes its files;
    :meth:`start_workers` must run before Triton loads it; :meth:`stop_workers` releases the
    threads, sockets and arenas.
    """

    def __init__(
        self,
        *,
        index: int,
        model_name: str,
        model_version: int,
        infer_funcs: Union[Callable[..., object], Sequence[Callable[..., object]]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        config: ModelConfig,
        strict: bool,
        context: BindingContext,
        instance_kind: str = "thread",
    ):
        self.name = validate_model_name(model_name)
        if not isinstance(model_version, int) or isinstance(model_version, bool) or model_version < 1:
            raise PyTritonValidationError(f"Model {model_name!r}: model_version must be a positive int.")
        self.version = model_version
        funcs: List[Callable[..., object]] = (
            list(infer_funcs) if isinstance(infer_funcs, (list, tuple)) else [infer_funcs]  # type: ignore[list-item]
        )
        if not funcs or not all(callable(func) for func in funcs):
            raise PyTritonBadParameterError(
                f"Model {model_name!r}: infer_func must be a callable or a non-empty list of callables."
            )
        if not isinstance(config, ModelConfig):
            raise PyTritonBadParameterError(f"Model {model_name!r}: config must be a ModelConfig.")
        if config.batching and config.max_batch_size < 1:
            raise PyTritonBadParameterError(f"Model {model_name!r}: max_batch_size must be >= 1 when batching.")
        self.execution_timeout_s = _execution_timeout(config.execution_timeout_s, model_name)
        sequence = _sequence_batcher(config, model_name)
        if (
            sequence is not None
            and sequence.owner_header
            and sequence.strategy is SequenceStrategy.OLDEST
            and len(funcs) > 1
        ):
            raise PyTritonBadParameterError(
                f"Model {model_name!r}: SequenceBatcher.owner_header with the OLDEST strategy needs one instance "
                "(a sequence moves between instances, and each keeps the owners of the sequences it saw start); "
                "use the DIRECT strategy, or bind one callable."
            )
        self.generation = 0  # grows with each reload that replaces a dead stub (see proxy/stubside/_stub.py)
        self.infer_funcs = funcs
        self.instance_kind = _process.check_instance_kind(instance_kind, model_name)
        if self.instance_kind == "process" and context.tcp is not None:
            # A worker process is handed the slot's listening Unix socket; the TCP transport has one
            # ZeroMQ hub in this process instead, so nothing could be handed over.
            raise PyTritonBadParameterError(
                f"Model {model_name!r}: instance_kind='process' works with the Unix transport only; "
                "use RemoteTriton(transport='unix') or thread instances with transport='tcp'."
            )
        if self.instance_kind == "backend":  # proxy/_backend_kind.py
            _backend_kind.check_backend_binding(
                model_name, tcp=context.tcp is not None, execution_timeout_s=self.execution_timeout_s
            )
        # Process and backend instances: each callable is pickled now, so one that cannot travel fails bind().
        # A backend instance's stub may run another numpy major version: its arrays go in a portable form.
        pickler = _backend_kind.CallablePickler if self.instance_kind == "backend" else None
        self._payloads = (
            [
                _process.dump_callable(func, model_name, slot, self.instance_kind, pickler)
                for slot, func in enumerate(funcs)
            ]
            if self.instance_kind != "thread"
            else []
        )
        self.strict = strict
        self._context = context
        self.endpoint_dir = context.socket_dir / f"m{index}"
        self.shm_prefix = f"{context.shm_prefix}-m{index}"
        if len(str(self.endpoint_dir / f"slot-{len(funcs)}.sock")) > _MAX_IPC_PATH:
            raise PyTritonValidationError(f"Socket directory {context.socket_dir} is too long for a unix socket path.")
        self.config = TritonModelConfig(
            model_name=model_name,
            model_version=model_version,
            max_batch_size=config.max_batch_size if config.batching else 0,
            batching=config.batching,
            batcher=config.batcher if config.batching and sequence is None else None,
            sequence_batcher=sequence,
            instance_group={DeviceKind.KIND_CPU: len(funcs)},
            decoupled=config.decoupled,
            inputs=_resolve_tensors(inputs, "INPUT", model_name),
            outputs=_resolve_tensors(outputs, "OUTPUT", model_name),
            response_cache=bool(config.response_cache),
            # Public on purpose (an integer, no path or pid): a new value makes Triton reload the
            # model, which replaces a dead stub (write_repository, docs/architecture.md).
            backend_parameters={"pytriton.generation": "0"},
        )
        # Read by the stub from its version directory (_wire.PRIVATE_FILE, mode 0600); the served
        # model config holds nothing of this, as any client may read it.
        self._private = {
            "user_pid": context.user_pid,
            "endpoint_dir": str(self.endpoint_dir),
            "slots": len(funcs),
            "shm_prefix": self.shm_prefix,
            "backend_shm_prefix": backend_region_prefix(context.shm_prefix),
            # How long the stub polls for the reply before sleeping; see docs/performance.md.
            "spin_us": context.polling.proxy_us,
            # Larger requests get an error in the stub, before any copy (docs/configuration.md).
            "max_request_bytes": context.max_request_bytes,
            "execution_timeout_s": self.execution_timeout_s or 0.0,
            # A stub being unloaded ends within this time, its stacks in the server's log if it
            # had to be ended (proxy/stubside/_stub_exit.py).
            "exit_deadline_s": _stub_exit.DEADLINE_S,
            "metrics": context.metrics,  # pytriton_* metrics from the stub (docs/metrics.md)
            # The stub forwards Triton's trace contexts only then (proxy/stubside/_stub_trace.py).
            "trace": context.tracing,
        }
        if self.instance_kind == "backend":  # the stub imports pytriton and the callable from these
            self._private["backend_path"] = _process.preparation_data()["sys_path"]
        if sequence is not None:  # the stub reads these control inputs into each request's sequence fields
            self._private["sequence"] = dict(SEQUENCE_CONTROLS)
            self._private["max_open_sequences"] = int(sequence.max_open_sequences)  # per instance, in the stub
            if sequence.owner_header:  # the stub keeps each sequence's owner (_sequences.SequenceOwners)
                self._private["owner_header"] = sequence.owner_header
        self._route = f"m{index}"
        if context.tcp is not None:  # the stub connects here instead (proxy/stubside/_zmq_channel.py)
            tcp = {"endpoint": context.tcp.endpoint, "token": context.tcp.token, "route": self._route}
            if context.tcp.public_key is not None:
                tcp["server_key"] = context.tcp.public_key
            self._private["tcp"] = tcp
        warmup = resolve_warmup(config.model_warmup, self.config.inputs, self.config.max_batch_size, model_name)
        self.config.model_warmup = warmup.entries if warmup is not None and warmup.entries else None
        self._warmup_files = warmup.files if warmup is not None else {}
        self.direct_warmup = warmup.direct if warmup is not None else []  # model_config/warmup.py
        self._worker_poll_s = context.polling.worker_us / 1e6
        self._workers: List[Union[InstanceWorker, _process.ProcessInstance]] = []
        self._page: Optional[_backend_page.Page] = None  # backend instances' status page (stubside/_backend_page.py)

    def incompatibility(self, other: BoundModel) -> Optional[str]:
        """Why this model cannot be another version of ``other`` (a different Triton config), or None."""
        mine, theirs = to_dict(self.config), to_dict(other.config)
        for config in (mine, theirs):
            config.pop("parameters", None)  # the generation; versions share it anyway
            config.pop("version_policy", None)
        differing = sorted(key for key in {*mine, *theirs} if mine.get(key) != theirs.get(key))
        if self._warmup_files != other._warmup_files and "model_warmup" not in differing:
            differing.append("model_warmup data files")
        return f"its {', '.join(differing)} differ" if differing else None

    def write_repository(self, repository: pathlib.Path, versions: Optional[Sequence[int]] = None) -> None:
        """Write ``config.pbtxt`` and the proxy's ``model.py`` under ``repository/<name>``.

        Raises ``UnsafePathError`` (``_platform/paths.py``) if another local user could change the
        repository or a directory written here: the stub runs what is written there.

        ``versions``: every bound version of this name (the shared ``config.pbtxt`` then tells
        Triton to serve exactly those); ``None`` means this version alone.
        """
        self.config.backend_parameters["pytriton.generation"] = str(self.generation)
        self.config.versions = sorted(versions) if versions and len(versions) > 1 else None
        # Private to the user: nothing in here is for other local users to read or change. Each
        # directory must be the serving user's alone (_platform/paths.py: the stub runs what is in
        # it), and each file replaces its path without following a symlink planted there.
        repository = _paths.private_directory(repository, "model repository")  # created 0700 if missing
        model_dir = _paths.private_subdir(repository, self.name, f"directory of model {self.name!r}")
        version_dir = _paths.private_subdir(model_dir, str(self.version), f"version directory of model {self.name!r}")
        _write_private(model_dir / "config.pbtxt", to_pbtxt(self.config).encode())
        if self._warmup_files:  # Triton reads them from <model>/warmup/ while loading
            warmup_dir = _paths.private_subdir(model_dir, WARMUP_DIR, f"warmup directory of model {self.name!r}")
            for file_name, content in self._warmup_files.items():
                _write_private(warmup_dir / file_name, content)
        _write_private(version_dir / _wire.PRIVATE_FILE, json.dumps(self._private).encode())
        payload = version_dir / _backend_kind.PAYLOAD_FILE
        if self.instance_kind == "backend":  # its presence makes model.py run the callable in the stub
            _write_private(payload, _backend_kind.pack(self._payloads, self.config, self.strict))
        elif payload.exists():
            payload.unlink()
        write_stub_package(version_dir, self._context.bytecode_dir)

    def run_direct_warmup(self) -> None:
        """Hand each callable the warmup batches Triton cannot send (``direct_warmup``), in order.

        As NVIDIA PyTriton does: each callable of the model (one per instance; for process
        instances, the parent's copy) gets ``[Request(batch)]`` per warmup request, in this process,
        just before Triton loads the model; a generator is read to its end. A callable that raises
        makes ``PyTritonModelConfigError``, so the model is not loaded, as with Triton's warmup.
        """
        from pytriton.exceptions import PyTritonModelConfigError
        from pytriton.proxy.types import Request

        for func in self.infer_funcs:
            for warmup_name, batch in self.direct_warmup:
                try:
                    result = func([Request({name: array.copy() for name, array in batch.items()})])
                    if inspect.isgenerator(result):
                        for _ in result:
                            pass
                except Exception as exc:
                    raise PyTritonModelConfigError(
                        f"Model {self.name!r}: warmup {warmup_name!r} failed in the callable: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc

    def start_workers(self, wait: bool = True) -> None:
        """Start one worker per instance slot (before Triton loads the model).

        Process instances start in parallel; if one cannot load its callable, every worker started
        here is stopped again and ``_process.WorkerStartError`` says why. ``wait=False`` returns as
        soon as every worker process is launched (``Triton.run()`` starts the server meanwhile): then
        :meth:`wait_workers` waits for them and :meth:`worker_failure` tells a failure without waiting.
        """
        if self._workers:
            return
        self.endpoint_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            tcp = self._context.tcp
            for slot, func in enumerate(self.infer_funcs):
                common: Dict[str, Any] = dict(
                    path=tcp.path(f"{self._route}/{slot}") if tcp else str(self.endpoint_dir / f"slot-{slot}.sock"),
                    config=self.config,
                    strict=self.strict,
                    shm_prefix=f"{self.shm_prefix}-w{slot}",
                    on_unrecoverable=self._context.on_unrecoverable,
                    name=f"{self.name}-{slot}",
                    poll_s=self._worker_poll_s,
                    on_stub_lost=self._stub_lost,
                    metrics=self._context.metrics,
                )
                if self.instance_kind == "backend":  # batches run in the stub; the worker sees it come and go
                    if self._page is None:
                        self._page = _backend_page.Page.create(
                            str(self.endpoint_dir / _backend_page.PAGE_NAME), len(self.infer_funcs)
                        )
                    backend = _backend_kind.BackendInstance(page=self._page, slot=slot, **common)
                    backend.start()
                    self._workers.append(backend)
                elif self._payloads:
                    instance = _process.ProcessInstance(payload=self._payloads[slot], **common)
                    self._workers.append(instance)
                    instance.launch()
                else:
                    worker = InstanceWorker(infer_func=func, **common)
                    worker.start()
                    self._workers.append(worker)
        except BaseException:
            self.stop_workers()
            raise
        if wait:
            self.wait_workers()

    def wait_workers(self) -> None:
        """Wait until every worker process has loaded its callable (at once for thread and backend instances).

        Raises ``_process.WorkerStartError`` (after stopping every worker of this model) if one could not.
        """
        try:
            for started in self._workers:
                if isinstance(started, _process.ProcessInstance):
                    started.wait_ready()
        except BaseException:
            self.stop_workers()
            raise

    def worker_failure(self) -> Optional[_process.WorkerStartError]:
        """Without waiting: why a worker process of this model could not load its callable, or None."""
        for started in self._workers:
            if isinstance(started, _process.ProcessInstance):
                error = started.start_failure()
                if error is not None:
                    return error
        return None

    def _stub_lost(self, generation: int, server_pid: int) -> None:
        callback = self._context.on_stub_lost
        if callback is not None and generation == self.generation:  # older generations are being replaced
            callback(self.name, generation, server_pid)

    def retire_generation(self) -> List[int]:
        """Mark every connection of an older generation as retired; return the pids of its stubs."""
        return [pid for worker in self._workers for pid in worker.retire(self.generation)]

    @property
    def retired_busy(self) -> bool:
        """True while a stub of an older generation still processes a batch."""
        return any(worker.retired_busy() for worker in self._workers)

    @property
    def has_bytes_tensors(self) -> bool:
        """True if an input or output is declared as BYTES (strings)."""
        return any(spec.dtype is np.bytes_ for spec in (*self.config.inputs, *self.config.outputs))

    @property
    def connected(self) -> bool:
        """True while at least one instance stub is attached."""
        return any(worker.connected for worker in self._workers)

    @property
    def serving(self) -> bool:
        """True while every instance has a stub attached (the model can serve on all of them)."""
        return bool(self._workers) and all(worker.connected for worker in self._workers)

    @property
    def busy(self) -> bool:
        """True while a batch is being processed."""
        return any(worker.busy for worker in self._workers)

    def instance_states(self) -> List[Tuple[bool, float, bool]]:
        """Per instance: (a batch is in the callable now, when its last batch ended, its stub is stopped).

        For pytriton/_serving/unresponsive.py.
        """
        return [(worker.busy, worker.last_active, worker.stub_stopped) for worker in self._workers]

    def fail_stuck_calls(self, instances: Sequence[int], text: str, older_than_s: float = 0.0) -> None:
        """Fail the batch in the callable of each of ``instances`` (indices, as in :meth:`instance_states`).

        For pytriton/_serving/unresponsive.py: every worker kind has ``fail_stuck_call`` (a thread or a worker
        process answers ``Error(text)`` and serves on; a backend instance's stub is killed and replaced);
        thread and process instances fail only a call that has run for ``older_than_s``.
        """
        for index in instances:
            if 0 <= index < len(self._workers):
                self._workers[index].fail_stuck_call(text, older_than_s)

    @property
    def last_active(self) -> float:
        """``time.monotonic()`` when any instance last finished a batch (0 if never)."""
        return max((worker.last_active for worker in self._workers), default=0.0)

    @property
    def max_queue_delay_s(self) -> float:
        """Longest time Triton may hold a request in this model's batcher queue."""
        batcher = self.config.batcher
        return batcher.max_queue_delay_microseconds / 1e6 if batcher is not None else 0.0

    def refuse_new(self, admission: Admission) -> None:
        """Draining: a batch reaching an instance from now on runs only if ``admission`` admits it.

        ``admission`` (``pytriton.proxy._admission.Admission``, shared by the instances) admits the
        requests Triton had queued when the drain began and answers the rest with UNAVAILABLE.
        Batches already in a callable finish normally. Irreversible: only ``Triton.stop`` calls it.
        """
        for worker in self._workers:
            worker.admission = admission

    def stop_workers(self) -> None:
        """Stop the worker threads (or processes) and remove the socket files."""
        for worker in self._workers:
            worker.stop()
        self._workers = []
        if self._page is not None:
            self._page.close()
            self._page = None
        shutil.rmtree(self.endpoint_dir, ignore_errors=True)
        _segments.sweep_segments(self.shm_prefix)

    def remove_version_files(self, repository: pathlib.Path) -> None:
        """Delete this version's directory only (other versions of the name stay)."""
        shutil.rmtree(repository / self.name / str(self.version), ignore_errors=True)

    def remove_files(self, repository: pathlib.Path) -> None:
        """Delete the model's repository directory."""
        shutil.rmtree(repository / self.name, ignore_errors=True)


class WorkerStarts:
    """The workers of the models ``Triton.run()`` starts, launched without waiting while the server starts.

    A worker process imports the user's modules (hundreds of milliseconds at least) and the server
    loads its models meanwhile: their stubs connect to the slots' sockets, which listen from the
    launch on, and their hello waits there until the worker process serves it. A server backend that
    polls while the server comes up calls :meth:`check` on each poll, so a worker that cannot load its
    callable fails ``run()`` at once, not after the server's start-up timeout (its stub would wait
    forever); one that cannot poll (the in-process server loads its models inside one library call)
    calls :meth:`wait` before starting the server. Owns nothing: the models' workers are stopped by
    their ``BoundModel`` (``Triton.stop()`` after a failed ``run()``).
    """

    def __init__(self, models: Sequence[BoundModel]) -> None:
        self._models = list(models)

    def check(self) -> None:
        """Raise the first ``_process.WorkerStartError`` known now; return at once otherwise."""
        for model in self._models:
            error = model.worker_failure()
            if error is not None:
                raise error

    def wait(self) -> None:
        """Wait until every worker process has loaded its callable; raise ``WorkerStartError`` if one could not."""
        for model in self._models:
            model.wait_workers()


# A new 0600 file renamed over the path: a symlink planted there is replaced, never followed.
_write_private = _paths.write_private


def copy_stub_package(version_dir: pathlib.Path, bytecode_dir: Optional[pathlib.Path] = None) -> pathlib.Path:
    """Copy the stub-side package whole into ``version_dir``; return the copy's directory.

    Every module of ``pytriton/proxy/stubside`` goes to ``_pytriton_stubside/`` (0700; files 0600,
    like everything pytriton writes into the repository: docs/security.md); the package is flat, so
    its ``*.py`` files are all of it. With ``bytecode_dir`` each comes with its bytecode
    (``_bytecode``, cached there), so the stub does not compile the package before its first request.
    Files overwrite an earlier copy, which a running stub has already imported.
    """
    # The stub imports it: a directory the serving user alone may change (_platform/paths.py).
    package_dir = _paths.private_subdir(version_dir, _stub_model.PACKAGE, "stub package directory")
    os.chmod(package_dir, 0o700)
    for source in sorted(pathlib.Path(stubside.__file__).parent.glob("*.py")):
        _bytecode.copy_with_bytecode(source, package_dir / source.name, _write_private, bytecode_dir)
    return package_dir


def write_stub_package(version_dir: pathlib.Path, bytecode_dir: Optional[pathlib.Path] = None) -> None:
    """The stub side of a model version: the package (:func:`copy_stub_package`) and ``model.py`` that loads it."""
    copy_stub_package(version_dir, bytecode_dir)
    model = pathlib.Path(_stub_model.__file__)
    _bytecode.copy_with_bytecode(model, version_dir / "model.py", _write_private, bytecode_dir)


def _sequence_batcher(config: ModelConfig, model: str) -> Optional[SequenceBatcher]:
    """The model's sequence batcher, checked (None: not a sequence model)."""
    sequence = config.sequence_batcher
    if sequence is None:
        return None
    if not isinstance(sequence, SequenceBatcher):
        raise PyTritonBadParameterError(f"Model {model!r}: sequence_batcher must be a SequenceBatcher or None.")
    if not isinstance(sequence.strategy, SequenceStrategy):
        raise PyTritonBadParameterError(
            f"Model {model!r}: SequenceBatcher.strategy must be SequenceStrategy.DIRECT or SequenceStrategy.OLDEST."
        )
    if config.batcher != DynamicBatcher():
        raise PyTritonBadParameterError(
            f"Model {model!r}: a model has either a dynamic batcher or a sequence batcher; leave "
            "ModelConfig.batcher at its default when sequence_batcher is set (batch settings of the OLDEST "
            "strategy are fields of SequenceBatcher)."
        )
    if config.decoupled:
        raise PyTritonBadParameterError(
            f"Model {model!r}: a sequence model cannot be decoupled in pytriton; stream with a plain "
            "decoupled model, or send one request per step of the sequence."
        )
    fields = ("max_sequence_idle_microseconds", "max_candidate_sequences", "max_queue_delay_microseconds")
    for field in fields + ("max_open_sequences",):
        value = getattr(sequence, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise PyTritonBadParameterError(f"Model {model!r}: SequenceBatcher.{field} must be an int >= 0.")
    header = sequence.owner_header
    if header is not None and (not isinstance(header, str) or not _HEADER_NAME.fullmatch(header)):
        raise PyTritonBadParameterError(
            f"Model {model!r}: SequenceBatcher.owner_header must be None or a lower-case header name "
            f"(letters, digits, '-', '_'; gRPC metadata keys are lower case), e.g. 'authorization'; got {header!r}."
        )
    return sequence


# A header name that is also a valid gRPC metadata key (lower case), as SequenceBatcher.owner_header takes.
_HEADER_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,127}")


def check_owner_forwarded(
    sequence: Optional[SequenceBatcher], http_pattern: Optional[str], grpc_pattern: Optional[str], model: str
) -> None:
    """Raise unless the server forwards ``sequence.owner_header`` to models over HTTP and gRPC.

    Triton forwards a request header as a request parameter when the server's
    ``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern`` (RE2, searched in the
    name, HTTP names without case) matches it; without that, every request of an owner-checked model
    would be refused as carrying no credential. Python's ``re`` stands in for RE2 here.
    """
    if sequence is None or not sequence.owner_header:
        return
    header = sequence.owner_header
    missing = []
    for setting, pattern in (
        ("http_header_forward_pattern", http_pattern),
        ("grpc_header_forward_pattern", grpc_pattern),
    ):
        try:
            forwarded = pattern is not None and re.search(pattern, header) is not None
        except re.error:
            forwarded = False
        if not forwarded:
            missing.append(setting)
    if missing:
        settings = ", ".join(f"{name}={header!r}" for name in missing)
        raise PyTritonBadParameterError(
            f"Model {model!r}: SequenceBatcher.owner_header={header!r} needs the server to forward that header to "
            f"the model; start it with TritonConfig({settings}) (a pattern that matches {header!r})."
        )


def _execution_timeout(value: object, model: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise PyTritonBadParameterError(
            f"Model {model!r}: execution_timeout_s must be a positive number of seconds or None (no limit), "
            f"got {value!r}."
        )
    return float(value)


def short_socket_dir(user_pid: int, token: str) -> pathlib.Path:
    """A private directory with a short path for the unix sockets (``/tmp`` or $XDG_RUNTIME_DIR)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    if not os.path.isdir(base) or len(base) > 40:
        base = "/tmp"
    path = pathlib.Path(base) / f"pytriton-{user_pid}-{token}"
    path.mkdir(mode=0o700, parents=True, exist_ok=False)
    return path
