"""Numeric outputs through DLPack in the stub (pytriton/proxy/stubside/_stub_dlpack.py).

The fake :class:`StubTensor` consumes a capsule as python_backend's ``Tensor.from_dlpack`` does
(``FromDLPackCapsule`` in ``src/pb_tensor.cc``): it reads the managed tensor, renames the capsule
``"used_dlpack"`` and calls the managed tensor's deleter when it is released. With that name left on
the capsule, numpy's capsule destructor fails (numpy 2: an unraisable exception per tensor; numpy
1.26: a crash), which the first test shows in a child process.
"""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pytriton.proxy.stubside import _stub_dlpack


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))),
]

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.argtypes = (ctypes.py_object, ctypes.c_char_p)
_get_pointer.restype = ctypes.c_void_p
_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.argtypes = (ctypes.py_object,)
_get_name.restype = ctypes.c_char_p
_rename = ctypes.pythonapi.PyCapsule_SetName
_rename.argtypes = (ctypes.py_object, ctypes.c_char_p)
_rename.restype = ctypes.c_int
_STUB_USED = b"used_dlpack"  # module constant: a capsule keeps the pointer to its name
_KINDS = {0: "i", 1: "u", 2: "f"}  # DLPack type codes: int, uint, float


def consume_capsule(capsule: object) -> tuple:
    """What the stub does with a capsule: (a copy of its array, the managed tensor to release)."""
    managed = _DLManagedTensor.from_address(_get_pointer(capsule, b"dltensor"))
    tensor = managed.dl_tensor
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    dtype = np.dtype(f"{_KINDS[tensor.dtype.code]}{tensor.dtype.bits // 8}")
    size = int(np.prod(shape)) * dtype.itemsize
    memory = (ctypes.c_char * size).from_address(tensor.data + tensor.byte_offset)
    array = np.frombuffer(memory, dtype).reshape(shape).copy()
    _rename(capsule, _STUB_USED)
    return array, managed


def release(managed: _DLManagedTensor) -> None:
    """What the stub's tensor does when it is destroyed (``PbTensor::DeleteDLPack``)."""
    managed.deleter(ctypes.pointer(managed))


class StubTensor:
    """``pb_utils.Tensor`` of the stub, as far as ``from_dlpack`` goes; ``fail`` makes it raise."""

    fail = ""  # "", "before" (before the capsule is renamed) or "after"

    def __init__(self, name, array, managed):
        self.name, self.array, self.managed = name, array, managed

    @classmethod
    def from_dlpack(cls, name, capsule):
        if cls.fail == "before":
            raise RuntimeError("refused before the rename")
        array, managed = consume_capsule(capsule)
        if cls.fail == "after":
            raise RuntimeError("refused after the rename")
        return cls(name, array, managed)


class FakeUtils:
    Tensor = StubTensor


@pytest.fixture
def unraisable(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


def test_the_fake_stub_reproduces_the_failing_destructor():
    # The stub's own name left on the capsule: numpy 2 reports an unraisable exception when the
    # capsule is freed, numpy 1.26 crashes. In a child process, so the crash cannot take pytest down.
    code = textwrap.dedent("""
        import numpy as np
        from tests.unit.test_stub_dlpack import consume_capsule, release
        array = np.arange(4, dtype=np.float32)
        capsule = array.__dlpack__()
        _, managed = consume_capsule(capsule)
        del capsule
        release(managed)
        print("survived")
    """)
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root)
    assert child.returncode != 0 or "PyCapsule_GetPointer called with incorrect name" in child.stderr


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.int8, np.uint16])
def test_a_tensor_reads_the_array_and_its_capsule_is_freed_quietly(unraisable, dtype):
    array = np.arange(12, dtype=dtype).reshape(3, 4)
    base = sys.getrefcount(array)
    tensor = _stub_dlpack.tensor(FakeUtils, "OUT", array)
    gc.collect()
    assert unraisable == []
    assert tensor.name == "OUT"
    np.testing.assert_array_equal(tensor.array, array)
    assert tensor.array.dtype == array.dtype
    assert sys.getrefcount(array) == base + 1  # the stub's managed tensor holds the array
    release(tensor.managed)
    assert sys.getrefcount(array) == base  # and lets it go through numpy's deleter


def test_a_refusal_before_the_capsule_is_consumed_frees_it_normally(unraisable, monkeypatch):
    monkeypatch.setattr(StubTensor, "fail", "before")
    array = np.zeros(4, np.float32)
    base = sys.getrefcount(array)
    with pytest.raises(RuntimeError, match="before"):
        _stub_dlpack.tensor(FakeUtils, "OUT", array)
    gc.collect()
    assert unraisable == []
    assert sys.getrefcount(array) == base  # numpy's destructor released the unconsumed capsule


def test_a_refusal_after_the_capsule_was_consumed_leaves_it_for_numpy_quietly(unraisable, monkeypatch):
    monkeypatch.setattr(StubTensor, "fail", "after")
    seen = []
    real = _stub_dlpack._set_name

    def set_name(capsule, name):
        seen.append((_get_name(capsule), name))
        return real(capsule, name)

    monkeypatch.setattr(_stub_dlpack, "_set_name", set_name)
    with pytest.raises(RuntimeError, match="after"):
        _stub_dlpack.tensor(FakeUtils, "OUT", np.zeros(4, np.float32))
    gc.collect()
    assert unraisable == []
    assert seen == [(b"used_dlpack", b"used_dltensor")]


class InputTensor:
    """An input ``pb_utils.Tensor`` as far as DLPack goes: ``__dlpack__`` takes ``stream`` only, as
    python_backend 2.51's does, so numpy 2's ``from_dlpack(tensor)`` fails once before it succeeds."""

    def __init__(self, array):
        self.array = array
        self.protocol_calls = []

    def __dlpack__(self, stream=None, **unknown):
        self.protocol_calls.append(sorted(unknown))
        if unknown:
            raise TypeError(f"__dlpack__(): incompatible function arguments; kwargs: {unknown}")
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def to_dlpack(self):
        return self.array.__dlpack__()


def test_an_input_is_read_without_a_failing_protocol_call(unraisable):
    source = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = InputTensor(source)
    array = _stub_dlpack.array(tensor)
    np.testing.assert_array_equal(array, source)
    assert np.shares_memory(array, source)  # a view of the stub's memory, not a copy
    assert tensor.protocol_calls == []
    del array, tensor
    gc.collect()
    assert unraisable == []


def test_the_fake_input_tensor_refuses_the_current_protocols_keywords():
    # What _stub_dlpack.array goes around: numpy 2.1 and later ask with max_version first, and only
    # retry without keywords after the TypeError (numpy 1.x and 2.0 ask with stream only).
    tensor = InputTensor(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="incompatible"):
        tensor.__dlpack__(stream=None, max_version=(1, 0))
    np.testing.assert_array_equal(np.from_dlpack(tensor), np.zeros(3, np.float32))
