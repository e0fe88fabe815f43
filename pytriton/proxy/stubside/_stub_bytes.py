"""String (BYTES) tensors inside Triton's Python-backend stub, with numpy 1.x or numpy 2.

Imported by the proxy model (``_stub.py``) in the stub process only, where just the standard
library, numpy and ``triton_python_backend_utils`` exist. It is part of the
stub-side package (``stubside/__init__.py``).

The stub (de)serialises BYTES tensors by calling ``serialize_byte_tensor`` and
``deserialize_bytes_tensor`` on the ``triton_python_backend_utils`` module, looked up at each call.
The proxy never needs the strings themselves, only Triton's serialized layout, which is also the
wire format (``_tensors.serialize_bytes``). :func:`install` replaces both functions:

- an input arrives in ``deserialize_bytes_tensor`` as a uint8 array holding the serialized tensor
  (the stub's own copy); it is wrapped, unparsed, in a :class:`_tensors.SerializedBytes` that the
  proxy forwards as is (``Tensor.as_numpy()`` then returns a 0-d object array holding it);
- an output is made by :func:`output_tensor`: ``pb_utils.Tensor(name, placeholder)`` with an
  object placeholder of the right shape, for which ``serialize_byte_tensor`` returns the payload.

So neither side of the stub parses or rebuilds Python strings, with either numpy.

numpy 2: the stub is compiled with pybind11 against numpy 1.x, and pybind11 reads a dtype's item
size at numpy 1's offset in the C struct, where numpy 2 keeps the low 32 bits of the dtype's
``flags`` (0 for numeric dtypes). Two effects, and what :func:`install` does about them:

1. An array pybind11 builds over the stub's memory gets stride 0: each input arrives as its first
   byte repeated. pybind11 reaches numpy's C functions through the table it reads, once and lazily
   (after this module is imported), from ``numpy.core.multiarray._ARRAY_API``. ``install`` puts a
   copy of numpy's table there whose ``PyArray_NewFromDescr`` drops all-zero strides for memory it
   is given, so numpy computes the real ones. (Numeric inputs are also right then; the proxy still
   reads them through DLPack.)
2. The byte size the stub takes from an array is its element count times that misread item size.
   The output payload is therefore viewed with a private one-byte structured dtype whose ``flags``
   are set to 1 only while ``pb_utils.Tensor`` reads the size (the constructor runs entirely under
   the GIL and only exports the buffer and reads the size), and restored right after.

Both are checked: the numpy 2 struct layout when installing, the table's use when an input
arrives. If either fails, string tensors fail with :data:`UNAVAILABLE` as the message, and numeric
tensors are unaffected.
"""

from __future__ import annotations

import ctypes
import sys
import types
from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple, Union

import numpy as np

from . import _tensors

if TYPE_CHECKING:
    import numpy.typing as npt

    from ._pb_types import PbBytesCodec, PbTensorFactory

    # The C-level function behind PyArray_NewFromDescr, as ctypes calls it: it returns the address of
    # the new array object (None for NULL).
    _NewFromDescr = Callable[..., Optional[int]]

NUMPY2 = int(np.__version__.split(".")[0]) >= 2
UNAVAILABLE: Optional[str] = None  # why string tensors cannot work in this stub, if they cannot

_NEW_FROM_DESCR = 94  # index of PyArray_NewFromDescr in numpy's C-API table (the same in 1.x and 2.x)
_TABLE_LENGTH = 300  # pybind11 2.x uses entries up to 282 (PyArray_SetBaseObject)
_FLAGS_OFFSET = 32  # numpy 2 PyArray_Descr: npy_uint64 flags here (numpy 1's int elsize), elsize at 40
_ELSIZE_OFFSET = 40
_NEW_FROM_DESCR_SIG = (
    ctypes.c_void_p,  # PyObject* result (a new reference, passed through untouched)
    ctypes.c_void_p,  # PyTypeObject* subtype
    ctypes.c_void_p,  # PyArray_Descr* descr (reference stolen by numpy)
    ctypes.c_int,  # nd
    ctypes.POINTER(ctypes.c_ssize_t),  # dims
    ctypes.POINTER(ctypes.c_ssize_t),  # strides
    ctypes.c_void_p,  # data
    ctypes.c_int,  # flags
    ctypes.c_void_p,  # obj
)

