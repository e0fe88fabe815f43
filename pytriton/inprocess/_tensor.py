"""Tensors and memory buffers of the in-process API (host memory only on this build).

Lifetimes: a :class:`MemoryBuffer` never owns memory; it holds a reference to ``owner`` and the
memory stays valid as long as that reference lives. A :class:`Tensor` holds its buffer, so an
output tensor keeps the numpy array the response allocator wrote into alive, and DLPack views of
the tensor (``np.from_dlpack(tensor)``) keep the tensor's buffer alive in turn. No copy is made by
``from_dlpack`` / ``__dlpack__`` for contiguous host memory.

Unit test: tests/unit/test_inprocess.py.
"""

from __future__ import annotations

import abc
import ctypes
import dataclasses
import math
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, cast

import numpy as np
import numpy.typing as npt

from pytriton.inprocess._enums import DataType, DLDeviceType, MemoryType, data_type_of, numpy_dtype
from pytriton.inprocess._errors import InvalidArgumentError, UnsupportedError

DeviceOrMemoryType = Union[Tuple[MemoryType, int], MemoryType, Tuple[DLDeviceType, int], str]

_NO_GPU = (
    "GPU memory is not supported by pytriton's in-process server: the bundled Triton build runs on "
    "host memory only here. Use MemoryType.CPU (or 'cpu')."
)


def array_address(array: npt.NDArray[np.generic]) -> int:
    """Address of the first byte of a numpy array.

    ``ctypes.c_char.from_buffer`` gets it in a third of the time of ``array.ctypes.data`` (which builds
    a helper object), for writable C-contiguous arrays of at least one byte; others take the latter.
    """
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(cast(Any, array)))  # (typed a Buffer from 3.12 only)
    except (TypeError, ValueError, BufferError):
        return int(array.ctypes.data)


_FAST_TYPES: Dict[np.dtype[np.generic], Optional[DataType]] = {}


def fast_data_type(value: object) -> Optional[DataType]:
    """The Triton type of ``value`` if it is a plain C-contiguous numpy array of a native numeric dtype.

    Such an array can be handed to Triton as it is (its ``ctypes.data``, ``nbytes`` and ``shape``),
    as :meth:`Tensor._from_object` would, without building a :class:`Tensor`; None for anything else
    (subclasses, other layouts, byte-swapped, object and string dtypes), which takes that general path.
    """
    if type(value) is not np.ndarray or not value.flags.c_contiguous:
        return None
    dtype = value.dtype
    try:
        return _FAST_TYPES[dtype]
    except KeyError:
        pass
    found: Optional[DataType] = None
    if dtype.kind not in ("O", "S", "U", "V") and dtype.isnative:
        try:
            found = data_type_of(dtype)
        except ValueError:
            found = None
    _FAST_TYPES[dtype] = found  # bounded: one entry per distinct dtype seen
    return found


def parse_device(device: object) -> Tuple[MemoryType, int]:
    """Normalise a device spec (``"cpu"``, ``"gpu:0"``, ``MemoryType``, tuples) to (MemoryType, id)."""
    if isinstance(device, str):
        kind, _, index = device.lower().partition(":")
        table = {
            "cpu": MemoryType.CPU,
            "cpu_pinned": MemoryType.CPU_PINNED,
            "gpu": MemoryType.GPU,
            "cuda": MemoryType.GPU,
        }
        if kind not in table:
            raise InvalidArgumentError(f"Unknown device {device!r}: use 'cpu', 'cpu_pinned', 'gpu' or 'gpu:N'")
        try:
            return table[kind], int(index or 0)
        except ValueError:
            raise InvalidArgumentError(f"Bad device index in {device!r}") from None
    if isinstance(device, DLDeviceType):
        device = (device, 0)
    if isinstance(device, tuple) and len(device) == 2:
        kind, index = device
        if isinstance(kind, DLDeviceType):
            mapped = {
                DLDeviceType.kDLCPU: MemoryType.CPU,
                DLDeviceType.kDLCUDAHost: MemoryType.CPU_PINNED,
                DLDeviceType.kDLCUDA: MemoryType.GPU,
            }
            return mapped[kind], int(index)
        return MemoryType(kind), int(index)
    if isinstance(device, (int, MemoryType)):
        return MemoryType(device), 0
    raise InvalidArgumentError(f"Cannot interpret {device!r} as a device or memory type")


def _host_array(obj: Any) -> npt.NDArray[np.generic]:
    """A C-contiguous numpy view (a copy only if ``obj`` is not contiguous) of a host DLPack object."""
    device = getattr(obj, "__dlpack_device__", None)
    if device is not None:
        kind = int(device()[0])
        if kind not in (DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost):
            raise UnsupportedError(_NO_GPU)
    try:
        array = obj if isinstance(obj, np.ndarray) else np.from_dlpack(obj)
    except (TypeError, AttributeError, BufferError, RuntimeError) as exc:
        raise InvalidArgumentError(f"Cannot read {type(obj).__name__} through DLPack: {exc}") from exc
    # (np.ascontiguousarray would turn a 0-d array into a 1-d one)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array).reshape(array.shape)


