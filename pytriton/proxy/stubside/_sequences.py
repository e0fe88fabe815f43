"""Which sequence ids a sequence model accepts (docs/sequences.md, "Sequence ids and who may use them").

A model bound with ``SequenceBatcher(string_ids=False)`` (the default) declares its ids as unsigned
64-bit integers (Triton's CORRID control, ``TYPE_UINT64``). Triton 2.51 nevertheless accepts a string
``sequence_id`` for such a model (HTTP ``parameters: {"sequence_id": "abc"}``, gRPC's string id) and
hands it to the backend as a string, so the callable would get a ``str`` it was promised never to
see. The stub refuses such a request with the text built here, answered with Triton's INVALID_ARG
code (HTTP 400, gRPC ``INVALID_ARGUMENT``); the callable never sees it.

Runs in the stub: standard library only (tests/unit/test_stub_package.py).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

# Every refusal starts so; the stub answers texts that do with the INVALID_ARG code (``is_refusal``).
_PREFIX = "pytriton: sequence id "


def integer_ids(config: Mapping[str, Any]) -> bool:
    """Whether the model's config (Triton's JSON form) declares integer ids only.

    True when ``sequence_batching`` holds a CORRID control of type ``TYPE_UINT64``, which pytriton's
    generator writes exactly for ``string_ids=False``; False for ``string_ids=True`` (no CORRID
    control) and for a model without a sequence batcher.
    """
    batching = config.get("sequence_batching") or {}
    return any(
        control.get("kind") == "CONTROL_SEQUENCE_CORRID" and control.get("data_type") == "TYPE_UINT64"
        for entry in batching.get("control_input", [])
        for control in entry.get("control", [])
    )


def refusal(sequence_id: Union[int, str], integer_only: bool, model: str) -> Optional[str]:
    """The error text that answers a request with this id, or None when the id is acceptable."""
    if integer_only and isinstance(sequence_id, str):
        shown = sequence_id if len(sequence_id) <= 64 else sequence_id[:64] + "..."
        return (
            f"{_PREFIX}{shown!r} is a string, but model {model!r} takes unsigned 64-bit integer sequence ids; "
            "send an integer sequence_id, or bind the model with SequenceBatcher(string_ids=True)"
        )
    return None


def is_refusal(text: str) -> bool:
    """Whether an error text is one of this module's refusals (answered as INVALID_ARG: the client's fault)."""
    return text.startswith(_PREFIX)