_state: Dict[str, bool] = {"table_used": False}
_pending: Dict[int, npt.NDArray[np.generic]] = {}  # id(placeholder) -> payload array, while pb_utils.Tensor runs


def _fixed_strides_new_from_descr(real: _NewFromDescr) -> _NewFromDescr:
    def new_from_descr(
        subtype: object,
        descr: object,
        nd: int,
        dims: object,
        strides: Optional[ctypes._Pointer[ctypes.c_ssize_t]],
        data: object,
        flags: int,
        obj: object,
    ) -> Optional[int]:
        _state["table_used"] = True
        if data and strides and nd > 0 and not any(strides[axis] for axis in range(nd)):
            strides = None  # pybind11 computed them from an item size it read as 0
        return real(subtype, descr, nd, dims, strides, data, flags, obj)

    return new_from_descr


def patched_api_table(capsule: object) -> Tuple[object, object]:
    """A copy of the numpy C-API table in ``capsule`` with the stride fix, and a capsule for it.

    Both returned objects (and the callback inside) must stay alive as long as anything may use
    the table: for the stub, the life of the process.
    """
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_New.restype = ctypes.py_object
    api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    original = ctypes.cast(api.PyCapsule_GetPointer(capsule, None), ctypes.POINTER(ctypes.c_void_p))
    table = (ctypes.c_void_p * _TABLE_LENGTH)(*[original[index] for index in range(_TABLE_LENGTH)])
    # PYFUNCTYPE keeps the GIL for the call into numpy; CFUNCTYPE is what pybind11 calls.
    real = ctypes.PYFUNCTYPE(*_NEW_FROM_DESCR_SIG)(original[_NEW_FROM_DESCR])
    hook = ctypes.CFUNCTYPE(*_NEW_FROM_DESCR_SIG)(_fixed_strides_new_from_descr(real))
    table[_NEW_FROM_DESCR] = ctypes.cast(hook, ctypes.c_void_p).value
    keep = (table, hook, real)
    return keep, api.PyCapsule_New(ctypes.addressof(table), None, None)


def _numpy2_layout_ok() -> bool:
    """True if dtype objects have numpy 2's layout at the offsets this module relies on."""
    probe = np.dtype("<U3")  # flags 8 and item size 12: distinct, non-zero values
    flags = ctypes.c_uint64.from_address(id(probe) + _FLAGS_OFFSET).value
    elsize = ctypes.c_int64.from_address(id(probe) + _ELSIZE_OFFSET).value
    return sys.byteorder == "little" and flags == probe.flags and elsize == probe.itemsize


def _numpy_api_capsule() -> object:
    """numpy 2's C-API capsule, after checking what the workaround relies on (raises if anything is off)."""
    if not _numpy2_layout_ok():
        raise RuntimeError(f"numpy {np.__version__}'s dtype layout is not the one the workaround knows")
    import importlib
    import importlib.util

    if importlib.util.find_spec("numpy.core") is None:  # the package pybind11 imports the table from
        raise RuntimeError(f"numpy {np.__version__} has no numpy.core package")
    return importlib.import_module("numpy._core._multiarray_umath")._ARRAY_API


def numpy2_problem() -> Optional[str]:
    """Why string tensors cannot work in a stub running this process's numpy, or None if they can."""
    if not NUMPY2:
        return None
    try:
        _numpy_api_capsule()
    except Exception as exc:  # noqa: BLE001  (any failure means the same: no strings)
        return f"numpy {np.__version__} does not allow the stub's string workaround ({exc})"
    return None


