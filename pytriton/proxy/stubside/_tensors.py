"""Tensors on the wire: how each is described in a message and copied into or read from an arena.

Each tensor is described by a ``_messages.TensorMeta``. Small tensors (up to
``_arena.INLINE_LIMIT``) carry their bytes inside the message (``INLINE``); larger ones are written
into the sender's arena (``SENDER``, at ``offset``), or are left where they are when they already lie
in the receiver's own arena (``RECEIVER``). String (BYTES) tensors travel in Triton's serialized
layout (:func:`serialize_bytes`), with either numpy.

Imported on both sides (the stub and the user's process): standard library and numpy only.
Unit tests: tests/unit/test_wire.py.
"""

from __future__ import annotations

import math
import mmap
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from ._arena import INLINE_LIMIT, Arena, ArenaReader
from ._messages import BYTES, INLINE, RECEIVER, SENDER, TensorMeta, Tensors

Buffer = Union[bytes, bytearray, memoryview, "mmap.mmap"]  # what a tensor is read from
_ALIGN = 64
_UINT32 = struct.Struct("<I")  # BYTES element lengths


class SerializedBytes:
    """A BYTES tensor already in Triton's serialized layout: the stub forwards inputs this way.

    ``data`` is a buffer (bytes or a 1-D uint8 array) with each element as a 4-byte little-endian
    length and its bytes (:func:`serialize_bytes`). :func:`write_tensors` sends it unchanged, so
    the receiver sees an ordinary BYTES tensor. ``valid`` is False when the stub could not read the
    tensor (``_stub_bytes``); ``reshape`` is what the stub calls with the tensor's shape.
    """

    __slots__ = ("data", "shape", "valid")
    dtype = np.dtype(object)  # routes it to write_tensors' BYTES branch

    def __init__(self, data: Union[bytes, npt.NDArray[np.uint8]], shape: Tuple[int, ...], valid: bool = True):
        self.data = data
        self.shape = shape
        self.valid = valid

    def reshape(self, shape: Sequence[int]) -> SerializedBytes:
        self.shape = tuple(shape)
        return self


def bytes_payload(buffer: Optional[Buffer], meta: TensorMeta) -> Union[bytes, memoryview]:
    """The serialized content of a BYTES tensor (bytes, or a view of the sender's arena)."""
    if meta.data is not None:
        return meta.data
    if buffer is None:
        raise ValueError(f"tensor {meta.name!r} is in an arena but the message names none")
    return memoryview(buffer)[meta.offset : meta.offset + meta.nbytes]


