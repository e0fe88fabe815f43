"""Numeric tensors between numpy 2 and the stub through DLPack, at the cost DLPack should have.

Imported inside Triton's Python-backend stub only (``_stub.py`` and the models of the e2e tests),
where just the standard library, numpy and ``triton_python_backend_utils`` exist. The stub on
Python 3.13 runs with numpy 2, and numeric tensors cross through DLPack there (docs/architecture.md,
"numpy 2 and string tensors"). Two of the stub's DLPack methods trip numpy 2, each costing far more than the
transfer itself; the functions here go around them.

**Inputs** (:func:`array`): ``np.from_dlpack(tensor)`` first calls ``tensor.__dlpack__`` with the
keywords of the current protocol (``max_version``, ...), which the stub's ``Tensor.__dlpack__``
(python_backend 2.51) does not take; pybind11 raises a ``TypeError`` whose message describes the
call, and numpy then calls it again without them: 5-25 us per input instead of 2-10 us in the real
stub (bench/history.md). :func:`array` hands numpy the capsule of ``tensor.to_dlpack()`` through an
object whose ``__dlpack__`` takes any keywords. numpy marks an array from such a capsule read-only
either way.

**Outputs** (:func:`tensor`): ``pb_utils.Tensor.from_dlpack`` (python_backend ``src/pb_tensor.cc``,
``FromDLPackCapsule``) marks the capsule it consumed as ``"used_dlpack"``, while the DLPack
protocol, and numpy's capsule destructor, expect ``"used_dltensor"``. When the capsule is freed,
numpy therefore takes it for one that was never consumed and asks it for its ``"dltensor"``
pointer, which fails:

- numpy 2 (the stub on Python 3.13) reports the failure as an unraisable exception: a traceback
  written to the stub's stderr, which is the server's log, for every output tensor, at a cost of
  50-200 us each in the real stub (bench/history.md);
- numpy 1.26 recurses on that failure until the stub crashes, which is why the numpy 1.x stub
  never used DLPack for outputs.

:func:`tensor` keeps the capsule in hand while the stub consumes it and then gives it the
protocol's name, so numpy's destructor sees a consumed capsule and leaves it alone. Ownership is
unchanged: the stub's tensor holds the capsule's managed tensor and calls its deleter (numpy's,
which releases the array) when the tensor is destroyed.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Protocol, Tuple

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    from ._pb_types import PbDLPackFactory, PbTensor

# PyCapsule_SetName keeps the pointer it is given, so the name must live as long as the process:
# these are module constants, and bytes objects never move.
_USED = b"used_dltensor"  # the DLPack protocol's name for a consumed capsule
_STUB_USED = b"used_dlpack"  # the name python_backend gives the capsule it consumed

_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.argtypes = (ctypes.py_object, ctypes.c_char_p)
_set_name.restype = ctypes.c_int
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.argtypes = (ctypes.py_object, ctypes.c_char_p)
_is_valid.restype = ctypes.c_int


class _Capsule:
    """A capsule of the stub's tensor for ``np.from_dlpack``, whatever keywords numpy passes (see :func:`array`)."""

    __slots__ = ("_capsule", "_tensor")

    def __init__(self, tensor: PbTensor) -> None:
        self._tensor = tensor
        self._capsule = tensor.to_dlpack()

    def __dlpack__(self, **_protocol: object) -> object:
        return self._capsule

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self._tensor.__dlpack_device__()


def array(tensor: PbTensor) -> npt.NDArray[np.generic]:
    """The input ``tensor`` as a numpy 2 array over the stub's memory (read-only; module docstring).

    The array keeps the stub's tensor alive through the capsule's deleter. Raises what
    ``np.from_dlpack`` raises (a tensor that is not in host memory, for one).
    """
    return np.from_dlpack(_Capsule(tensor))  # type: ignore[arg-type]  # typeshed's capsule type, 3.13+ only


class Exporter(Protocol):
    """What :func:`tensor` takes: a numpy array (writable and C-contiguous) exports its capsule."""

    def __dlpack__(self) -> object: ...


def tensor(pb_utils: PbDLPackFactory, name: str, array: Exporter) -> object:
    """``pb_utils.Tensor.from_dlpack(name, array)`` without the failing destructor (module docstring).

    ``array`` must be writable and C-contiguous, as DLPack export and the stub require; the stub's
    tensor keeps it alive. Raises what ``__dlpack__`` or ``from_dlpack`` raise.
    """
    capsule = array.__dlpack__()
    try:
        made = pb_utils.Tensor.from_dlpack(name, capsule)
    except BaseException:
        # The stub renames the capsule only once nothing else can fail; should it have, the
        # capsule is consumed and must not reach numpy's destructor under the stub's name.
        if _is_valid(capsule, _STUB_USED):
            _set_name(capsule, _USED)
        raise
    _set_name(capsule, _USED)
    return made