def _install_numpy2() -> None:
    keep, capsule = patched_api_table(_numpy_api_capsule())
    module = types.ModuleType("numpy.core.multiarray")
    module._ARRAY_API = capsule  # type: ignore[attr-defined]
    module._pytriton_keep = keep  # type: ignore[attr-defined]
    import numpy.core  # noqa: F401  (pybind11 imports the package before the module below)

    # pybind11 imports "numpy.core.multiarray" for the table; nothing else in the stub does.
    sys.modules["numpy.core.multiarray"] = module


def install(pb_utils: PbBytesCodec, *, strings: bool = True) -> None:
    """Route the stub's BYTES (de)serialisation through this module (once per stub process).

    ``strings``: whether the model has string tensors (its config names ``TYPE_STRING`` anywhere).
    Only then does numpy 2 get the C-API table fix (module docstring, item 1): numeric tensors go
    through DLPack under numpy 2 and never read the arrays pybind11 builds, while the fix costs two
    ctypes crossings for every array the stub builds, six per request of a one-input model in the
    real stub (bench/history.md). pybind11 reads the table when the stub first builds an array, so
    this must run before the first request. The codec is replaced once per ``pb_utils``.
    """
    global UNAVAILABLE
    if NUMPY2 and strings:
        try:
            _install_numpy2()
        except Exception as exc:  # noqa: BLE001  (any failure: strings unavailable, numerics unaffected)
            UNAVAILABLE = (
                f"string (BYTES) tensors are not available in this Triton stub with numpy {np.__version__} "
                f"(Python {sys.version_info.major}.{sys.version_info.minor}): {exc}"
            )
    original_serialize = pb_utils.serialize_byte_tensor
    if getattr(original_serialize, "__module__", None) == __name__:  # installed already (an earlier model)
        return

    def serialize_byte_tensor(array: object) -> object:
        payload = _pending.get(id(array))
        if payload is None:
            return original_serialize(array)
        if NUMPY2:
            ctypes.c_uint64.from_address(id(payload.dtype) + _FLAGS_OFFSET).value = 1
        return payload

    def deserialize_bytes_tensor(encoded: npt.NDArray[np.uint8]) -> _tensors.SerializedBytes:
        return _tensors.SerializedBytes(encoded, (len(encoded),), valid=not NUMPY2 or _state["table_used"])

    pb_utils.serialize_byte_tensor = serialize_byte_tensor
    pb_utils.deserialize_bytes_tensor = deserialize_bytes_tensor


def input_payload(value: object) -> _tensors.SerializedBytes:
    """The :class:`_tensors.SerializedBytes` behind ``Tensor.as_numpy()`` of a BYTES input."""
    carrier = value[()] if isinstance(value, np.ndarray) else value
    if not isinstance(carrier, _tensors.SerializedBytes):
        raise TypeError(f"unexpected BYTES input representation {type(carrier).__name__}")
    if not carrier.valid:
        raise RuntimeError(
            UNAVAILABLE
            or "string (BYTES) tensors are not available in this Triton stub: numpy's C-API table was read "
            "before the proxy could fix it"
        )
    return carrier


def output_tensor(
    pb_utils: PbTensorFactory, name: str, payload: Union[bytes, memoryview], shape: Tuple[int, ...]
) -> object:
    """``pb_utils.Tensor`` of BYTES ``shape`` whose serialized content is ``payload`` (a buffer)."""
    if UNAVAILABLE:
        raise RuntimeError(UNAVAILABLE)
    placeholder = np.empty(shape, dtype=object)  # gives the stub the type and the shape
    if NUMPY2:
        # A fresh dtype per call: its flags are changed for the constructor only, and no other
        # array or thread ever sees it (see the module docstring).
        view = np.frombuffer(payload, dtype=np.dtype([("b", "u1")]))
        saved = view.dtype.flags
    else:
        view = np.frombuffer(payload, dtype=np.uint8)
    _pending[id(placeholder)] = view
    try:
        return pb_utils.Tensor(name, placeholder)
    finally:
        del _pending[id(placeholder)]
        if NUMPY2:
            ctypes.c_uint64.from_address(id(view.dtype) + _FLAGS_OFFSET).value = saved