@dataclasses.dataclass
class MemoryBuffer:
    """Memory at ``data_ptr`` of ``size`` bytes, valid while ``owner`` is referenced."""

    data_ptr: int
    memory_type: MemoryType
    memory_type_id: int
    size: int
    owner: object

    @staticmethod
    def from_dlpack(owner: object) -> MemoryBuffer:
        """Buffer over the bytes of a contiguous host DLPack object (no copy)."""
        array = _host_array(owner)
        return MemoryBuffer(int(array.ctypes.data), MemoryType.CPU, 0, int(array.nbytes), array)

    def _bytes_view(self) -> npt.NDArray[np.generic]:
        """A uint8 numpy view of the buffer that keeps ``owner`` alive."""
        if self.memory_type == MemoryType.GPU:
            raise UnsupportedError(_NO_GPU)
        if isinstance(self.owner, np.ndarray) and array_address(self.owner) == self.data_ptr:
            flat = self.owner.reshape(-1).view(np.uint8)
            if flat.nbytes == self.size:
                return flat
        if self.size == 0:
            return np.empty(0, dtype=np.uint8)
        raw = (ctypes.c_uint8 * self.size).from_address(self.data_ptr)
        raw._pytriton_owner = self.owner  # type: ignore[attr-defined]  # keeps the memory alive
        return np.frombuffer(memoryview(raw).cast("B"), dtype=np.uint8)


class MemoryAllocator(abc.ABC):
    """Interface of custom output allocators: return a :class:`MemoryBuffer` of at least ``size`` bytes.

    The buffer is kept referenced until Triton releases it and then by the output tensor, so it may
    be freed when the last reference goes. Allocators may ignore the requested memory type.
    """

    @abc.abstractmethod
    def allocate(self, size: int, memory_type: MemoryType, memory_type_id: int) -> MemoryBuffer:
        """Allocate ``size`` bytes, preferably of ``memory_type`` on device ``memory_type_id``."""


class NumpyAllocator(MemoryAllocator):
    """Default allocator: a fresh numpy byte array per output (host memory)."""

    def allocate(self, size: int, memory_type: MemoryType, memory_type_id: int) -> MemoryBuffer:
        array = np.empty(max(size, 1), dtype=np.uint8)
        return MemoryBuffer(int(array.ctypes.data), MemoryType.CPU, 0, size, array)


def serialize_bytes(items: Sequence[bytes]) -> npt.NDArray[np.generic]:
    """Triton's BYTES layout: each element as a 4-byte little-endian length and its bytes."""
    parts: List[bytes] = []
    for item in items:
        parts.append(struct.pack("<I", len(item)))
        parts.append(item)
    data: npt.NDArray[np.generic] = np.frombuffer(b"".join(parts), dtype=np.uint8).copy()
    return data


def deserialize_bytes(data: npt.NDArray[np.generic], count: Optional[int] = None) -> List[bytes]:
    """Inverse of :func:`serialize_bytes` (bounded by the buffer; raises on truncated data)."""
    raw = data.tobytes()
    out: List[bytes] = []
    offset = 0
    while offset < len(raw) and (count is None or len(out) < count):
        if offset + 4 > len(raw):
            raise InvalidArgumentError("Truncated BYTES tensor: incomplete length prefix")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise InvalidArgumentError("Truncated BYTES tensor: element runs past the end of the buffer")
        out.append(raw[offset : offset + length])
        offset += length
    return out


