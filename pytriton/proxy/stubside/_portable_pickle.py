"""numpy objects pickled in a form every numpy major version reads: a backend callable's state crosses to the stub.

Why: a callable bound with ``instance_kind="backend"`` is pickled in the user's process and
unpickled in the server's stub, whose numpy may be another major version (pytriton's private
numpy 1.x environment while the user runs numpy 2, Python 3.9-3.12). numpy pickles an array, a
numpy scalar or a structured dtype through its private modules (``numpy._core.multiarray`` in 2.x,
``numpy.core.multiarray`` in 1.x), so a class holding weights made in ``__init__`` failed in the
stub with ``ModuleNotFoundError: No module named 'numpy._core.numeric'``.

How: :func:`reduce` turns

- an array (exactly ``numpy.ndarray``) into ``_array(dtype, shape, raw bytes)`` (C order), or, for
  an ``object`` array, ``_object_array(shape, items)`` whose items are pickled as any object;
- a numpy scalar into ``_scalar(dtype, raw bytes)``, a dtype into ``_dtype(description)``,

where the dtype travels as its ``str`` (``'<f4'``) or, for structured and sub-array dtypes, its
``descr`` list: both majors build the same dtype from either. These functions live here, in a module
of pytriton that both processes import by this name (the stub imports pytriton from the user's
environment, ``stubside/_inline.py``), and they use only numpy's public API.

Any other numpy object (an ``ndarray`` subclass such as ``numpy.matrix``, a masked array, a random
generator) is pickled whole into a nested pickle by :func:`guard`, labelled with where it sits in
the callable (``callable.rng``, found by :func:`find_path`). Unpickled by the same numpy major it
simply loads; by another one that cannot read it, :func:`_guarded` raises an ``UnpicklingError``
naming that attribute and what to do, instead of numpy's bare ``ModuleNotFoundError``.

Used by ``pytriton.proxy._backend_kind`` (the pickler of backend callables and of the payload).
This module may import only the standard library and numpy (tests/unit/test_stub_package.py).

Unit tests: tests/unit/test_portable_pickle.py.
"""

from __future__ import annotations

import collections
import functools
import io
import pickle
import types
from typing import IO, Any, Callable, Deque, Dict, List, Optional, Set, Tuple, Union

import numpy as np

DtypeSpec = Union[str, List[Any]]
_PATH_SEARCH_LIMIT = 200_000  # objects visited at most while naming where an object sits (find_path)


def _dtype_spec(dtype: np.dtype) -> Optional[DtypeSpec]:  # type: ignore[type-arg]
    """What rebuilds ``dtype`` under either numpy major: ``'<f4'``, or the ``descr`` of a structured dtype.

    None when neither rebuilds it exactly (a sub-array dtype on its own, overlapping fields).
    """
    if dtype.fields is None and dtype.subdtype is None:
        return str(dtype.str)
    if dtype.fields is None:
        return None
    try:
        spec: DtypeSpec = [list(item) for item in dtype.descr]
        return spec if _make_dtype(spec) == dtype else None
    except (TypeError, ValueError):  # descr refuses overlapping or out-of-order fields
        return None


def _make_dtype(spec: DtypeSpec) -> np.dtype:  # type: ignore[type-arg]
    if isinstance(spec, str):
        return np.dtype(spec)
    return np.dtype([tuple(item) for item in spec])


def _array(spec: DtypeSpec, shape: Tuple[int, ...], data: bytes) -> np.ndarray:  # type: ignore[type-arg]
    """An array from :func:`reduce` (writable, C order, owning a copy of ``data``)."""
    dtype = _make_dtype(spec)
    array = np.empty(shape, dtype=dtype)
    if array.nbytes:
        array.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
    return array


def _object_array(shape: Tuple[int, ...], items: List[object]) -> np.ndarray:  # type: ignore[type-arg]
    """An ``object`` array from :func:`reduce`: ``items`` in C order."""
    array = np.empty(len(items), dtype=object)
    for index, item in enumerate(items):  # not array[:] = items: a list item would become a dimension
        array[index] = item
    return array.reshape(shape)


def _scalar(spec: DtypeSpec, data: bytes) -> np.generic:
    """A numpy scalar from :func:`reduce`."""
    value: np.generic = np.frombuffer(data, dtype=_make_dtype(spec))[0]
    return value


def _dtype(spec: DtypeSpec) -> np.dtype:  # type: ignore[type-arg]
    return _make_dtype(spec)


def reduce(obj: object) -> object:
    """pickle's reduce value for an array, numpy scalar or dtype in the portable form, else ``NotImplemented``.

    For ``Pickler.reducer_override``. A ``numpy.memmap`` travels as a plain array of its contents.
    What has no such form (a structured dtype with object fields, a dtype ``descr`` does not rebuild)
    is left to :func:`guard`.
    """
    kind = type(obj)
    if kind is np.ndarray or kind is np.memmap:
        array: np.ndarray = obj  # type: ignore[type-arg,assignment]
        if array.dtype.kind == "O":
            return _object_array, (tuple(array.shape), list(array.reshape(-1)))  # reshape(-1): C order
        spec = None if array.dtype.hasobject else _dtype_spec(array.dtype)
        if spec is None:
            return NotImplemented
        return _array, (spec, tuple(array.shape), np.ascontiguousarray(array).tobytes())
    if isinstance(obj, np.generic) and not obj.dtype.hasobject:
        spec = _dtype_spec(obj.dtype)
        return NotImplemented if spec is None else (_scalar, (spec, obj.tobytes()))
    if isinstance(obj, np.dtype) and not obj.hasobject:
        spec = _dtype_spec(obj)
        return NotImplemented if spec is None else (_dtype, (spec,))
    return NotImplemented


