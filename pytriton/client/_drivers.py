"""Drivers that execute the core's operations with real tritonclient clients, blocking or asyncio."""

from __future__ import annotations

import asyncio
import time
from typing import Any

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


def run_sync(operation: Operation, control: Any, infer: Any) -> Any:
    """Run an operation to completion with blocking clients; returns its result."""
    try:
        call: Call = next(operation)
        while True:
            try:
                if call.method == "sleep":
                    time.sleep(call.args[0])
                    value: Any = None
                else:
                    client = infer if call.infer else control
                    value = getattr(client, call.method)(*call.args, **call.kwargs)
            except Exception as exc:
                call = operation.throw(exc)
                continue
            call = operation.send(value)
    except StopIteration as done:
        return done.value


async def run_async(operation: Operation, client: Any) -> Any:
    """Run an operation with an asyncio client; every call is bounded by its ``timeout_s``."""
    try:
        call: Call = next(operation)
        while True:
            try:
                if call.method == "sleep":
                    await asyncio.sleep(call.args[0])
                    value: Any = None
                else:
                    coroutine = getattr(client, call.method)(*call.args, **call.kwargs)
                    value = await asyncio.wait_for(coroutine, call.timeout_s) if call.timeout_s else await coroutine
            except Exception as exc:
                call = operation.throw(exc)
                continue
            call = operation.send(value)
    except StopIteration as done:
        return done.value
