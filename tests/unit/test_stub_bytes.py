"""The stub's string (BYTES) pass-through, driven through a fake ``triton_python_backend_utils``.

The numpy C-API table fix is called the way the stub's pybind11 calls it (through ctypes), with the
zero strides pybind11 computes under numpy 2.
"""

import ctypes
import os
import sys
import types

import numpy as np
import pytest

from pytriton.proxy.stubside import _arena, _segments, _stub_bytes, _tensors

STRINGS = np.array([b"abc", b"", "h\u00e9".encode(), b"x" * 300], dtype=object)


class FakeTensor:
    """Does what the stub's ``pb_utils.Tensor(name, ndarray)`` does for an object array."""

    def __init__(self, name, array):
        self.name = name
        self.shape = array.shape
        serialized = FakeUtils.serialize_byte_tensor(array)
        self.serialized = serialized
        self.payload = memoryview(serialized).tobytes()
        # The size the stub computes: element count x the item size at numpy 1's offset.
        self.elsize_seen = ctypes.c_int32.from_address(id(serialized.dtype) + 32).value
        if not _stub_bytes.NUMPY2:
            self.elsize_seen = serialized.dtype.itemsize
        self.byte_size = serialized.size * self.elsize_seen


class FakeUtils(types.SimpleNamespace):
    Tensor = FakeTensor
    serialize_byte_tensor = staticmethod(lambda array: pytest.fail("original serializer called"))
    deserialize_bytes_tensor = staticmethod(lambda array: pytest.fail("original deserializer called"))


@pytest.fixture()
def installed(monkeypatch):
    monkeypatch.setattr(FakeUtils, "serialize_byte_tensor", FakeUtils.serialize_byte_tensor)
    monkeypatch.setattr(FakeUtils, "deserialize_bytes_tensor", FakeUtils.deserialize_bytes_tensor)
    saved = sys.modules.get("numpy.core.multiarray")
    monkeypatch.setattr(_stub_bytes, "UNAVAILABLE", None)
    monkeypatch.setitem(_stub_bytes._state, "table_used", False)
    try:
        _stub_bytes.install(FakeUtils)
        yield FakeUtils
    finally:
        if saved is None:
            sys.modules.pop("numpy.core.multiarray", None)
        else:
            sys.modules["numpy.core.multiarray"] = saved


def test_output_hands_the_stub_the_wire_payload_with_the_right_size(installed):
    payload = _tensors.serialize_bytes(STRINGS)
    tensor = _stub_bytes.output_tensor(installed, "out", payload, STRINGS.shape)
    assert tensor.name == "out" and tensor.shape == STRINGS.shape
    assert tensor.payload == payload
    assert tensor.elsize_seen == 1 and tensor.byte_size == len(payload)
    assert not _stub_bytes._pending
    # numpy 2: the flags changed for the constructor are restored; numpy sees an ordinary dtype.
    assert tensor.serialized.dtype.flags == np.dtype([("b", "u1")]).flags or not _stub_bytes.NUMPY2


def test_other_object_arrays_still_reach_the_original_serializer(monkeypatch):
    calls = []
    utils = types.SimpleNamespace(serialize_byte_tensor=calls.append, deserialize_bytes_tensor=None)
    saved = sys.modules.get("numpy.core.multiarray")
    try:
        _stub_bytes.install(utils)
        utils.serialize_byte_tensor(STRINGS)
    finally:
        if saved is not None:
            sys.modules["numpy.core.multiarray"] = saved
    assert calls and calls[0] is STRINGS


def test_input_is_forwarded_serialized_and_arrives_as_strings(installed, tmp_path):
    encoded = np.frombuffer(_tensors.serialize_bytes(STRINGS), dtype=np.uint8).copy()
    _stub_bytes._state["table_used"] = True  # the stub built `encoded` through the fixed table
    carrier = installed.deserialize_bytes_tensor(encoded).reshape([len(STRINGS)])
    as_numpy = np.empty((), dtype=object)
    as_numpy[()] = carrier  # what pybind11 makes of it
    payload = _stub_bytes.input_payload(as_numpy)
    owner = _arena.SharedArena(f"pytriton-{os.getpid()}-stubbytes", initial_size=4096)
    reader = _arena.ArenaReader()
    try:
        for copies in (1, 200):  # inline, then through the arena
            big = _tensors.SerializedBytes(np.concatenate([payload.data] * copies), (len(STRINGS) * copies,))
            segment, metas = _tensors.write_tensors(owner, [[("s", big)]])
            buffer = reader.attach(segment) if segment else None
            out = _tensors.read_tensor(buffer, metas[0][0], copy=True)
            assert out.shape == (len(STRINGS) * copies,)
            assert list(out) == list(STRINGS) * copies
    finally:
        owner.close()
        reader.close()
        _segments.sweep_segments(f"pytriton-{os.getpid()}-stubbytes")


