"""ctypes bindings to the bundled Triton server library (``lib/libtritonserver-*.so``).

The library is loaded once per process and never unloaded (``dlclose`` of a library that has
started threads is unsafe). Its auditwheel-renamed dependencies live next to it in the install's
``lib/`` directory; because the loader reads ``LD_LIBRARY_PATH`` only at process start, a missing
dependency is loaded first by absolute path, then the load is retried (bounded).

:func:`library` returns the shared :class:`Library`; :func:`check` turns a returned
``TRITONSERVER_Error*`` into the matching exception and deletes the error (each error exactly once).

Unit test: tests/unit/test_inprocess.py (on a fake library).
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import re
import threading
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from pytriton.inprocess._errors import TritonError, UnavailableError, error_from_code

P = ctypes.c_void_p
S = ctypes.c_char_p
PP = ctypes.POINTER(ctypes.c_void_p)
I32 = ctypes.c_int32
U32 = ctypes.c_uint32
I64 = ctypes.c_int64
U64 = ctypes.c_uint64
SZ = ctypes.c_size_t
B = ctypes.c_bool
D = ctypes.c_double

# Callback types of the response allocator and the request/response lifecycle.
ALLOC_FN = ctypes.CFUNCTYPE(P, P, S, SZ, I32, I64, P, PP, PP, ctypes.POINTER(I32), ctypes.POINTER(I64))
RELEASE_FN = ctypes.CFUNCTYPE(P, P, P, P, SZ, I32, I64)
START_FN = ctypes.CFUNCTYPE(P, P, P)
REQUEST_RELEASE_FN = ctypes.CFUNCTYPE(None, P, U32, P)
RESPONSE_COMPLETE_FN = ctypes.CFUNCTYPE(None, P, U32, P)

# name -> (restype, argtypes). Functions returning TRITONSERVER_Error* use restype P.
_PROTOTYPES: Dict[str, Tuple[object, Sequence[object]]] = {
    "TRITONSERVER_ApiVersion": (P, [ctypes.POINTER(U32), ctypes.POINTER(U32)]),
    "TRITONSERVER_ErrorNew": (P, [I32, S]),
    "TRITONSERVER_ErrorDelete": (None, [P]),
    "TRITONSERVER_ErrorCode": (I32, [P]),
    "TRITONSERVER_ErrorMessage": (S, [P]),
    "TRITONSERVER_MessageSerializeToJson": (P, [P, ctypes.POINTER(S), ctypes.POINTER(SZ)]),
    "TRITONSERVER_MessageDelete": (P, [P]),
    "TRITONSERVER_MetricsFormatted": (P, [P, I32, ctypes.POINTER(S), ctypes.POINTER(SZ)]),
    "TRITONSERVER_MetricsDelete": (P, [P]),
    "TRITONSERVER_ParameterNew": (P, [S, I32, P]),
    "TRITONSERVER_ParameterBytesNew": (P, [S, P, U64]),
    "TRITONSERVER_ParameterDelete": (None, [P]),
    "TRITONSERVER_ServerOptionsNew": (P, [PP]),
    "TRITONSERVER_ServerOptionsDelete": (P, [P]),
    "TRITONSERVER_ServerOptionsSetServerId": (P, [P, S]),
    "TRITONSERVER_ServerOptionsSetModelRepositoryPath": (P, [P, S]),
    "TRITONSERVER_ServerOptionsSetModelControlMode": (P, [P, I32]),
    "TRITONSERVER_ServerOptionsSetStartupModel": (P, [P, S]),
    "TRITONSERVER_ServerOptionsSetStrictModelConfig": (P, [P, B]),
    "TRITONSERVER_ServerOptionsSetRateLimiterMode": (P, [P, I32]),
    "TRITONSERVER_ServerOptionsAddRateLimiterResource": (P, [P, S, SZ, ctypes.c_int]),
    "TRITONSERVER_ServerOptionsSetPinnedMemoryPoolByteSize": (P, [P, U64]),
    "TRITONSERVER_ServerOptionsSetCudaMemoryPoolByteSize": (P, [P, ctypes.c_int, U64]),
    "TRITONSERVER_ServerOptionsSetCacheConfig": (P, [P, S, S]),
    "TRITONSERVER_ServerOptionsSetCacheDirectory": (P, [P, S]),
    "TRITONSERVER_ServerOptionsSetMinSupportedComputeCapability": (P, [P, D]),
    "TRITONSERVER_ServerOptionsSetExitOnError": (P, [P, B]),
    "TRITONSERVER_ServerOptionsSetStrictReadiness": (P, [P, B]),
    "TRITONSERVER_ServerOptionsSetExitTimeout": (P, [P, ctypes.c_uint]),
    "TRITONSERVER_ServerSetExitTimeout": (P, [P, ctypes.c_uint]),
    "TRITONSERVER_ServerOptionsSetBufferManagerThreadCount": (P, [P, ctypes.c_uint]),
    "TRITONSERVER_ServerOptionsSetModelLoadThreadCount": (P, [P, ctypes.c_uint]),
    "TRITONSERVER_ServerOptionsSetModelLoadRetryCount": (P, [P, ctypes.c_uint]),
    "TRITONSERVER_ServerOptionsSetModelNamespacing": (P, [P, B]),
    "TRITONSERVER_ServerOptionsSetLogFile": (P, [P, S]),
    "TRITONSERVER_ServerOptionsSetLogInfo": (P, [P, B]),
    "TRITONSERVER_ServerOptionsSetLogWarn": (P, [P, B]),
    "TRITONSERVER_ServerOptionsSetLogError": (P, [P, B]),
    "TRITONSERVER_ServerOptionsSetLogFormat": (P, [P, I32]),
    "TRITONSERVER_ServerOptionsSetLogVerbose": (P, [P, ctypes.c_int]),
    "TRITONSERVER_ServerOptionsSetMetrics": (P, [P, B]),
    "TRITONSERVER_ServerOptionsSetGpuMetrics": (P, [P, B]),
    "TRITONSERVER_ServerOptionsSetCpuMetrics": (P, [P, B]),
    "TRITONSERVER_ServerOptionsSetMetricsInterval": (P, [P, U64]),
    "TRITONSERVER_ServerOptionsSetBackendDirectory": (P, [P, S]),
    "TRITONSERVER_ServerOptionsSetRepoAgentDirectory": (P, [P, S]),
    "TRITONSERVER_ServerOptionsSetModelLoadDeviceLimit": (P, [P, I32, ctypes.c_int, D]),
    "TRITONSERVER_ServerOptionsSetBackendConfig": (P, [P, S, S, S]),
    "TRITONSERVER_ServerOptionsSetHostPolicy": (P, [P, S, S, S]),
    "TRITONSERVER_ServerOptionsSetMetricsConfig": (P, [P, S, S, S]),
    "TRITONSERVER_ServerNew": (P, [PP, P]),
    "TRITONSERVER_ServerDelete": (P, [P]),
    "TRITONSERVER_ServerStop": (P, [P]),
    "TRITONSERVER_ServerIsLive": (P, [P, ctypes.POINTER(B)]),
    "TRITONSERVER_ServerIsReady": (P, [P, ctypes.POINTER(B)]),
    "TRITONSERVER_ServerMetadata": (P, [P, PP]),
    "TRITONSERVER_ServerMetrics": (P, [P, PP]),
    "TRITONSERVER_ServerModelIsReady": (P, [P, S, I64, ctypes.POINTER(B)]),
    "TRITONSERVER_ServerModelBatchProperties": (P, [P, S, I64, ctypes.POINTER(U32), PP]),
    "TRITONSERVER_ServerModelTransactionProperties": (P, [P, S, I64, ctypes.POINTER(U32), PP]),
    "TRITONSERVER_ServerModelMetadata": (P, [P, S, I64, PP]),
    "TRITONSERVER_ServerModelStatistics": (P, [P, S, I64, PP]),
    "TRITONSERVER_ServerModelConfig": (P, [P, S, I64, U32, PP]),
    "TRITONSERVER_ServerModelIndex": (P, [P, U32, PP]),
    "TRITONSERVER_ServerLoadModel": (P, [P, S]),
    "TRITONSERVER_ServerLoadModelWithParameters": (P, [P, S, PP, U64]),
    "TRITONSERVER_ServerUnloadModel": (P, [P, S]),
    "TRITONSERVER_ServerUnloadModelAndDependents": (P, [P, S]),
    "TRITONSERVER_ServerPollModelRepository": (P, [P]),
    "TRITONSERVER_ServerRegisterModelRepository": (P, [P, S, PP, U32]),
    "TRITONSERVER_ServerUnregisterModelRepository": (P, [P, S]),
    "TRITONSERVER_ServerInferAsync": (P, [P, P, P]),
    "TRITONSERVER_ResponseAllocatorNew": (P, [PP, ALLOC_FN, RELEASE_FN, START_FN]),
    "TRITONSERVER_ResponseAllocatorDelete": (P, [P]),
    "TRITONSERVER_InferenceRequestNew": (P, [PP, P, S, I64]),
    "TRITONSERVER_InferenceRequestDelete": (P, [P]),
    "TRITONSERVER_InferenceRequestSetId": (P, [P, S]),
    "TRITONSERVER_InferenceRequestSetFlags": (P, [P, U32]),
    "TRITONSERVER_InferenceRequestSetCorrelationId": (P, [P, U64]),
    "TRITONSERVER_InferenceRequestSetCorrelationIdString": (P, [P, S]),
    "TRITONSERVER_InferenceRequestSetPriorityUInt64": (P, [P, U64]),
    "TRITONSERVER_InferenceRequestSetTimeoutMicroseconds": (P, [P, U64]),
    "TRITONSERVER_InferenceRequestAddInput": (P, [P, S, I32, ctypes.POINTER(I64), U64]),
    "TRITONSERVER_InferenceRequestAppendInputData": (P, [P, S, P, SZ, I32, I64]),
    "TRITONSERVER_InferenceRequestRemoveAllInputs": (P, [P]),
    "TRITONSERVER_InferenceRequestAddRequestedOutput": (P, [P, S]),
    "TRITONSERVER_InferenceRequestSetStringParameter": (P, [P, S, S]),
    "TRITONSERVER_InferenceRequestSetIntParameter": (P, [P, S, I64]),
    "TRITONSERVER_InferenceRequestSetBoolParameter": (P, [P, S, B]),
    "TRITONSERVER_InferenceRequestSetDoubleParameter": (P, [P, S, D]),
    "TRITONSERVER_InferenceRequestCancel": (P, [P]),
    "TRITONSERVER_InferenceRequestSetReleaseCallback": (P, [P, REQUEST_RELEASE_FN, P]),
    "TRITONSERVER_InferenceRequestSetResponseCallback": (P, [P, P, P, RESPONSE_COMPLETE_FN, P]),
    "TRITONSERVER_InferenceResponseDelete": (P, [P]),
    "TRITONSERVER_InferenceResponseError": (P, [P]),
    "TRITONSERVER_InferenceResponseId": (P, [P, ctypes.POINTER(S)]),
    "TRITONSERVER_InferenceResponseParameterCount": (P, [P, ctypes.POINTER(U32)]),
    "TRITONSERVER_InferenceResponseParameter": (P, [P, U32, ctypes.POINTER(S), ctypes.POINTER(I32), PP]),
    "TRITONSERVER_InferenceResponseOutputCount": (P, [P, ctypes.POINTER(U32)]),
    "TRITONSERVER_InferenceResponseOutput": (
        P,
        [
            P,
            U32,
            ctypes.POINTER(S),
            ctypes.POINTER(I32),
            ctypes.POINTER(ctypes.POINTER(I64)),
            ctypes.POINTER(U64),
            PP,
            ctypes.POINTER(SZ),
            ctypes.POINTER(I32),
            ctypes.POINTER(I64),
            PP,
        ],
    ),
}

# Short, non-blocking calls bound through ``ctypes.PyDLL`` so they keep the GIL: the response
# callback makes about a dozen of them per response, and releasing the GIL around each one let
# Python threads take it over and stalled Triton's callback thread for a switch interval each time.
HOLD_GIL = frozenset(
    name
    for name in _PROTOTYPES
    if name.startswith(("TRITONSERVER_InferenceResponse", "TRITONSERVER_InferenceRequest", "TRITONSERVER_Error"))
    # Deleting can run destructors and callbacks, creating and cancelling can take server locks:
    # those release the GIL like every other call.
    and not name.endswith(("Delete", "New", "Cancel"))
)


class _ThreadStateKeeper:
    """Keeps the Python thread state of a non-Python thread that calls back into Python.

    A ctypes callback on one of Triton's threads runs between ``PyGILState_Ensure`` and
    ``PyGILState_Release``; on a thread Python did not create, the release deletes the thread state
    the ensure created, so every callback created and destroyed one (measured: about 40 us of CPU
    per callback here, three callbacks per request). One extra ``PyGILState_Ensure`` that is never
    released keeps the thread state, and what hangs on it (``threading.local`` values), for the
    thread's life; the GIL is still released after each callback. Cost: one thread state (a few
    KiB) per Triton thread that ever called back, left behind when that thread exits.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        ensure = getattr(getattr(ctypes, "pythonapi", None), "PyGILState_Ensure", None)
        if ensure is not None:
            ensure.restype = ctypes.c_int
            ensure.argtypes = []
        self._ensure = ensure

    def __call__(self) -> None:
        """Call first thing in a callback (the GIL is held there); cheap after the first call."""
        local = self._local
        if not getattr(local, "kept", False) and self._ensure is not None:
            self._ensure()
            local.kept = True


