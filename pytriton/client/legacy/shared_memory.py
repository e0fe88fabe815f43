"""System shared-memory regions for the legacy client (``tensorrtserver.shared_memory``).

A handle from :func:`create_shared_memory_region` names a POSIX shared-memory segment that this
process created (or opened, if the key already existed) and maps. Pass it to
``SharedMemoryControlContext.register`` so the server maps the same segment, then give it to
``InferContext.run`` in place of an input's list of arrays, or as ``(ResultFormat.RAW, handle)``
for an output. :func:`destroy_shared_memory_region` unmaps it and removes the segment once no
handle of this process uses it; unregister it from the server first.
Built on ``tritonclient.utils.shared_memory``.
"""

# For maintainers (kept out of the API reference):
# Unit test: tests/unit/test_legacy_client.py (the shared-memory helpers).

from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np
import numpy.typing as npt

from pytriton.client.legacy._errors import InferenceServerException

__all__ = [
    "SharedMemoryException",
    "SharedMemoryHandle",
    "create_shared_memory_region",
    "destroy_shared_memory_region",
    "get_contents_as_numpy",
    "mapped_shared_memory_regions",
    "set_shared_memory_region",
]


class SharedMemoryException(InferenceServerException):
    """A shared-memory region could not be created, written, read or destroyed."""


class SharedMemoryHandle:
    """A mapped region: its server-side name, its segment key, its size and the mapping itself."""

    def __init__(self, triton_shm_name: str, shm_key: str, byte_size: int, region: object) -> None:
        self.triton_shm_name = triton_shm_name
        self.shm_key = shm_key
        self.byte_size = byte_size
        self.offset = 0
        self._region = region
        self._destroyed = False

    @property
    def region(self) -> Any:
        """The tritonclient region object; an error once the handle is destroyed."""
        if self._destroyed:
            raise SharedMemoryException(f"shared memory region '{self.triton_shm_name}' was destroyed")
        return self._region

    def __repr__(self) -> str:
        return f"SharedMemoryHandle(name={self.triton_shm_name!r}, key={self.shm_key!r}, byte_size={self.byte_size})"


def _check(handle: object) -> SharedMemoryHandle:
    if not isinstance(handle, SharedMemoryHandle):
        raise SharedMemoryException(
            f"expected a handle from create_shared_memory_region(), got {type(handle).__name__}"
        )
    return handle


def create_shared_memory_region(triton_shm_name: str, shm_key: str, byte_size: int) -> SharedMemoryHandle:
    """Create (or open, if ``shm_key`` exists) a segment of ``byte_size`` bytes and map it."""
    import tritonclient.utils.shared_memory as tshm

    if int(byte_size) <= 0:
        raise SharedMemoryException(f"byte_size must be positive, got {byte_size}")
    try:
        region = tshm.create_shared_memory_region(str(triton_shm_name), str(shm_key), int(byte_size))
    except Exception as error:
        raise SharedMemoryException(
            f"cannot create shared memory region '{triton_shm_name}' ({shm_key}): {error}"
        ) from error
    return SharedMemoryHandle(str(triton_shm_name), str(shm_key), int(byte_size), region)


def set_shared_memory_region(shm_handle: SharedMemoryHandle, input_values: Sequence[npt.NDArray[np.generic]]) -> None:
    """Copy the arrays, one after the other, to the start of the region."""
    import tritonclient.utils.shared_memory as tshm

    handle = _check(shm_handle)
    if not isinstance(input_values, (list, tuple)):
        raise SharedMemoryException("input_values must be a list of numpy arrays")
    total = sum(np.asarray(value).nbytes for value in input_values)
    if total > handle.byte_size:
        raise SharedMemoryException(
            f"{total} bytes do not fit shared memory region '{handle.triton_shm_name}' of {handle.byte_size} bytes"
        )
    try:
        tshm.set_shared_memory_region(handle.region, [np.ascontiguousarray(value) for value in input_values])
    except Exception as error:
        raise SharedMemoryException(f"cannot write shared memory region '{handle.triton_shm_name}': {error}") from error


def get_contents_as_numpy(
    shm_handle: SharedMemoryHandle, datatype: Any, shape: Sequence[int]
) -> npt.NDArray[np.generic]:
    """A copy of the region's leading bytes as an array of ``datatype`` and ``shape``.

    For ``np.object_``/``np.bytes_`` the region holds length-prefixed strings (the BYTES layout).
    A copy, so the array stays valid after the region is destroyed.
    """
    import tritonclient.utils.shared_memory as tshm

    handle = _check(shm_handle)
    dtype = np.dtype(datatype)
    shape = [int(dim) for dim in shape]
    if dtype not in (np.dtype(np.object_), np.dtype(np.bytes_)):
        needed = int(np.prod(shape)) * dtype.itemsize
        if needed > handle.byte_size:
            raise SharedMemoryException(
                f"{needed} bytes requested from shared memory region '{handle.triton_shm_name}' of {handle.byte_size} bytes"
            )
    try:
        return np.array(tshm.get_contents_as_numpy(handle.region, dtype, shape), copy=True)
    except Exception as error:
        raise SharedMemoryException(f"cannot read shared memory region '{handle.triton_shm_name}': {error}") from error


def destroy_shared_memory_region(shm_handle: SharedMemoryHandle) -> None:
    """Unmap the region; the segment is removed when no handle of this process maps it. Idempotent."""
    import tritonclient.utils.shared_memory as tshm

    handle = _check(shm_handle)
    if handle._destroyed:
        return
    handle._destroyed = True
    try:
        tshm.destroy_shared_memory_region(handle._region)
    except Exception as error:
        raise SharedMemoryException(
            f"cannot destroy shared memory region '{handle.triton_shm_name}': {error}"
        ) from error


def mapped_shared_memory_regions() -> List[str]:
    """Keys of the segments this process still maps."""
    import tritonclient.utils.shared_memory as tshm

    return list(tshm.mapped_shared_memory_regions())
