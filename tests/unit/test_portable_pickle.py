"""numpy objects pickled for a backend instance's stub (pytriton/proxy/stubside/_portable_pickle.py).

The round trip is checked in this interpreter and, where the stub's environment has another numpy
major version than this one (numpy 2 here, pytriton's private numpy 1.x there), by unpickling in a
fresh interpreter of that environment, with the user's ``sys.path`` behind its own as in the stub.
"""

from __future__ import annotations

import functools
import json
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest

from pytriton.proxy import _backend_kind, _process
from pytriton.proxy.stubside import _portable_pickle
from tests.unit.test_stub_package import _stub_python

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Weights:
    """A stateful callable as users write it: arrays made in ``__init__``."""

    def __init__(self) -> None:
        self.w = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::-1]  # not contiguous
        self.same = self.w
        self.bias = np.float64(0.5)
        self.kind = np.dtype([("a", "<i4"), ("b", "<f8", (2,))])
        self.table = np.zeros(2, self.kind)
        self.flags = np.array([True, False])
        self.empty = np.zeros((0, 3), np.int16)
        self.text = np.array(["ab", "wörld"])
        self.objects = np.array([b"x", None, [1, 2]], dtype=object)
        self.nested = {"layers": [np.ones(2, np.int64), np.uint8(7)]}
        self.stamp = np.array(["2024-01-02"], dtype="datetime64[D]")

    def __call__(self, requests):
        return requests


def _dump(obj: object) -> bytes:
    return _process.dump_callable(obj, "Model", 0, kind="backend", pickler=_backend_kind.CallablePickler)


def _check(loaded: Weights, original: Weights) -> None:
    for name in ("w", "flags", "empty", "text", "table", "stamp"):
        value, expected = getattr(loaded, name), getattr(original, name)
        assert type(value) is np.ndarray and value.dtype == expected.dtype and value.shape == expected.shape
        np.testing.assert_array_equal(value, expected)
    assert loaded.same is loaded.w and loaded.w.flags.writeable  # shared stays shared; writable
    assert type(loaded.bias) is np.float64 and loaded.bias == 0.5
    assert loaded.kind == original.kind and loaded.kind.names == ("a", "b")
    assert loaded.objects.dtype == object and loaded.objects.tolist() == [b"x", None, [1, 2]]
    assert loaded.nested["layers"][1] == 7 and type(loaded.nested["layers"][1]) is np.uint8


def test_arrays_scalars_and_dtypes_round_trip_without_numpys_private_modules():
    original = Weights()
    data = _dump(original)
    assert b"numpy._core" not in data and b"numpy.core" not in data and b"multiarray" not in data
    _check(pickle.loads(data), original)


def test_a_plain_pickle_would_name_numpys_private_module():
    """What failed in the stub before: the default pickle of an array names numpy's private module."""
    private = b"numpy._core" if np.__version__.startswith("2") else b"numpy.core"
    assert private in pickle.dumps(np.zeros(2), protocol=pickle.HIGHEST_PROTOCOL)


def test_a_numpy_object_without_a_portable_form_is_labelled_with_its_attribute():
    class Holder:
        pass

    holder = Holder()
    holder.inner = {"gen": np.random.default_rng(3)}
    holder.m = np.ma.array([1, 2], mask=[False, True])
    part = functools.partial(_identity, holder.inner, holder.m)
    data = _dump(part)
    assert b"_guarded" in data
    loaded = pickle.loads(data)  # the same numpy: it simply loads
    assert type(loaded.args[1]) is np.ma.MaskedArray and loaded.args[1].mask.tolist() == [False, True]
    assert loaded.args[0]["gen"].integers(100) == np.random.default_rng(3).integers(100)
    assert _portable_pickle.find_path(part, holder.m) == "callable.args[1]"
    assert _portable_pickle.find_path(part, holder.inner["gen"]) == "callable.args[0]['gen']"


def test_the_guard_names_the_attribute_and_the_fix_when_numpy_cannot_rebuild_it():
    nested = pickle.dumps(np.ma.array([1]))
    broken = nested.replace(b"numpy", b"nompy")  # as numpy 1.x sees numpy 2's private module
    with pytest.raises(pickle.UnpicklingError) as info:
        _portable_pickle._guarded("callable.m", "numpy.ma.MaskedArray", "2.0.0", broken)
    message = str(info.value)
    assert "callable.m (a numpy.ma.MaskedArray)" in message and "numpy 2.0.0" in message
    assert "instance_kind='process'" in message and "ModuleNotFoundError" in message