keep_thread_state = _ThreadStateKeeper()

_MISSING_DEPENDENCY = re.compile(r"^(?P<name>[^:\s]+\.so[^:\s]*): cannot open shared object file")
_MAX_DEPENDENCY_LOADS = 64


class Library:
    """The loaded server library with typed functions as attributes (``lib.TRITONSERVER_ServerNew``).

    ``cdll`` may be any object exposing the C functions as attributes (tests pass a fake);
    ``gil_cdll`` (a ``ctypes.PyDLL`` of the same library) provides the :data:`HOLD_GIL` functions.
    """

    def __init__(self, cdll: object, path: Optional[pathlib.Path] = None, gil_cdll: object = None) -> None:
        self.path = path
        self._cdll = cdll
        for name, (restype, argtypes) in _PROTOTYPES.items():
            function = getattr(gil_cdll if gil_cdll is not None and name in HOLD_GIL else cdll, name)
            function.restype = restype
            function.argtypes = argtypes
            setattr(self, name, function)

    def __getattr__(self, name: str) -> Any:  # functions outside the prototype table
        return getattr(self._cdll, name)

    def error_message(self, error: int) -> str:
        raw = self.TRITONSERVER_ErrorMessage(error)
        return raw.decode("utf-8", "replace") if raw else ""

    def check(self, error: Optional[int]) -> None:
        """Raise the exception for ``error`` (a ``TRITONSERVER_Error*`` or None) after deleting it."""
        if not error:
            return
        try:
            exc = error_from_code(self.TRITONSERVER_ErrorCode(error), self.error_message(error))
        finally:
            self.TRITONSERVER_ErrorDelete(error)
        raise exc

    def new_error(self, code: int, message: str) -> int:
        """A new ``TRITONSERVER_Error*`` (ownership passes to whoever receives it, usually Triton)."""
        return int(self.TRITONSERVER_ErrorNew(code, message.encode("utf-8", "replace")) or 0)