def needs_guard(obj: object) -> bool:
    """Whether ``obj`` is another numpy object that may not unpickle under another numpy major (see :func:`guard`).

    Classes, functions, modules and ufuncs pickle by their public name and are left alone.
    """
    module = getattr(type(obj), "__module__", None) or ""
    if module != "numpy" and not module.startswith("numpy."):
        return False
    return not isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType, np.ufunc))


def guard(obj: object, where: str, dump: Callable[[object], bytes]) -> object:
    """pickle's reduce value that loads ``obj`` from the nested pickle ``dump(obj)``, labelled ``where``."""
    return _guarded, (where, f"{type(obj).__module__}.{type(obj).__qualname__}", np.__version__, dump(obj))


def _guarded(where: str, type_name: str, numpy_version: str, data: bytes) -> object:
    """Load an object :func:`guard` pickled; if this numpy cannot, say which attribute it is and what to do."""
    try:
        return pickle.loads(data)
    except Exception as exc:  # noqa: BLE001 - whatever numpy raises, the fix is the same
        raise pickle.UnpicklingError(
            f"{where} (a {type_name}) was pickled with numpy {numpy_version} and cannot be rebuilt with this "
            f"process's numpy {np.__version__} ({type(exc).__name__}: {exc}). Keep plain numpy arrays, numbers or "
            "lists in that attribute and build the object from them on the first call, or bind the model with "
            "instance_kind='process' (its worker runs your numpy)."
        ) from None


def find_path(root: object, target: object, root_name: str = "callable") -> Optional[str]:
    """Where ``target`` sits inside ``root`` (``callable.layers[2].rng``), searching breadth-first; None if not found.

    Follows instance attributes (``__dict__`` and ``__slots__``), list/tuple/set items, dict values,
    and the functions and objects behind bound methods, ``functools.partial`` and closures; visits at
    most ``_PATH_SEARCH_LIMIT`` objects.
    """
    queue: Deque[Tuple[object, str]] = collections.deque([(root, root_name)])
    seen: Set[int] = {id(root)}
    while queue and len(seen) < _PATH_SEARCH_LIMIT:
        current, path = queue.popleft()
        if current is target:
            return path
        for child, child_path in _children(current, path):
            if id(child) not in seen:
                seen.add(id(child))
                queue.append((child, child_path))
    return None


def _children(obj: object, path: str) -> List[Tuple[object, str]]:
    if isinstance(obj, (str, bytes, bytearray, int, float, complex, type(None), np.ndarray, type, types.ModuleType)):
        return []
    if isinstance(obj, dict):
        return [(value, f"{path}[{key!r}]") for key, value in obj.items()]
    if isinstance(obj, (list, tuple)):
        return [(value, f"{path}[{index}]") for index, value in enumerate(obj)]
    if isinstance(obj, (set, frozenset)):
        return [(value, f"{path}{{...}}") for value in obj]
    if isinstance(obj, types.MethodType):
        return [(obj.__self__, f"{path}.__self__")]
    if isinstance(obj, functools.partial):
        return [(obj.func, f"{path}.func"), (obj.args, f"{path}.args"), (obj.keywords, f"{path}.keywords")]
    found: List[Tuple[object, str]] = []
    if isinstance(obj, types.FunctionType):
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
            try:
                found.append((cell.cell_contents, f"{path}.<closure {name}>"))
            except ValueError:  # an empty cell
                continue
        return found
    try:
        wrapped = object.__getattribute__(obj, "__wrapped__")  # decorators (wrapt proxies answer for the target)
    except AttributeError:
        wrapped = None
    if wrapped is not None:
        found.append((wrapped, f"{path}.__wrapped__"))
    attributes: Dict[str, object] = dict(getattr(obj, "__dict__", None) or {})
    for klass in type(obj).__mro__:
        slots = getattr(klass, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in attributes and hasattr(obj, name):
                attributes[name] = getattr(obj, name)
    found.extend((value, f"{path}.{name}") for name, value in attributes.items())
    return found


class PortablePickler(pickle.Pickler):
    """A pickler whose numpy objects cross numpy major versions (:func:`reduce`, :func:`guard`).

    ``base_override``: the reduction to try after :func:`reduce` and before :func:`guard` (a
    subclass's own ``reducer_override``, for example the callable pickler's). ``root``: the object
    whose attributes :func:`find_path` searches to name a guarded object (set by :meth:`dump`).
    """

    def __init__(self, file: IO[bytes], protocol: int = pickle.HIGHEST_PROTOCOL) -> None:
        super().__init__(file, protocol=protocol)
        self._protocol = protocol
        self.root: Optional[object] = None
        self._guarding: Optional[object] = None

    def dump(self, obj: object) -> None:
        if self.root is None:
            self.root = obj
        super().dump(obj)

    def base_override(self, obj: object) -> object:
        return NotImplemented

    def reducer_override(self, obj: object) -> Any:
        reduced = reduce(obj)
        if reduced is NotImplemented:
            reduced = self.base_override(obj)
        if reduced is NotImplemented and self._guarding is None and needs_guard(obj):
            where = find_path(self.root, obj) if self.root is not None else None
            reduced = guard(obj, where or f"an attribute of the callable ({type(obj).__name__})", self._nested)
        return reduced

    def _nested(self, obj: object) -> bytes:
        buffer = io.BytesIO()
        nested = PortablePickler(buffer, protocol=self._protocol)  # plain: _guarded loads it with pickle.loads
        nested.root, nested._guarding = self.root, obj  # nothing inside is guarded again: one label, the outermost
        nested.dump(obj)
        return buffer.getvalue()
