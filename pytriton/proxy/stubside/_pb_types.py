"""The shapes of the Python backend's objects that the stub side calls (``triton_python_backend_utils``).

``triton_python_backend_utils`` exists only inside Triton's stub process and has no type stubs, so
mypy sees its classes as untyped. These Protocols name the methods this package calls on the
objects Triton hands it (requests, their input tensors, response senders, traces, metric series)
and the module functions it replaces or calls (the BYTES codec, ``Tensor``), as Triton 2.51's
Python backend defines them. They are for the type checker only and cost nothing at run time (not
``runtime_checkable``: nothing is checked with isinstance). Responses and output tensors the package
builds itself with ``pb_utils`` and only hands back to Triton: those stay ``object``.

Imports: the standard library, and numpy's typing names for the type checker alone.

Unit tests: tests/unit/test_stub.py (the stub is driven there with fakes of these objects).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Collection, List, Optional, Protocol, Tuple

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


class PbTensor(Protocol):
    """An input tensor of a request (``pb_utils.Tensor``)."""

    def name(self) -> str: ...

    def as_numpy(self) -> npt.NDArray[np.generic]: ...

    def to_dlpack(self) -> object: ...

    def __dlpack_device__(self) -> Tuple[int, int]: ...


class PbTrace(Protocol):
    """A request's trace (``request.trace()``): its context is a JSON string, or None when not traced."""

    def get_context(self) -> Optional[str]: ...


class PbResponseSender(Protocol):
    """The sender of a decoupled request's responses (``request.get_response_sender()``)."""

    def send(self, response: object = None, flags: int = 0) -> None: ...

    def is_cancelled(self) -> bool: ...


class PbRequest(Protocol):
    """One inference request as the Python backend's ``execute`` receives it (``pb_utils.InferenceRequest``)."""

    def inputs(self) -> List[PbTensor]: ...

    def parameters(self) -> str: ...

    def timeout(self) -> int: ...

    def requested_output_names(self) -> Optional[Collection[str]]: ...

    def correlation_id(self) -> object: ...

    def get_response_sender(self) -> PbResponseSender: ...

    def is_cancelled(self) -> bool: ...

    def trace(self) -> PbTrace: ...


class PbBytesCodec(Protocol):
    """The module functions through which the stub (de)serialises BYTES tensors (replaced by ``_stub_bytes``).

    An input arrives in ``deserialize_bytes_tensor`` as a uint8 array holding the serialized tensor.
    """

    serialize_byte_tensor: Callable[[object], object]
    deserialize_bytes_tensor: Callable[[npt.NDArray[np.uint8]], object]


class PbTensorFactory(Protocol):
    """The module's ``Tensor`` constructor: ``Tensor(name, array)`` builds an output tensor."""

    Tensor: Callable[[str, npt.NDArray[np.generic]], object]


class PbDLPackTensor(Protocol):
    """The module's ``Tensor`` class, for ``Tensor.from_dlpack(name, capsule)`` (an output tensor)."""

    def from_dlpack(self, name: str, capsule: object) -> object: ...


class PbDLPackFactory(Protocol):
    """The module, for the ``Tensor`` class (``_stub_dlpack``)."""

    Tensor: PbDLPackTensor


class PbMetric(Protocol):
    """One series of a custom metric family (``pb_utils.MetricFamily(...).Metric(labels=...)``)."""

    def set(self, value: float) -> None: ...

    def increment(self, value: float) -> None: ...
