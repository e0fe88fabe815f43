"""The legacy non-inference contexts: health, status, model control, repository index, shared memory.

Each owns one :class:`Connection` until ``close()``. Request ids are counted per context on the
client (the v2 protocol has no server-side request counter for these calls); the last id is None
after a failed request, as the legacy API specified.

Unit test: tests/unit/test_legacy_client.py (the shared-memory control context); the other contexts
against a server: tests/e2e/test_legacy_client.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from pytriton.client._base import ClosesOnExit
from pytriton.client.legacy._errors import InferenceServerException
from pytriton.client.legacy._messages import (
    ModelConfig,
    ModelEntry,
    ModelRepositoryIndex,
    ModelStatus,
    ServerReadyState,
    ServerStatus,
    SharedMemoryRegion,
    SharedMemoryStatus,
    SystemSharedMemory,
    as_int,
    model_ready_state,
    version_status,
)
from pytriton.client.legacy._transport import Connection
from pytriton.client.legacy.shared_memory import SharedMemoryHandle

# How long unregister retries a region the server still reports in use by a finished request.
UNREGISTER_RETRY_S = 2.0

__all__ = [
    "ModelControlContext",
    "ModelRepositoryContext",
    "ServerHealthContext",
    "ServerStatusContext",
    "SharedMemoryControlContext",
]


class _Context(ClosesOnExit):
    def __init__(self, url: str, protocol: object, verbose: bool, http_headers: Iterable[str]) -> None:
        self._conn = Connection(url, protocol, verbose, http_headers)
        self._lock = threading.Lock()
        self._next_id = 0
        self._last_id: Optional[int] = None

    def _request(self, body: Callable[[int], object]) -> Any:
        """Run one legacy request with a fresh id; remember the id only if it succeeded."""
        self._conn.check_open()
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
        self._last_id = None
        result = body(request_id)
        self._last_id = request_id
        return result

    def _json(self, method: str, *args: object, request_id: int, what: str) -> Any:
        """A v2 answer as JSON whatever the protocol (gRPC answers converted by tritonclient)."""
        extra = {"as_json": True} if self._conn.is_grpc else {}
        return self._conn.call(method, *args, request_id=request_id, what=what, **extra)

    def get_last_request_id(self) -> Optional[int]:
        """Id of the most recent request of this context, or None if none ran or it failed."""
        return self._last_id

    def close(self) -> None:
        """Release the connection; later calls raise InferenceServerException. Idempotent."""
        self._conn.close()


class ServerHealthContext(_Context):
    """Liveness and readiness of a server."""

    def __init__(self, url: str, protocol: object, verbose: bool = False, http_headers: Iterable[str] = []) -> None:  # noqa: B006
        super().__init__(url, protocol, verbose, http_headers)

    def is_live(self) -> bool:
        return bool(self._request(lambda rid: self._conn.call("is_server_live", request_id=rid, what="liveness")))

    def is_ready(self) -> bool:
        return bool(self._request(lambda rid: self._conn.call("is_server_ready", request_id=rid, what="readiness")))


class ServerStatusContext(_Context):
    """The server's status in the legacy shape, for all models or for ``model_name`` only.

    ``get_server_status()`` asks the server for its metadata, readiness, repository index, model
    configurations and inference statistics (the statistics and repository endpoints may need an
    access token: pass it in ``http_headers``). ``uptime_ns`` is 0: the v2 protocol does not report it.
    """

    def __init__(
        self,
        url: str,
        protocol: object,
        model_name: Optional[str] = None,
        verbose: bool = False,
        http_headers: Iterable[str] = [],  # noqa: B006
    ) -> None:
        super().__init__(url, protocol, verbose, http_headers)
        self._model_name = model_name

    def get_server_status(self) -> ServerStatus:
        return self._request(self._status)  # type: ignore[no-any-return]

    def _status(self, rid: int) -> ServerStatus:
        metadata = self._json("get_server_metadata", request_id=rid, what="server metadata")
        ready = self._conn.call("is_server_ready", request_id=rid, what="readiness")
        index = _index_entries(self._json("get_model_repository_index", request_id=rid, what="repository index"))
        if self._model_name is not None:
            index = [entry for entry in index if entry.get("name") == self._model_name]
            if not index:
                raise InferenceServerException(
                    f"no status for unknown model '{self._model_name}'", server_id=self._conn.url, request_id=rid
                )
        stats = self._json("get_inference_statistics", "", request_id=rid, what="inference statistics")
        by_version: Dict[Tuple[object, str], Mapping[str, object]] = {
            (entry.get("name"), str(entry.get("version", ""))): entry for entry in stats.get("model_stats", [])
        }
        status = ServerStatus(
            id=str(metadata.get("name", "")),
            version=str(metadata.get("version", "")),
            ready_state=ServerReadyState.SERVER_READY if ready else ServerReadyState.SERVER_INITIALIZING,
        )
        for entry in index:
            name = str(entry.get("name", ""))
            model = status.model_status.setdefault(name, ModelStatus(config=ModelConfig(name=name)))
            if not entry.get("version"):
                continue  # an unloaded model is listed without versions
            version = as_int(entry.get("version"))
            state = model_ready_state(entry.get("state"))
            model.version_status[version] = version_status(state, by_version.get((name, str(version))))
        for name, model in status.model_status.items():
            if any(v.ready_state == model_ready_state("READY") for v in model.version_status.values()):
                config = self._json("get_model_config", name, request_id=rid, what=f"configuration of model '{name}'")
                model.config = ModelConfig.from_v2(config.get("config", {}) if self._conn.is_grpc else config)
        return status


def _index_entries(index: Any) -> List[Dict[str, Any]]:
    """Repository index entries from HTTP (a list) or gRPC-as-JSON (``{"models": [...]}``)."""
    if isinstance(index, dict):
        return list(index.get("models", []))
    return list(index or [])


class ModelControlContext(_Context):
    """Load and unload models (the server must run with ``--model-control-mode=explicit``)."""

    def __init__(self, url: str, protocol: object, verbose: bool = False, http_headers: Iterable[str] = []) -> None:  # noqa: B006
        super().__init__(url, protocol, verbose, http_headers)

    def load(self, model_name: str) -> None:
        self._request(
            lambda rid: self._conn.call("load_model", model_name, request_id=rid, what=f"load of model '{model_name}'")
        )

    def unload(self, model_name: str) -> None:
        self._request(
            lambda rid: self._conn.call(
                "unload_model", model_name, request_id=rid, what=f"unload of model '{model_name}'"
            )
        )


class ModelRepositoryContext(_Context):
    """The model repository index: every model the server can see, loaded or not."""

    def __init__(self, url: str, protocol: object, verbose: bool = False, http_headers: Iterable[str] = []) -> None:  # noqa: B006
        super().__init__(url, protocol, verbose, http_headers)

    def get_model_repository_index(self) -> ModelRepositoryIndex:
        def body(rid: int) -> ModelRepositoryIndex:
            entries = _index_entries(self._json("get_model_repository_index", request_id=rid, what="repository index"))
            names = sorted({str(entry.get("name", "")) for entry in entries})
            return ModelRepositoryIndex(models=[ModelEntry(name=name) for name in names])

        return self._request(body)  # type: ignore[no-any-return]


class SharedMemoryControlContext(_Context):
    """Register system shared-memory regions (from ``tensorrtserver.shared_memory``) with the server."""

    def __init__(self, url: str, protocol: object, verbose: bool = False, http_headers: Iterable[str] = []) -> None:  # noqa: B006
        super().__init__(url, protocol, verbose, http_headers)

    def register(self, shm_handle: SharedMemoryHandle) -> None:
        handle = _handle(shm_handle)
        self._request(
            lambda rid: self._conn.call(
                "register_system_shared_memory",
                handle.triton_shm_name,
                handle.shm_key,
                handle.byte_size,
                offset=handle.offset,
                request_id=rid,
                what=f"register of shared memory region '{handle.triton_shm_name}'",
            )
        )

    def unregister(self, shm_handle: SharedMemoryHandle) -> None:
        handle = _handle(shm_handle)
        what = f"unregister of shared memory region '{handle.triton_shm_name}'"
        self._request(lambda rid: self._unregister(rid, what, handle.triton_shm_name))

    def unregister_all(self) -> None:
        """Unregister every system shared-memory region of the server (CUDA regions are not touched)."""
        self._request(lambda rid: self._unregister(rid, "unregister of all regions"))

    def _unregister(self, rid: int, what: str, *name: str) -> None:
        # Triton releases a finished request's hold on its regions shortly after the response is
        # sent, so an unregister right after run() can be refused as "in use": retry briefly.
        deadline = time.monotonic() + UNREGISTER_RETRY_S
        while True:
            try:
                self._conn.call("unregister_system_shared_memory", *name, request_id=rid, what=what)
                return
            except InferenceServerException as error:
                if "in use" not in (error.message() or "") or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)

    def cuda_register(self, cuda_shm_handle: object) -> None:
        """Not supported: raises InferenceServerException (use system shared memory)."""
        self._conn.check_open()
        raise InferenceServerException(
            "CUDA shared memory is not supported by the legacy client layer: register a system "
            "shared memory region (tensorrtserver.shared_memory) instead, or use "
            "tritonclient.utils.cuda_shared_memory with tritonclient directly"
        )

    def get_shared_memory_status(self) -> SharedMemoryStatus:
        def body(rid: int) -> SharedMemoryStatus:
            answer = self._json("get_system_shared_memory_status", request_id=rid, what="shared memory status")
            regions = list(answer.get("regions", {}).values()) if isinstance(answer, dict) else list(answer or [])
            return SharedMemoryStatus(
                shared_memory_region=[
                    SharedMemoryRegion(
                        name=str(region.get("name", "")),
                        system_shared_memory=SystemSharedMemory(
                            shared_memory_key=str(region.get("key", "")), offset=as_int(region.get("offset"))
                        ),
                        byte_size=as_int(region.get("byte_size")),
                    )
                    for region in sorted(regions, key=lambda region: str(region.get("name", "")))
                ]
            )

        return self._request(body)  # type: ignore[no-any-return]


def _handle(shm_handle: object) -> SharedMemoryHandle:
    if not isinstance(shm_handle, SharedMemoryHandle):
        raise InferenceServerException(
            f"expected a handle from tensorrtserver.shared_memory.create_shared_memory_region(), got {type(shm_handle).__name__}"
        )
    return shm_handle
