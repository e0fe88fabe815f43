"""The blocking, futures-based and asyncio clients for one model (public through :mod:`pytriton.client.client`).

The streaming clients of :mod:`pytriton.client._decoupled` subclass these, so this module is the lower of the two
and imports neither them nor the public face.

Unit test: tests/unit/test_client_core.py (every client on a fake server).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Awaitable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from pytriton.client._base import BaseModelClient, ClosesOnExit
from pytriton.client._drivers import async_clients, run_async, run_sync, sync_clients
from pytriton.client.auth import PathLike
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientQueueFullError,
    PyTritonClientValueError,
)
from pytriton.model_config.triton_model_config import TritonModelConfig

__all__ = ["AsyncioModelClient", "FuturesModelClient", "ModelClient"]

_Outputs = Dict[str, npt.NDArray[np.generic]]
_Parameters = Optional[Dict[str, Any]]  # request parameters or headers
_Sequence = Optional[Tuple[Union[int, str], bool, bool]]  # (sequence_id, start, end) of a sequence model


def _sequence(sequence_id: Union[int, str], start: bool, end: bool) -> _Sequence:
    """What a request of a sequence model carries (docs/sequences.md); None for sequence id 0 (none)."""
    if not sequence_id:
        if start or end:
            raise PyTritonClientValueError("sequence_start and sequence_end need a sequence_id (not 0 or '').")
        return None
    return (sequence_id, bool(start), bool(end))


class ModelClient(BaseModelClient, ClosesOnExit):
    """Blocking client for one model.

    Lifetime: holds tritonclient connections until :meth:`close` (or the end of a ``with`` block).
    With ``lazy_init=False`` the constructor waits up to ``init_timeout_s`` (default 300 s) for the
    server and the model and reads the model config; otherwise that happens on first use. Every
    inference is bounded by ``inference_timeout_s`` (default 60 s) and raises
    ``PyTritonClientTimeoutError`` past it.
    """

    def _open(self) -> None:
        self._lib, self._control, self._infer_client = sync_clients(
            self._url, self._security, min(self._core.init_timeout_s, 60.0), self._core.inference_timeout_s
        )
        if not self._lazy_init:
            try:
                run_sync(self._core.ensure_config(), self._control, self._infer_client)
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        """Close the connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for client in {id(c): c for c in (self._control, self._infer_client)}.values():
            try:
                client.close()
            except Exception:  # closing a half-open gevent client can fail; nothing to recover
                pass

    def wait_for_model(self, timeout_s: float) -> None:
        """Block until the server and model are ready; ``PyTritonClientTimeoutError`` after ``timeout_s``."""
        self._check_open()
        run_sync(self._core.wait_for_model(timeout_s), self._control, self._infer_client)

    def wait_for_server(self, timeout_s: float) -> None:
        """Block until the server is ready (models aside); ``PyTritonClientTimeoutError`` after ``timeout_s``."""
        self._check_open()
        run_sync(self._core.wait_for_server(timeout_s), self._control, self._infer_client)

    def load_model(self, config: Optional[str] = None, files: Optional[Dict[str, bytes]] = None) -> None:
        """Ask the server to load (or reload) this client's model; bounded by ``init_timeout_s`` (gRPC) or
        ``min(init_timeout_s, 60 s)`` (HTTP).

        ``config`` is the model config as JSON text; ``files`` maps ``"file:<path>"`` to the bytes of the
        model directory's files (then ``config`` is required). On a pytriton server this is a restricted
        endpoint: pass ``access_token=``. The cached model config is read again on the next call.
        """
        self._check_open()
        run_sync(self._core.load_model(config, files), self._control, self._infer_client)

    def unload_model(self) -> None:
        """Ask the server to unload this client's model (restricted on a pytriton server: ``access_token=``)."""
        self._check_open()
        run_sync(self._core.unload_model(), self._control, self._infer_client)

    @property
    def model_config(self) -> TritonModelConfig:
        """The model's configuration as read from the server (cached); the first read waits for the
        model within ``init_timeout_s``."""
        self._check_open()
        return run_sync(self._core.ensure_config(), self._control, self._infer_client)  # type: ignore[no-any-return]

    @property
    def is_batching_supported(self) -> bool:
        """True if the model accepts a batch axis (``max_batch_size > 0``)."""
        return self.model_config.max_batch_size > 0

    def _infer(
        self, inputs: Sequence[object], named: Dict[str, object], parameters: _Parameters, headers: _Parameters, batch: bool,
        sequence: _Sequence = None,
    ) -> _Outputs:  # fmt: skip
        self._check_open()
        operation = self._core.infer(inputs, named, parameters, headers, batch, self._lib, sequence)
        return run_sync(operation, self._control, self._infer_client)  # type: ignore[no-any-return]

    def infer_sample(
        self, *inputs: object, parameters: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None,
        sequence_id: Union[int, str] = 0, sequence_start: bool = False, sequence_end: bool = False,
        **named_inputs: object,
    ) -> Dict[str, npt.NDArray[np.generic]]:  # fmt: skip
        """Infer one sample: the batch axis is added for batching models and removed from the outputs.

        ``sequence_id`` (non-zero), ``sequence_start``, ``sequence_end``: the request's place in a
        sequence, for a sequence model (docs/sequences.md); also on ``infer_batch`` and the other clients.
        """
        return self._infer(
            inputs, named_inputs, parameters, headers, batch=False,
            sequence=_sequence(sequence_id, sequence_start, sequence_end),
        )  # fmt: skip

    def infer_batch(
        self, *inputs: object, parameters: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None,
        sequence_id: Union[int, str] = 0, sequence_start: bool = False, sequence_end: bool = False,
        **named_inputs: object,
    ) -> Dict[str, npt.NDArray[np.generic]]:  # fmt: skip
        """Infer a batch (inputs carry the batch axis); only for batching models."""
        return self._infer(
            inputs, named_inputs, parameters, headers, batch=True,
            sequence=_sequence(sequence_id, sequence_start, sequence_end),
        )  # fmt: skip


