"""Pins the exception hierarchy: every public class, its direct bases, ``.message`` and ``str()``.

Changing a base here changes what existing ``except`` clauses catch: it must be a deliberate change
(see docs/configuration.md and docs/clients.md, "Errors").
"""

import pickle

import pytest

import pytriton.client.exceptions as client_exceptions
import pytriton.exceptions as exceptions
from pytriton._errors import PyTritonBaseError

# Every public class of both modules and its direct bases, in order (the MRO follows from them).
SERVING_BASES = {
    "PyTritonError": ("PyTritonBaseError",),
    "PyTritonValidationError": ("PyTritonError",),
    "PyTritonInvalidOperationError": ("PyTritonError",),
    "PyTritonModelAlreadyBoundError": ("PyTritonInvalidOperationError", "PyTritonValidationError"),
    "PyTritonBadParameterError": ("PyTritonError",),
    "PyTritonModelConfigError": ("PyTritonError",),
    "PyTritonUnrecoverableError": ("PyTritonError",),
    "PyTritonRuntimeError": ("PyTritonError",),
    "PyTritonServerError": ("PyTritonError",),
    "PyTritonServerNotInstalledError": ("PyTritonError",),
}
CLIENT_BASES = {
    "PyTritonClientError": ("PyTritonBaseError",),
    "PyTritonClientValueError": ("PyTritonClientError",),
    "PyTritonClientInvalidUrlError": ("PyTritonClientValueError",),
    "PyTritonClientInferenceServerError": ("PyTritonClientError",),
    "PyTritonClientPermissionError": ("PyTritonClientInferenceServerError",),
    "PyTritonClientModelDoesntSupportBatchingError": ("PyTritonClientError",),
    "PyTritonClientTimeoutError": ("PyTritonClientError",),
    "PyTritonClientModelUnavailableError": ("PyTritonClientError",),
    "PyTritonClientClosedError": ("PyTritonClientError",),
    "PyTritonClientQueueFullError": ("PyTritonClientError",),
    "PyTritonClientRuntimeError": ("PyTritonClientError",),
}
ALL_CLASSES = [getattr(exceptions, name) for name in SERVING_BASES] + [
    getattr(client_exceptions, name) for name in CLIENT_BASES
]


def test_the_pinned_classes_are_the_public_ones():
    assert set(exceptions.__all__) == set(SERVING_BASES)
    # The one alias is the only public name of the client module without its own class.
    assert set(client_exceptions.__all__) == set(CLIENT_BASES) | {"PyTritonClientUrlParseError"}


@pytest.mark.parametrize(
    ("module", "name", "bases"),
    [(exceptions, name, bases) for name, bases in SERVING_BASES.items()]
    + [(client_exceptions, name, bases) for name, bases in CLIENT_BASES.items()],
)
def test_direct_bases(module, name, bases):
    cls = getattr(module, name)
    assert cls.__module__ == module.__name__
    assert tuple(base.__name__ for base in cls.__bases__) == bases


def test_one_shared_base_and_two_separate_hierarchies():
    assert PyTritonBaseError.__bases__ == (Exception,)
    for cls in ALL_CLASSES:
        assert issubclass(cls, PyTritonBaseError)
        assert not issubclass(cls, (ValueError, RuntimeError, TimeoutError)), cls  # no builtin relation
    # `except PyTritonError` does not catch client errors, and the other way round.
    for name in CLIENT_BASES:
        assert not issubclass(getattr(client_exceptions, name), exceptions.PyTritonError)
    for name in SERVING_BASES:
        assert not issubclass(getattr(exceptions, name), client_exceptions.PyTritonClientError)


def test_relations_user_code_relies_on():
    e, c = exceptions, client_exceptions
    assert issubclass(e.PyTritonModelAlreadyBoundError, e.PyTritonInvalidOperationError)
    assert issubclass(e.PyTritonModelAlreadyBoundError, e.PyTritonValidationError)
    assert issubclass(c.PyTritonClientInvalidUrlError, c.PyTritonClientValueError)
    assert c.PyTritonClientUrlParseError is c.PyTritonClientInvalidUrlError
    for name in SERVING_BASES:
        assert issubclass(getattr(e, name), e.PyTritonError)
    for name in CLIENT_BASES:
        assert issubclass(getattr(c, name), c.PyTritonClientError)


def test_the_installer_error_is_a_not_installed_error():
    from pytriton.server.install import InstallError

    assert issubclass(InstallError, exceptions.PyTritonServerNotInstalledError)


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda cls: cls.__name__)
def test_message_str_repr_and_pickle(cls):
    error = cls("model 'add' is not ready")
    assert error.message == "model 'add' is not ready"
    assert str(error) == "model 'add' is not ready"
    assert error.args == ("model 'add' is not ready",)
    assert repr(error) == f"{cls.__name__}(\"model 'add' is not ready\")"
    with pytest.raises(AttributeError):
        error.message = "changed"  # read-only
    copy = pickle.loads(pickle.dumps(error))  # errors cross process boundaries (e.g. multiprocessing)
    assert type(copy) is cls
    assert copy.message == error.message
    assert str(copy) == str(error)


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda cls: cls.__name__)
def test_message_is_required(cls):
    with pytest.raises(TypeError):
        cls()


def test_raised_and_caught_through_each_base():
    with pytest.raises(exceptions.PyTritonValidationError) as info:
        raise exceptions.PyTritonModelAlreadyBoundError("Model 'm' version 1 is already bound")
    assert info.value.message == "Model 'm' version 1 is already bound"
    with pytest.raises(client_exceptions.PyTritonClientValueError, match="port"):
        raise client_exceptions.PyTritonClientUrlParseError("bad port")
    with pytest.raises(PyTritonBaseError):
        raise client_exceptions.PyTritonClientTimeoutError("timed out")