def test_input_read_without_the_fixed_table_is_refused(installed):
    carrier = installed.deserialize_bytes_tensor(np.zeros(4, np.uint8)).reshape([1])
    if _stub_bytes.NUMPY2:
        with pytest.raises(RuntimeError, match="string"):
            _stub_bytes.input_payload(carrier)
    else:
        assert _stub_bytes.input_payload(carrier) is carrier


def _call_new_from_descr(table, data: bytes, strides):
    """Call table[PyArray_NewFromDescr] as pybind11 does: float32 [4] over ``data``."""
    function = ctypes.PYFUNCTYPE(*_stub_bytes._NEW_FROM_DESCR_SIG)(table[_stub_bytes._NEW_FROM_DESCR])
    descr = np.dtype(np.float32)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(descr))  # numpy steals this reference
    dims = (ctypes.c_ssize_t * 1)(4)
    stride_array = (ctypes.c_ssize_t * 1)(*strides) if strides is not None else None
    source = ctypes.create_string_buffer(data, len(data))
    pointer = function(id(np.ndarray), id(descr), 1, dims, stride_array, ctypes.addressof(source), 0, None)
    array = ctypes.cast(pointer, ctypes.py_object).value
    ctypes.pythonapi.Py_DecRef(ctypes.py_object(array))  # the call's new reference
    return array.copy()  # before `source` goes away


def test_api_table_fix_restores_the_strides_pybind11_misses():
    capsule = importlib_capsule()
    keep, patched = _stub_bytes.patched_api_table(capsule)
    values = np.array([1.5, 2.5, 3.5, 4.5], dtype=np.float32)
    original = ctypes.cast(ctypes.pythonapi.PyCapsule_GetPointer(capsule, None), ctypes.POINTER(ctypes.c_void_p))
    fixed = ctypes.cast(ctypes.pythonapi.PyCapsule_GetPointer(patched, None), ctypes.POINTER(ctypes.c_void_p))
    # What pybind11 gets from numpy's own table under numpy 2: the first element repeated.
    np.testing.assert_array_equal(_call_new_from_descr(original, values.tobytes(), [0]), np.full(4, 1.5, np.float32))
    np.testing.assert_array_equal(_call_new_from_descr(fixed, values.tobytes(), [0]), values)
    np.testing.assert_array_equal(_call_new_from_descr(fixed, values.tobytes(), [4]), values)
    assert keep[0][3] == original[3]  # every other entry is numpy's own


def importlib_capsule():
    import importlib

    name = "numpy._core._multiarray_umath" if _stub_bytes.NUMPY2 else "numpy.core._multiarray_umath"
    return importlib.import_module(name)._ARRAY_API


def test_numpy2_problem_is_none_for_the_numpy_of_this_process():
    assert _stub_bytes.numpy2_problem() is None


def test_numpy2_problem_names_a_layout_it_does_not_know(monkeypatch):
    monkeypatch.setattr(_stub_bytes, "NUMPY2", True)
    monkeypatch.setattr(_stub_bytes, "_numpy2_layout_ok", lambda: False)
    assert "dtype layout" in _stub_bytes.numpy2_problem()


def test_bind_time_check_refuses_strings_with_the_reason(monkeypatch):
    from pytriton._serving.models import check_stub_support
    from pytriton.exceptions import PyTritonBadParameterError

    monkeypatch.setattr(_stub_bytes, "numpy2_problem", lambda: "numpy 9 moved things")
    model = types.SimpleNamespace(name="Strings", has_bytes_tensors=True)
    with pytest.raises(PyTritonBadParameterError, match="'Strings' declares BYTES.*numpy 9 moved things"):
        check_stub_support(model, True)
    check_stub_support(types.SimpleNamespace(name="Numbers", has_bytes_tensors=False), True)
    check_stub_support(model, False)  # a numpy 1.x stub: never refused


@pytest.mark.parametrize("strings", [False, True])
def test_numpy2s_table_fix_is_installed_only_for_a_model_with_strings(monkeypatch, strings):
    # The fix costs two ctypes crossings per array the stub builds; numeric tensors do not need it.
    calls = []
    monkeypatch.setattr(_stub_bytes, "NUMPY2", True)
    monkeypatch.setattr(_stub_bytes, "_install_numpy2", lambda: calls.append("table"))
    utils = types.SimpleNamespace(serialize_byte_tensor=lambda array: array, deserialize_bytes_tensor=None)
    _stub_bytes.install(utils, strings=strings)
    assert calls == (["table"] if strings else [])
    assert utils.serialize_byte_tensor.__module__ == _stub_bytes.__name__  # the codec either way


def test_the_codec_is_replaced_once_per_utils_module():
    # Every model's initialize installs it; a second install must not wrap the first wrapper.
    utils = types.SimpleNamespace(serialize_byte_tensor=lambda array: array, deserialize_bytes_tensor=None)
    _stub_bytes.install(utils, strings=False)
    first = utils.serialize_byte_tensor
    _stub_bytes.install(utils, strings=False)
    assert utils.serialize_byte_tensor is first
