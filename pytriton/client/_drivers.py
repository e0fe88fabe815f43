"""Drivers that execute the core's operations with real tritonclient clients, blocking or asyncio.

Unit test: tests/unit/test_client_core.py (the core's operations run through ``run_sync`` and
``run_async``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterator, Optional

from pytriton.client._core import Call, Operation
from pytriton.client._url import TritonUrl
from pytriton.client.auth import ClientSecurity


def sync_clients(url: TritonUrl, security: ClientSecurity, control_timeout_s: float, inference_timeout_s: float) -> Any:
    """``(lib, control_client, infer_client)`` for blocking use, sending ``security``'s token on every call.

    HTTP timeouts are properties of a client's connections, so HTTP gets one client per timeout;
    gRPC takes a deadline per call and needs only one.
    """
    if url.protocol == "grpc":
        import tritonclient.grpc as lib

        client = security.apply(lib.InferenceServerClient(url.address, **security.grpc_options(url)), url)
        return lib, client, client
    import tritonclient.http as lib

    control = lib.InferenceServerClient(
        url.address, connection_timeout=control_timeout_s, network_timeout=control_timeout_s
    )
    infer = lib.InferenceServerClient(
        url.address, connection_timeout=inference_timeout_s, network_timeout=inference_timeout_s
    )
    return lib, security.apply(control, url), security.apply(infer, url)


def async_clients(url: TritonUrl, security: ClientSecurity) -> Any:
    """``(lib, client)`` for asyncio use (one client; timeouts are applied per call)."""
    if url.protocol == "grpc":
        import tritonclient.grpc.aio as lib

        return lib, security.apply(lib.InferenceServerClient(url.address, **security.grpc_options(url)), url)
    import tritonclient.http.aio as lib  # type: ignore[no-redef]

    return lib, security.apply(lib.InferenceServerClient(url.address), url)


class _Steps:
    """The calls of an operation, one at a time, for a driver to execute.

    ``for call in steps`` yields each call the operation needs; before the next one the driver sets
    ``steps.value`` (what the call returned) or ``steps.error`` (what it raised: the operation may
    retry, map or raise it). When the operation is done, ``steps.result`` holds what it returned.
    """

    def __init__(self, operation: Operation) -> None:
        self._operation = operation
        self.value: object = None
        self.error: Optional[Exception] = None
        self.result: object = None

    def __iter__(self) -> Iterator[Call]:
        operation = self._operation
        try:
            call = next(operation)
            while True:
                self.value, self.error = None, None
                yield call
                call = operation.send(self.value) if self.error is None else operation.throw(self.error)
        except StopIteration as done:
            self.result = done.value


def _call_sync(call: Call, control: object, infer: object) -> object:
    if call.method == "sleep":
        time.sleep(call.args[0])
        return None
    client = infer if call.infer else control
    return getattr(client, call.method)(*call.args, **call.kwargs)


async def _call_async(call: Call, client: object) -> object:
    if call.method == "sleep":
        await asyncio.sleep(call.args[0])
        return None
    coroutine = getattr(client, call.method)(*call.args, **call.kwargs)
    return await asyncio.wait_for(coroutine, call.timeout_s) if call.timeout_s else await coroutine


def run_sync(operation: Operation, control: object, infer: object) -> Any:
    """Run an operation to completion with blocking clients; returns its result."""
    steps = _Steps(operation)
    for call in steps:
        try:
            steps.value = _call_sync(call, control, infer)
        except Exception as exc:
            steps.error = exc
    return steps.result


async def run_async(operation: Operation, client: object) -> Any:
    """Run an operation with an asyncio client; every call is bounded by its ``timeout_s``."""
    steps = _Steps(operation)
    for call in steps:
        try:
            steps.value = await _call_async(call, client)
        except Exception as exc:
            steps.error = exc
    return steps.result