class FuturesModelClient(BaseModelClient, ClosesOnExit):
    """Non-blocking client: every call returns a ``concurrent.futures.Future``.

    Calls run on a pool of up to ``max_workers`` threads (default 128; ``None``: Python's default,
    ``min(32, cpu_count + 4)``), each with its own blocking :class:`ModelClient` sharing one model
    config. ``max_queue_size`` (default 128; ``None``: unbounded) bounds the calls submitted and not
    yet finished: when full, a call waits for a free slot up to ``inference_timeout_s`` (or, with
    ``non_blocking=True``, at once) and then raises ``PyTritonClientQueueFullError``. After
    :meth:`close` calls raise ``PyTritonClientClosedError``.
    """

    DEFAULT_MAX_WORKERS = 128
    DEFAULT_MAX_QUEUE_SIZE = 128

    def __init__(
        self, url: str, model_name: str, model_version: Optional[str] = None, *,
        # the pool and its queue
        max_workers: Optional[int] = DEFAULT_MAX_WORKERS, max_queue_size: Optional[int] = DEFAULT_MAX_QUEUE_SIZE,
        non_blocking: bool = False,
        # as for BaseModelClient (no lazy_init: each thread's client starts on its first call)
        init_timeout_s: Optional[float] = None, inference_timeout_s: Optional[float] = None,
        model_config: Optional[TritonModelConfig] = None, ensure_model_is_ready: bool = True,
        access_token: Optional[str] = None, root_certificates: Optional[PathLike] = None,
        private_key: Optional[PathLike] = None, certificate_chain: Optional[PathLike] = None,
    ):  # fmt: skip
        if max_workers is not None and max_workers < 1:
            raise PyTritonClientValueError("max_workers must be at least 1.")
        if max_queue_size is not None and max_queue_size < 1:
            raise PyTritonClientValueError("max_queue_size must be at least 1.")
        super().__init__(
            url, model_name, model_version, init_timeout_s=init_timeout_s, inference_timeout_s=inference_timeout_s,
            model_config=model_config, ensure_model_is_ready=ensure_model_is_ready, access_token=access_token,
            root_certificates=root_certificates, private_key=private_key, certificate_chain=certificate_chain,
        )  # fmt: skip
        self._max_workers = max_workers
        self._max_queue_size = max_queue_size
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="pytriton-client")
        self._local = threading.local()
        self._clients: List[ModelClient] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_queue_size) if max_queue_size else None
        self._non_blocking = non_blocking

    def _clone_kwargs(self) -> Dict[str, object]:
        kwargs = super()._clone_kwargs()
        kwargs.update(
            max_workers=self._max_workers, max_queue_size=self._max_queue_size, non_blocking=self._non_blocking
        )
        return kwargs

    def _client(self) -> ModelClient:
        client = getattr(self._local, "client", None)
        if client is None:
            core = self._core
            client = ModelClient(
                str(self._url), core.model_name, core.model_version or None,
                init_timeout_s=core.init_timeout_s, inference_timeout_s=core.inference_timeout_s,
                **self._security.as_kwargs(),
            )  # fmt: skip
            client._core = core  # one shared core: the model config is read once for all threads
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def _submit(self, method: str, *args: object, **kwargs: object) -> Future[object]:
        with self._lock:
            self._check_open()
        if self._slots is not None:
            if self._non_blocking:
                acquired = self._slots.acquire(blocking=False)
            else:
                acquired = self._slots.acquire(timeout=self._core.inference_timeout_s)
            if not acquired:
                raise PyTritonClientQueueFullError(
                    f"The request queue is full ({self._max_queue_size} calls waiting or running); retry later."
                )

        def run() -> Any:
            try:
                target = self._client()
                attribute = getattr(target, method)
                return attribute(*args, **kwargs) if callable(attribute) else attribute
            finally:
                if self._slots is not None:
                    self._slots.release()

        try:
            return self._executor.submit(run)
        except RuntimeError:  # executor shut down concurrently
            if self._slots is not None:
                self._slots.release()
            raise PyTritonClientClosedError("The client is closed.") from None

    def infer_sample(
        self, *inputs: object, parameters: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None,
        sequence_id: Union[int, str] = 0, sequence_start: bool = False, sequence_end: bool = False,
        **named_inputs: object,
    ) -> Future[Any]:  # fmt: skip
        """Future of :meth:`ModelClient.infer_sample`."""
        return self._submit(
            "infer_sample", *inputs, parameters=parameters, headers=headers, sequence_id=sequence_id,
            sequence_start=sequence_start, sequence_end=sequence_end, **named_inputs,
        )  # fmt: skip

    def infer_batch(
        self, *inputs: object, parameters: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None,
        sequence_id: Union[int, str] = 0, sequence_start: bool = False, sequence_end: bool = False,
        **named_inputs: object,
    ) -> Future[Any]:  # fmt: skip
        """Future of :meth:`ModelClient.infer_batch`."""
        return self._submit(
            "infer_batch", *inputs, parameters=parameters, headers=headers, sequence_id=sequence_id,
            sequence_start=sequence_start, sequence_end=sequence_end, **named_inputs,
        )  # fmt: skip

    def wait_for_model(self, timeout_s: float) -> Future[Any]:
        """Future that completes when the model is ready (or fails with a timeout)."""
        return self._submit("wait_for_model", timeout_s)

    def model_config(self) -> Future[Any]:
        """Future of the model's ``TritonModelConfig``."""
        return self._submit("model_config")

    def close(self, wait: bool = True) -> None:
        """Stop accepting calls; with ``wait`` finish queued ones first, else cancel them. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._executor.shutdown(wait=wait, cancel_futures=not wait)
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()


class AsyncioModelClient(BaseModelClient):
    """asyncio client for one model; use ``async with`` and ``await`` its methods.

    Uses ``tritonclient.http.aio`` or ``tritonclient.grpc.aio``. After initialisation (lazy, or in
    ``__aenter__`` with ``lazy_init=False``) each inference is a single server round trip.
    ``model_config`` is an awaitable property: ``config = await client.model_config``.
    """

    _ASYNCIO = True

    def _open(self) -> None:
        self._lib, self._client = async_clients(self._url, self._security)

    async def __aenter__(self) -> AsyncioModelClient:
        if not self._lazy_init:
            try:
                await self._read_config()
            except BaseException:
                await self.close()
                raise
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._client.close()

    async def wait_for_model(self, timeout_s: float) -> None:
        """Wait until the server and model are ready."""
        self._check_open()
        await run_async(self._core.wait_for_model(timeout_s), self._client)

    @property
    def model_config(self) -> Awaitable[TritonModelConfig]:
        """Awaitable of the model's configuration (cached): ``config = await client.model_config``.

        The first read waits for the model within ``init_timeout_s``.
        """
        return self._read_config()

    async def _read_config(self) -> TritonModelConfig:
        self._check_open()
        return await run_async(self._core.ensure_config(), self._client)  # type: ignore[no-any-return]

    async def _infer(
        self, inputs: Sequence[object], named: Dict[str, object], parameters: _Parameters, headers: _Parameters, batch: bool,
        sequence: _Sequence = None,
    ) -> _Outputs:  # fmt: skip
        self._check_open()
        operation = self._core.infer(inputs, named, parameters, headers, batch, self._lib, sequence)
        return await run_async(operation, self._client)  # type: ignore[no-any-return]

    async def infer_sample(
        self, *inputs: object, parameters: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None,
        sequence_id: Union[int, str] = 0, sequence_start: bool = False, sequence_end: bool = False,
        **named_inputs: object,
    ) -> Dict[str, npt.NDArray[np.generic]]:  # fmt: skip
        """Infer one sample (see :meth:`ModelClient.infer_sample`)."""
        return await self._infer(
            inputs, named_inputs, parameters, headers, batch=False,
            sequence=_sequence(sequence_id, sequence_start, sequence_end),
        )  # fmt: skip

    async def infer_batch(
        self, *inputs: object, parameters: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None,
        sequence_id: Union[int, str] = 0, sequence_start: bool = False, sequence_end: bool = False,
        **named_inputs: object,
    ) -> Dict[str, npt.NDArray[np.generic]]:  # fmt: skip
        """Infer a batch (see :meth:`ModelClient.infer_batch`)."""
        return await self._infer(
            inputs, named_inputs, parameters, headers, batch=True,
            sequence=_sequence(sequence_id, sequence_start, sequence_end),
        )  # fmt: skip