def serialize_bytes(array: npt.NDArray[np.generic]) -> bytes:
    """Triton's BYTES layout: each element as a 4-byte little-endian length and its bytes."""
    pack = _UINT32.pack
    parts: List[bytes] = []
    for item in array.reshape(-1).tolist():
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray)):
            item = str(item).encode("utf-8")
        parts.append(pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def deserialize_bytes(buffer: Buffer, offset: int, nbytes: int, shape: Tuple[int, ...]) -> npt.NDArray[np.generic]:
    """Inverse of :func:`serialize_bytes`: an object array of ``bytes`` with ``shape``."""
    view = memoryview(buffer)[offset : offset + nbytes]
    count = 1
    for dim in shape:
        count *= dim
    items: List[bytes] = []
    position = 0
    unpack = _UINT32.unpack_from
    for _ in range(count):
        (length,) = unpack(view, position)
        position += 4
        items.append(bytes(view[position : position + length]))
        position += length
    view.release()
    result = np.empty(count, dtype=object)
    result[:] = items
    return result.reshape(shape)


def write_tensors(
    arena: Arena, groups: Sequence[Sequence[Tuple[str, Any]]], peer: Optional[ArenaReader] = None
) -> Tuple[Optional[str], List[List[TensorMeta]]]:
    """Describe every tensor of every group, group by group, copying large ones into ``arena``.

    Returns the arena's segment name if anything was written to it (the receiver must map it),
    else None, and the tensors' headers group by group.

    Small tensors travel inline (their bytes are the payload). Large numeric tensors are copied
    by numpy straight from their source, even non-contiguous or Fortran-ordered, into the arena,
    with no intermediate copy. A large tensor that already lies in the receiver's own arena (seen
    here through ``peer``, e.g. an input returned unchanged) is not copied at all: its payload is
    ``(offset, nbytes, IN_RECEIVER)``. BYTES tensors are serialised first (Triton's layout), unless
    they come as :class:`SerializedBytes`.
    """
    metas: List[Tensors] = []
    pending: List[Tuple[int, object]] = []  # (offset, source) for the arena
    # None: the caller knows everything is small; the TCP transport's arena keeps everything inline.
    inline_limit = INLINE_LIMIT if arena is None else arena.inline_limit
    total = 0
    for group in groups:
        group_meta: Tensors = []
        for name, array in group:
            if array.dtype.kind in "SUO":
                data: Any = array.data if type(array) is SerializedBytes else serialize_bytes(array)
                dtype = BYTES
                nbytes = len(data)
            else:
                data = array
                descr = array.dtype
                dtype = _DTYPE_STRINGS.get(descr) or _dtype_string(descr)
                nbytes = array.nbytes
            if nbytes <= inline_limit:
                # bytes() returns a bytes object itself; a SerializedBytes' array is copied (small).
                inline = bytes(data) if dtype == BYTES else array.tobytes()
                group_meta.append(TensorMeta(name, dtype, array.shape, INLINE, inline, 0, nbytes))
                continue
            if peer is not None and dtype != BYTES:
                offset = peer.offset_of(array)
                if offset is not None:
                    group_meta.append(TensorMeta(name, dtype, array.shape, RECEIVER, None, offset, nbytes))
                    continue
            group_meta.append(TensorMeta(name, dtype, array.shape, SENDER, None, total, nbytes))
            pending.append((total, data))
            total = (total + nbytes + _ALIGN - 1) & ~(_ALIGN - 1)
        metas.append(group_meta)
    if not pending:
        return None, metas
    buffer = arena.reserve(total)
    for offset, data in pending:
        if isinstance(data, bytes):
            buffer[offset : offset + len(data)] = data
        else:
            target = np.frombuffer(buffer, dtype=data.dtype, count=data.size, offset=offset).reshape(data.shape)
            np.copyto(target, data, casting="no")
            del target  # release the export so the arena can be closed
    return arena.name, metas


_DTYPES: Dict[str, np.dtype[np.generic]] = {}
_MAX_CACHED_DTYPES = 256
# numpy builds ``dtype.str`` anew on each access (a sprintf); the built-in dtypes are singletons
# whose string never changes, so theirs are kept (at most a few dozen of them exist).
_DTYPE_STRINGS: Dict[np.dtype[np.generic], str] = {}


def _dtype_string(descr: np.dtype[np.generic]) -> str:
    code: str = descr.str  # typed: numpy's stubs for Python 3.10 give Any here
    if descr.isbuiltin == 1:  # not structured, not parametric (datetime units), native byte order
        _DTYPE_STRINGS[descr] = code
    return code


def _dtype(code: str) -> np.dtype[np.generic]:
    """The numpy dtype of a numeric tensor's code from the wire (cached once checked).

    A code naming Python objects is refused: such an array read from raw bytes would hold
    pointers the peer chose (numpy itself refuses it only in ``frombuffer``).
    """
    dtype = _DTYPES.get(code)
    if dtype is None:
        dtype = np.dtype(code)
        if dtype.hasobject:
            raise ValueError(f"tensor dtype {code!r} holds Python objects; it cannot be read from bytes")
        if len(_DTYPES) < _MAX_CACHED_DTYPES:  # the codes come from the peer: keep the cache bounded
            _DTYPES[code] = dtype
    return dtype


def read_tensor(
    buffer: Optional[Buffer], meta: TensorMeta, copy: bool, own: Optional[Buffer] = None
) -> npt.NDArray[np.generic]:
    """The array ``meta`` describes; ``buffer`` is the sender's arena, ``own`` the receiver's.

    ``copy=True`` returns memory the caller owns and may keep. ``copy=False`` returns a view where
    it can: of the message itself (read-only), or of the arena (writable; the view keeps the mapping
    alive, but the sender writes that memory again for a later message unless a final reply told it
    not to, see :func:`retires`). BYTES tensors are always decoded into a new object array.
    """
    code, shape, data = meta.dtype, meta.shape, meta.data
    if data is not None:
        if code == BYTES:
            return deserialize_bytes(data, 0, len(data), shape)
        dtype = _dtype(code)
        # np.ndarray over the bytes takes about half the time of frombuffer().reshape() (and of
        # .copy() after them when the caller keeps the array: a bytearray copy is the array's own
        # writable memory). It accepts a buffer longer than the shape needs: check the size here.
        if len(data) != dtype.itemsize * math.prod(shape):
            raise ValueError(f"tensor {meta.name!r}: {len(data)} bytes do not hold shape {shape} of {code}")
        array: npt.NDArray[np.generic] = np.ndarray(shape, dtype, bytearray(data) if copy else data)
        return array
    offset, nbytes = meta.offset, meta.nbytes
    if meta.place == RECEIVER:
        buffer = own
    if buffer is None:
        raise ValueError(f"tensor {meta.name!r} is in an arena this side has not mapped")
    if code == BYTES:
        return deserialize_bytes(buffer, offset, nbytes, shape)
    dtype = _dtype(code)
    # np.frombuffer holds a buffer export on the mapping, so it cannot be unmapped under this
    # array (np.ndarray(buffer=mmap) does not, and a closed mapping would crash the process).
    array = np.frombuffer(buffer, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset).reshape(shape)
    return array.copy() if copy else array