def _load_with_dependencies(target: pathlib.Path, lib_dir: pathlib.Path, loader: Callable[[str], object]) -> object:
    """``loader(target)``, first loading any missing dependency from ``lib_dir`` by absolute path."""
    for _ in range(_MAX_DEPENDENCY_LOADS):
        try:
            return loader(str(target))
        except OSError as exc:
            match = _MISSING_DEPENDENCY.match(str(exc).split(str(target) + ": ", 1)[-1].strip())
            if match is None or not (lib_dir / match.group("name")).is_file():
                raise
            _load_with_dependencies(lib_dir / match.group("name"), lib_dir, loader)
    raise OSError(f"could not resolve the dependencies of {target} within {_MAX_DEPENDENCY_LOADS} loads")


def find_library_file(root: pathlib.Path) -> pathlib.Path:
    """The ``libtritonserver*.so`` of a server install directory."""
    candidates = sorted((root / "lib").glob("libtritonserver*.so"))
    if not candidates:
        raise UnavailableError(
            f"The Triton install in {root} has no lib/libtritonserver*.so, which the in-process server needs. "
            "Run `pytriton install-server --force` to reinstall it."
        )
    return candidates[0]


_LOCK = threading.Lock()
_LIBRARY: Optional[Library] = None


def library(root: Optional[pathlib.Path] = None) -> Library:
    """Load (once per process) and return the server library of the located server install.

    Raises :class:`UnavailableError` naming ``pytriton install-server`` if no server is installed.
    Later calls return the same object whatever ``root`` they pass.
    """
    global _LIBRARY
    loaded = _LIBRARY
    if loaded is not None:  # the common case, also on Triton's callback threads: no lock
        return loaded
    with _LOCK:
        if _LIBRARY is not None:
            return _LIBRARY
        from pytriton.exceptions import PyTritonServerNotInstalledError
        from pytriton.server.distribution import find_server

        try:
            if root is None:
                root = find_server().root
        except PyTritonServerNotInstalledError as exc:
            raise UnavailableError(str(exc)) from exc
        path = find_library_file(root)
        try:
            cdll = _load_with_dependencies(path, path.parent, _load_global)
        except OSError as exc:
            raise UnavailableError(f"Cannot load the Triton server library {path}: {exc}") from exc
        mode = getattr(os, "RTLD_GLOBAL", 0) | getattr(os, "RTLD_NOW", 0)
        _LIBRARY = Library(cdll, path, ctypes.PyDLL(str(path), mode=mode))
        return _LIBRARY


_PRELOADED: Dict[str, object] = {}


def preload_backends(backend_directory: pathlib.Path, lib_dir: pathlib.Path) -> None:
    """Load each backend library of ``backend_directory`` once, after its dependencies from ``lib_dir``.

    Triton ``dlopen``s backends (``<dir>/<name>/libtriton_<name>.so``) later, when this process's
    loader path no longer includes the install's ``lib/``; loading them here first, with their
    auditwheel-renamed dependencies by absolute path, makes that later ``dlopen`` succeed. A backend
    that cannot be loaded is skipped: Triton then reports its own error for the models that need it.
    """
    with _LOCK:
        for backend in sorted(backend_directory.glob("*/libtriton_*.so")):
            key = str(backend.resolve())
            if key in _PRELOADED:
                continue
            try:
                _PRELOADED[key] = _load_with_dependencies(backend, lib_dir, _load_global)
            except OSError:
                _PRELOADED[key] = None


def _load_global(name: str) -> object:
    return ctypes.CDLL(name, mode=getattr(os, "RTLD_GLOBAL", 0) | getattr(os, "RTLD_NOW", 0))


__all__ = ["Library", "TritonError", "library", "find_library_file"]
