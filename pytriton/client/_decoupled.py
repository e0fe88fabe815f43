"""Streaming clients for decoupled models (gRPC bidirectional streaming).

Each call returns a generator (or async generator) that yields one dict of outputs per response
the model sends, and ends when the server marks the stream complete. An error response raises
``PyTritonClientInferenceServerError`` with the server's message.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, AsyncIterator, Dict, Iterator, Optional, Tuple

import numpy as np

from pytriton.client._base import BaseModelClient
from pytriton.client._core import map_error
from pytriton.client._drivers import run_sync
from pytriton.client.auth import PathLike
from pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)
from pytriton.model_config.triton_model_config import TritonModelConfig


def _is_final(result: Any) -> bool:
    parameter = result.get_response().parameters.get("triton_final_response")
    return bool(parameter is not None and parameter.bool_param)


def _has_outputs(result: Any) -> bool:
    return len(result.get_response().outputs) > 0


class _StreamingBase(BaseModelClient):
    """URL checks and request preparation shared by the streaming clients."""

    def _open(self) -> None:
        if self._url.protocol != "grpc":
            raise PyTritonClientValueError(
                f"Streaming (decoupled) models need gRPC, but {str(self._url)!r} is HTTP; use grpc://host:port "
                "(default port 8001)."
            )

    def _check_config(self, config: TritonModelConfig) -> None:
        if not config.decoupled:
            raise PyTritonClientValueError(
                f"Model {config.model_name!r} is not decoupled; use ModelClient / AsyncioModelClient for it."
            )

    def _stream_request(
        self,
        config: TritonModelConfig,
        inputs: Any,
        named_inputs: Dict[str, Any],
        parameters: Optional[Dict[str, Any]],
        batch: bool,
        lib: Any,
    ) -> Tuple[Dict[str, Any], bool]:
        self._check_config(config)
        arrays, add_axis = self._core.prepare_inputs(inputs, named_inputs, batch, config)
        request = self._core.build_request(arrays, config, parameters, None, lib)
        request.pop("client_timeout", None)
        request["model_name"] = self._core.model_name
        request["enable_empty_final_response"] = True
        return request, add_axis

    def _decode(self, result: Any, remove_axis: bool) -> Dict[str, np.ndarray]:
        assert self._core.config is not None
        return self._core.decode(result, self._core.config, remove_axis)


class DecoupledModelClient(_StreamingBase):
    """Blocking streaming client: ``for outputs in client.infer_sample(...)``.

    Lifetime: one gRPC connection until :meth:`close`; one stream at a time. Waiting for the next
    response is bounded by ``inference_timeout_s``.
    """

    def _open(self) -> None:
        super()._open()
        import tritonclient.grpc as lib

        self._lib = lib
        self._client = self._security.apply(
            lib.InferenceServerClient(self._url.address, **self._security.grpc_options(self._url)), self._url
        )
        self._lock = threading.Lock()
        if not self._lazy_init:
            try:
                self._check_config(run_sync(self._core.ensure_config(), self._client, self._client))
            except BaseException:
                self.close()
                raise

    def __enter__(self) -> DecoupledModelClient:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection. Idempotent."""
        if not self._closed:
            self._closed = True
            self._client.close()

    def wait_for_model(self, timeout_s: float) -> None:
        """Block until the server and model are ready."""
        run_sync(self._core.wait_for_model(timeout_s), self._client, self._client)

    @property
    def model_config(self) -> TritonModelConfig:
        """The model's configuration (cached)."""
        return run_sync(self._core.ensure_config(), self._client, self._client)  # type: ignore[no-any-return]

    def infer_sample(
        self,
        *inputs: Any,
        parameters: Optional[Dict[str, Any]] = None,
        headers: Optional[Dict[str, str]] = None,
        **named_inputs: Any,
    ) -> Iterator[Dict[str, np.ndarray]]:
        """Stream the responses to one sample."""
        return self._stream(inputs, named_inputs, parameters, headers, batch=False)

    def infer_batch(
        self,
        *inputs: Any,
        parameters: Optional[Dict[str, Any]] = None,
        headers: Optional[Dict[str, str]] = None,
        **named_inputs: Any,
    ) -> Iterator[Dict[str, np.ndarray]]:
        """Stream the responses to one batch."""
        return self._stream(inputs, named_inputs, parameters, headers, batch=True)

    def _stream(
        self,
        inputs: Any,
        named_inputs: Dict[str, Any],
        parameters: Optional[Dict[str, Any]],
        headers: Optional[Dict[str, str]],
        batch: bool,
    ) -> Iterator[Dict[str, np.ndarray]]:
        if self._closed:
            raise PyTritonClientClosedError("The client is closed.")
        config = run_sync(self._core.ensure_config(), self._client, self._client)
        request, add_axis = self._stream_request(config, inputs, named_inputs, parameters, batch, self._lib)
        return self._responses(request, add_axis, headers)

    def _responses(
        self, request: Dict[str, Any], add_axis: bool, headers: Optional[Dict[str, str]]
    ) -> Iterator[Dict[str, np.ndarray]]:
        responses: queue.Queue[Tuple[Any, Any]] = queue.Queue()
        with self._lock:
            self._client.start_stream(callback=lambda result, error: responses.put((result, error)), headers=headers)
            try:
                model_name = request.pop("model_name")
                self._client.async_stream_infer(model_name, request.pop("inputs"), **request)
                while True:
                    try:
                        result, error = responses.get(timeout=self._core.inference_timeout_s)
                    except queue.Empty:
                        raise PyTritonClientTimeoutError(
                            f"No response from model {model_name!r} within {self._core.inference_timeout_s:.1f} s."
                        ) from None
                    if error is not None:
                        raise map_error(error, f"Streaming inference on model {model_name!r}")
                    if _has_outputs(result):
                        yield self._decode(result, add_axis)
                    if _is_final(result):
                        return
            finally:
                self._client.stop_stream(cancel_requests=True)