def test_find_path_follows_objects_methods_slots_and_closures():
    class Slotted:
        __slots__ = ("x",)

    target = np.zeros(1)
    slotted = Slotted()
    slotted.x = [None, target]
    obj = Weights()
    obj.extra = slotted
    assert _portable_pickle.find_path(obj.__call__, target) == "callable.__self__.extra.x[1]"

    def closure(requests):
        return target

    assert _portable_pickle.find_path(closure, target) == "callable.<closure target>"
    assert _portable_pickle.find_path(obj, np.zeros(1)) is None


def _identity(*args):
    return args


def test_healthy_callables_pickle_as_before():
    """Functions, decorated functions and plain objects are unchanged by the portable rules."""
    loaded = pickle.loads(_dump(functools.partial(_identity, 1, "a")))
    assert loaded() == (1, "a")
    assert pickle.loads(_dump(np.float32)) is np.float32  # scalar types by dtype code, as before


def test_the_stubs_numpy_rebuilds_what_this_numpy_pickled(tmp_path):
    """Pickled here (the user's numpy), unpickled by the stub environment's numpy (1.x beside numpy 2)."""
    python = _stub_python()
    original = Weights()
    (tmp_path / "data.pkl").write_bytes(_dump(original))
    (tmp_path / "generator.pkl").write_bytes(_dump(functools.partial(_identity, {"rng": np.random.default_rng(1)})))
    code = (
        "import json, pickle, sys\n"
        # the stub's own paths first (its numpy), the user's behind them (pytriton, this test module)
        f"sys.path.extend({json.dumps([str(ROOT)] + [p for p in sys.path if p.endswith('site-packages')])})\n"
        "import numpy as np\n"
        "obj = pickle.loads(open('data.pkl', 'rb').read())\n"
        "print(json.dumps({'numpy': np.__version__, 'w': obj.w.tolist(), 'same': obj.same is obj.w,\n"
        "  'bias': [type(obj.bias).__name__, float(obj.bias)], 'kind': str(obj.kind), 'table': obj.table.dtype.names,\n"
        "  'text': obj.text.tolist(), 'objects': repr(obj.objects.tolist()), 'stamp': str(obj.stamp[0]),\n"
        "  'empty': obj.empty.shape, 'u8': type(obj.nested['layers'][1]).__name__,\n"
        "  'generator': generator()}))\n"
    )
    code = code.replace(
        "obj = pickle",
        "def generator():\n"
        "    try:\n"
        "        return repr(pickle.loads(open('generator.pkl', 'rb').read()).args[0]['rng'].integers(1000))\n"
        "    except pickle.UnpicklingError as exc:\n"
        "        return str(exc)\n"
        "obj = pickle",
    )
    done = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["w"] == original.w.tolist() and report["same"]
    assert report["bias"] == ["float64", 0.5] and report["table"] == ["a", "b"]
    assert report["kind"] == str(original.kind) and report["text"] == ["ab", "wörld"]
    assert report["objects"] == "[b'x', None, [1, 2]]" and report["stamp"] == "2024-01-02"
    assert report["empty"] == [0, 3] and report["u8"] == "uint8"
    # A random generator has no portable form: the same numpy major rebuilds it, another names it.
    if report["numpy"].split(".")[0] == np.__version__.split(".")[0]:
        assert report["generator"] == repr(np.random.default_rng(1).integers(1000))
    else:
        assert report["generator"].startswith("callable.args[0]['rng'] (a numpy.random._generator.Generator)")
        assert "instance_kind='process'" in report["generator"]


def test_dtypes_descr_cannot_rebuild_are_guarded_and_a_memmap_travels_as_its_contents(tmp_path):
    aligned = np.dtype([("a", "u1"), ("b", "<f8")], align=True)
    overlapping = np.dtype({"names": ["a", "b"], "formats": ["<i4", "<i4"], "offsets": [0, 0]})
    for dtype in (aligned, overlapping, np.dtype(("<f4", (2,)))):
        assert _portable_pickle.reduce(dtype) is NotImplemented  # no exact portable form: guarded
        data = _dump(functools.partial(_identity, dtype))
        assert b"_guarded" in data and pickle.loads(data).args[0] == dtype
    table = np.zeros(2, aligned)
    table["b"] = [1.5, 2.0]
    assert pickle.loads(_dump(functools.partial(_identity, table))).args[0]["b"].tolist() == [1.5, 2.0]
    mapped = np.memmap(tmp_path / "weights.bin", dtype=np.float32, mode="w+", shape=(3,))
    mapped[:] = [1, 2, 3]
    loaded = pickle.loads(_dump(functools.partial(_identity, mapped))).args[0]
    assert type(loaded) is np.ndarray and loaded.tolist() == [1, 2, 3]
