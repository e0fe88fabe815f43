"""The context ``Triton.bind`` attaches to the callables it binds, so decorators can find their model configuration.

It lives here, below :mod:`pytriton.decorators` (which reads it) and beside the proxy's worker process (which
attaches its own copy in the child), so that neither imports the other or anything above them.

Unit tests: tests/unit/test_decorators.py (lookups through decorator layers), tests/unit/test_process.py (the
worker process's copy).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Callable, Dict, Iterator

from pytriton.model_config.triton_model_config import TritonModelConfig

LOGGER = logging.getLogger(__name__)

CONTEXT_ATTRIBUTE = "__triton_context__"  # where a bound callable (or its instance) carries the context


def _config_key(infer_callable: object) -> object:
    """Identity of a callable that is the same through every decorator layer and method binding."""
    target = infer_callable
    for _ in range(100):  # bounded: decorator stacks are shallow
        inner = getattr(target, "__wrapped__", None)
        if inner is None:
            break
        target = inner
    owner = getattr(target, "__self__", None)
    function = getattr(target, "__func__", None)
    if owner is not None and function is not None:
        return (id(owner), id(function))
    return id(target)


class ModelConfigDict(MutableMapping[Any, TritonModelConfig]):
    """Model configurations keyed by inference callable.

    Lookups see through decorators and bound methods: ``d[decorated]``, ``d[inner]`` and
    ``d[obj.method]`` find the config stored for the callable that was bound.
    """

    def __init__(self) -> None:
        self._data: Dict[object, TritonModelConfig] = {}
        self._callables: Dict[object, Callable[..., object]] = {}

    def __getitem__(self, infer_callable: Callable[..., object]) -> TritonModelConfig:
        return self._data[_config_key(infer_callable)]

    def __setitem__(self, infer_callable: Callable[..., object], config: TritonModelConfig) -> None:
        key = _config_key(infer_callable)
        self._data[key] = config
        self._callables[key] = infer_callable

    def __delitem__(self, infer_callable: Callable[..., object]) -> None:
        key = _config_key(infer_callable)
        del self._data[key]
        del self._callables[key]

    def __iter__(self) -> Iterator[Callable[..., Any]]:
        return iter(list(self._callables.values()))

    def __len__(self) -> int:
        return len(self._data)


@dataclasses.dataclass
class TritonContext:
    """What ``Triton.bind`` shares with the callables it binds: their model configurations."""

    model_configs: ModelConfigDict = dataclasses.field(default_factory=ModelConfigDict)


def attach_context(func: Callable[..., object], context: TritonContext, config: TritonModelConfig) -> None:
    """Record ``config`` for ``func`` in ``context`` and attach the context to ``func`` (or the instance of a method).

    A callable that takes no attributes keeps working; only decorators that read its config then fail (logged).
    """
    context.model_configs[func] = config
    owner = getattr(func, "__self__", None)
    target = owner if owner is not None and not isinstance(owner, type(sys)) else func
    try:
        setattr(target, CONTEXT_ATTRIBUTE, context)
    except (AttributeError, TypeError):
        LOGGER.debug("Cannot attach the Triton context to %r; decorators needing it will fail.", func)