@dataclasses.dataclass
class Tensor:
    """A typed, shaped view of a :class:`MemoryBuffer`; exports itself through DLPack."""

    data_type: DataType
    shape: Sequence[int]
    memory_buffer: MemoryBuffer

    @property
    def data_ptr(self) -> int:
        return self.memory_buffer.data_ptr

    @property
    def memory_type(self) -> MemoryType:
        return self.memory_buffer.memory_type

    @property
    def memory_type_id(self) -> int:
        return self.memory_buffer.memory_type_id

    @property
    def size(self) -> int:
        return self.memory_buffer.size

    # -- DLPack -----------------------------------------------------------------------------------
    def _numpy_view(self) -> npt.NDArray[np.generic]:
        if self.data_type == DataType.BYTES:
            raise InvalidArgumentError("BYTES tensors have no DLPack form: use to_bytes_array() or to_string_array()")
        try:
            dtype = numpy_dtype(self.data_type)
        except ValueError as exc:
            raise UnsupportedError(str(exc)) from None
        shape = tuple(int(dim) for dim in self.shape)
        count = math.prod(shape)  # (1 for shape (); np.prod of a tuple costs microseconds)
        return self.memory_buffer._bytes_view()[: count * dtype.itemsize].view(dtype).reshape(shape)

    def __dlpack__(self, *args: object, **kwargs: Any) -> Any:
        numeric = cast("npt.NDArray[np.number[Any]]", self._numpy_view())  # BYTES tensors have no DLPack form
        return numeric.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Tuple[int, int]:
        if self.memory_type == MemoryType.GPU:
            return (int(DLDeviceType.kDLCUDA), self.memory_type_id)
        return (int(DLDeviceType.kDLCPU), 0)

    @staticmethod
    def from_dlpack(obj: object) -> Tensor:
        """Tensor over a host DLPack object's memory (no copy if it is C-contiguous)."""
        array = _host_array(obj)
        if array.dtype.kind in ("O", "S", "U"):
            return Tensor.from_bytes_array(array)
        try:
            data_type = data_type_of(array.dtype)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        buffer = MemoryBuffer(int(array.ctypes.data), MemoryType.CPU, 0, int(array.nbytes), array)
        return Tensor(data_type, list(array.shape), buffer)

    @staticmethod
    def _from_object(value: object) -> Tensor:
        """Tensor from anything accepted as a request input (Tensor, DLPack object, list, scalar)."""
        if isinstance(value, Tensor):
            return value
        if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
            return Tensor.from_dlpack(value)
        array = np.asarray(value)
        if array.dtype.kind in ("O", "S", "U"):
            return Tensor.from_bytes_array(array)
        return Tensor.from_dlpack(array)

    # -- BYTES ------------------------------------------------------------------------------------
    @staticmethod
    def from_bytes_array(bytes_array: object) -> Tensor:
        """BYTES tensor from a list or array of ``bytes``/``str`` (str encoded as UTF-8); copies."""
        array = np.asarray(bytes_array, dtype=object) if not isinstance(bytes_array, np.ndarray) else bytes_array
        items: List[bytes] = []
        for item in array.reshape(-1):
            if isinstance(item, (bytes, np.bytes_)):
                items.append(bytes(item))
            elif isinstance(item, (str, np.str_)):
                items.append(str(item).encode("utf-8"))
            else:
                raise InvalidArgumentError(f"Cannot store {type(item).__name__} in a BYTES tensor (bytes or str only)")
        data = serialize_bytes(items)
        buffer = MemoryBuffer(int(data.ctypes.data), MemoryType.CPU, 0, int(data.nbytes), data)
        return Tensor(DataType.BYTES, list(array.shape), buffer)

    @staticmethod
    def from_string_array(string_array: object) -> Tensor:
        """BYTES tensor from a list or array of ``str`` (UTF-8 encoded); copies."""
        array = np.asarray(string_array, dtype=object)
        if not all(isinstance(item, (str, np.str_)) for item in array.reshape(-1)):
            raise InvalidArgumentError("from_string_array takes str elements only (use from_bytes_array for bytes)")
        return Tensor.from_bytes_array(array)

    def to_bytes_array(self) -> npt.NDArray[np.object_]:
        """The BYTES tensor as a numpy object array of ``bytes`` with the tensor's shape."""
        if self.data_type != DataType.BYTES:
            raise InvalidArgumentError(f"to_bytes_array needs a BYTES tensor, this one is {self.data_type.name}")
        shape = tuple(int(dim) for dim in self.shape)
        count = int(np.prod(shape)) if shape else 1
        items = deserialize_bytes(self.memory_buffer._bytes_view(), count)
        if len(items) != count:
            raise InvalidArgumentError(f"BYTES tensor holds {len(items)} elements, its shape {shape} needs {count}")
        result = np.empty(count, dtype=object)
        result[:] = items
        return result.reshape(shape)

    def to_string_array(self) -> npt.NDArray[np.object_]:
        """The BYTES tensor as a numpy object array of ``str`` (UTF-8 decoded)."""
        raw = self.to_bytes_array()
        result = np.empty(raw.size, dtype=object)
        result[:] = [item.decode("utf-8") for item in raw.reshape(-1)]
        shaped: npt.NDArray[np.object_] = result.reshape(raw.shape)
        return shaped

    # -- devices ----------------------------------------------------------------------------------
    def to_host(self) -> Tensor:
        """This tensor, in host memory (only host memory exists on this build)."""
        return self.to_device(MemoryType.CPU)

    def to_device(self, device: DeviceOrMemoryType) -> Tensor:
        """Tensor on ``device``; host memory is returned as is, GPU raises :class:`UnsupportedError`."""
        memory_type, _ = parse_device(device)
        if memory_type == MemoryType.GPU or self.memory_type == MemoryType.GPU:
            raise UnsupportedError(_NO_GPU)
        return self