class AsyncioDecoupledModelClient:
    """asyncio streaming client: ``async for outputs in client.infer_sample(...)``.

    Built on :class:`DecoupledModelClient`: each step of the stream runs in the event loop's default
    executor. (tritonclient's asyncio gRPC stream cannot ask Triton for the empty final response
    that marks the end of a decoupled stream, so the blocking client's stream is reused instead.)
    """

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: Optional[str] = None,
        *,
        lazy_init: bool = True,
        init_timeout_s: Optional[float] = None,
        inference_timeout_s: Optional[float] = None,
        access_token: Optional[str] = None,
        root_certificates: Optional[PathLike] = None,
        private_key: Optional[PathLike] = None,
        certificate_chain: Optional[PathLike] = None,
    ):
        self._sync = DecoupledModelClient(
            url, model_name, model_version, lazy_init=True, init_timeout_s=init_timeout_s,
            inference_timeout_s=inference_timeout_s, access_token=access_token, root_certificates=root_certificates,
            private_key=private_key, certificate_chain=certificate_chain,
        )  # fmt: skip
        self._lazy_init = lazy_init

    async def _run(self, function: Any, *args: Any) -> Any:
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, function, *args)

    async def __aenter__(self) -> AsyncioDecoupledModelClient:
        if not self._lazy_init:
            try:
                self._sync._check_config(await self._run(lambda: self._sync.model_config))
            except BaseException:
                await self.close()
                raise
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection. Idempotent."""
        await self._run(self._sync.close)

    async def wait_for_model(self, timeout_s: float) -> None:
        """Wait until the server and model are ready."""
        await self._run(self._sync.wait_for_model, timeout_s)

    async def model_config(self) -> TritonModelConfig:
        """The model's configuration (cached)."""
        return await self._run(lambda: self._sync.model_config)  # type: ignore[no-any-return]

    def infer_sample(
        self,
        *inputs: Any,
        parameters: Optional[Dict[str, Any]] = None,
        headers: Optional[Dict[str, str]] = None,
        **named_inputs: Any,
    ) -> AsyncIterator[Dict[str, np.ndarray]]:
        """Stream the responses to one sample."""
        return self._stream(inputs, named_inputs, parameters, headers, batch=False)

    def infer_batch(
        self,
        *inputs: Any,
        parameters: Optional[Dict[str, Any]] = None,
        headers: Optional[Dict[str, str]] = None,
        **named_inputs: Any,
    ) -> AsyncIterator[Dict[str, np.ndarray]]:
        """Stream the responses to one batch."""
        return self._stream(inputs, named_inputs, parameters, headers, batch=True)

    async def _stream(
        self,
        inputs: Any,
        named_inputs: Dict[str, Any],
        parameters: Optional[Dict[str, Any]],
        headers: Optional[Dict[str, str]],
        batch: bool,
    ) -> AsyncIterator[Dict[str, np.ndarray]]:
        iterator = await self._run(self._sync._stream, inputs, named_inputs, parameters, headers, batch)
        done = object()
        try:
            while True:
                item = await self._run(next, iterator, done)
                if item is done:
                    return
                yield item
        finally:
            await self._run(iterator.close)
