"""Which sequence requests a sequence model admits (docs/sequences.md, "Sequence ids and who may use them").

A model bound with ``SequenceBatcher(string_ids=False)`` (the default) declares its ids as unsigned
64-bit integers (Triton's CORRID control, ``TYPE_UINT64``). Triton 2.51 nevertheless accepts a string
``sequence_id`` for such a model (HTTP ``parameters: {"sequence_id": "abc"}``, gRPC's string id) and
hands it to the backend as a string, so the callable would get a ``str`` it was promised never to
see. The stub refuses such a request with the text built here, answered with Triton's INVALID_ARG
code (HTTP 400, gRPC ``INVALID_ARGUMENT``); the callable never sees it.

``OpenSequences`` bounds the sequences one instance has open (``SequenceBatcher.max_open_sequences``).
``SequenceOwners`` lets only the caller that started a sequence use it (``SequenceBatcher.owner_header``);
its refusals start like the id refusals and are answered with INVALID_ARG too.

Runs in the stub: standard library only (tests/unit/test_stub_package.py).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Dict, Mapping, Optional, Tuple, TypeVar, Union

# Every refusal starts so; the stub answers texts that do with the INVALID_ARG code (``is_refusal``).
_PREFIX = "pytriton: sequence id "
# Every refusal for the bound starts so; answered with the UNAVAILABLE code (``is_bound``).
_BOUND_PREFIX = "pytriton: too many open sequences: "

# The model's configuration as Triton hands it to the stub (``args["model_config"]``, parsed JSON).
ConfigJson = Mapping[str, Any]

SequenceKey = Union[int, str]
_V = TypeVar("_V")  # the value type of a table or parameters mapping, kept as it is


def integer_ids(config: ConfigJson) -> bool:
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


# How long Triton keeps an idle sequence when max_sequence_idle_microseconds is 0 (its default, 1 s).
_TRITON_DEFAULT_IDLE_S = 1.0


def idle_s(config: ConfigJson) -> float:
    """The model's idle timeout in seconds, as Triton applies it (0 in the config: Triton's 1 s)."""
    micros = int((config.get("sequence_batching") or {}).get("max_sequence_idle_microseconds", 0) or 0)
    return micros / 1e6 if micros > 0 else _TRITON_DEFAULT_IDLE_S


def open_limit(config: ConfigJson, limit: int) -> int:
    """The bound the stub keeps: ``limit`` for the oldest strategy, 0 (none) for the direct one.

    Direct: Triton's slots already bound an instance's open sequences (``max_batch_size``), and a
    start that waited in Triton's backlog is ended by Triton right after it runs (its idle time counts
    from its arrival), which the stub cannot see, so a count here would run ahead of Triton's and
    refuse good starts after a flood.
    """
    return limit if "oldest" in (config.get("sequence_batching") or {}) else 0


class OpenSequences:
    """The sequences one instance has started and not yet ended, bounded (``SequenceBatcher.max_open_sequences``).

    A start beyond ``limit`` open sequences is refused (``admit`` returns the error text), and so are
    the later requests of that refused sequence, so its state is never created in the callable;
    requests of sequences already open are always admitted. A sequence stops counting at its end, or
    once no request of it came for the model's idle timeout (Triton ends it then too, without telling
    the backend). Memory: at most ``limit`` open ids and ``limit`` remembered refusals, each dropped
    after the idle timeout. ``limit`` 0 admits everything and keeps nothing.

    Counted per instance (stub), for the oldest strategy only (``open_limit``): with several instances
    a sequence whose end reaches another instance counts on the instance that saw its start until it
    is idle there. Starts that waited in Triton's backlog (more sequences than
    ``max_candidate_sequences``) are ended by Triton soon after they run, which the stub cannot see:
    they count until idle here, so keep ``max_candidate_sequences`` at least the bound.
    """

    def __init__(self, limit: int, idle_s: float, model: str) -> None:
        self._limit = limit
        self._idle_s = idle_s
        self._model = model
        # id -> last time a request of it was seen; insertion order is last-use order (moved on use).
        self._open: Dict[SequenceKey, float] = {}
        self._refused: Dict[SequenceKey, float] = {}

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, sequence_id: SequenceKey, start: bool, end: bool, now: float) -> Optional[str]:
        """None to let this request through, or the error text that refuses it (``is_bound`` is true for it)."""
        if not self._limit:
            return None
        self._expire(now)
        if start:
            self._refused.pop(sequence_id, None)  # a new start gets a new chance
            if sequence_id not in self._open and len(self._open) >= self._limit:
                if not end:  # a one-request sequence leaves nothing open to refuse later
                    self._refused[sequence_id] = now
                    _trim(self._refused, self._limit)
                return self._bound_text()
        elif sequence_id in self._refused:  # a later request of a refused sequence: refused too
            del self._refused[sequence_id]
            if not end:
                self._refused[sequence_id] = now
            return self._bound_text()
        self._open.pop(sequence_id, None)
        if not end:
            self._open[sequence_id] = now
        return None

    def _expire(self, now: float) -> None:
        for table in (self._open, self._refused):
            while table:
                oldest = next(iter(table))
                if now - table[oldest] < self._idle_s:
                    break
                del table[oldest]

    def _bound_text(self) -> str:
        return (
            f"{_BOUND_PREFIX}model {self._model!r} has {len(self._open)} open sequences on this instance, its limit "
            f"(SequenceBatcher.max_open_sequences={self._limit}): end sequences with sequence_end=True on their "
            "last request, wait for idle ones to expire (max_sequence_idle_microseconds), or raise the limit"
        )


def _trim(table: Dict[SequenceKey, _V], size: int) -> None:
    while len(table) > size:
        del table[next(iter(table))]


def is_bound(text: str) -> bool:
    """Whether an error text is a refusal by ``OpenSequences`` (answered as UNAVAILABLE: retry later)."""
    return text.startswith(_BOUND_PREFIX)


# How many owners one instance remembers at most; beyond it the least recently used are forgotten
# (their sequences' later requests are then refused as unowned: start them again).
MAX_OWNERS = 65536


def credential(parameters: Optional[Dict[str, _V]], header: str) -> Tuple[Optional[str], Optional[Dict[str, _V]]]:
    """The caller's credential for ``SequenceBatcher.owner_header`` and the parameters without it.

    Triton forwards a header that the server's ``--http/grpc-header-forward-pattern`` matches as a
    request parameter of that name (HTTP keeps the client's spelling, ``Authorization``; gRPC metadata
    is lower case). Names are compared without case. The credential is taken out of the parameters,
    so the callable never sees it. ``(None, ...)`` when the request carries none; a request carrying
    two different values (a header and a body parameter spelt differently) gets ``""``, which is
    refused like a missing one.
    """
    if not parameters:
        return None, parameters
    values = {str(value) for key, value in parameters.items() if key.lower() == header}
    if not values:
        return None, parameters
    kept = {key: value for key, value in parameters.items() if key.lower() != header}
    return (values.pop() if len(values) == 1 else ""), (kept or None)


class SequenceOwners:
    """Who started each open sequence of one instance (``SequenceBatcher.owner_header``), by credential digest.

    ``check`` records the SHA-256 digest of the credential that starts a sequence (the credential
    itself is not kept) and refuses any later request of it, its end and a new start of the same id
    included, that carries another credential, or none; a request that is not a start of a sequence
    this instance has no owner for is refused too. So a caller can only continue, end or restart the
    sequences it started; other callers' sequences go on unaffected. A sequence's owner is forgotten
    once no request of it came for the model's idle timeout (Triton has ended it then), or beyond
    ``MAX_OWNERS`` (the least recently used); after its end any caller may start the id anew. ``check``
    is idempotent (the stub repeats it for the rest of a partly refused batch).

    What it cannot stop: Triton's batcher acts on a request's END flag before any backend sees the
    request, so a stranger's refused end still ends the sequence in Triton (its owner's next request
    then needs a new start); the state in the callable is never touched by a stranger. Memory: at most ``MAX_OWNERS`` (id, digest, time) entries.
    Per instance: sound where a sequence stays on one instance (``DIRECT``; ``OLDEST`` with one
    instance, which ``bind`` requires).
    """

    def __init__(self, header: str, idle_s: float, model: str) -> None:
        self.header = header
        self._idle_s = idle_s
        self._model = model
        # id -> (digest, last use, ended); insertion order is last-use order (moved on use).
        self._owners: Dict[SequenceKey, Tuple[bytes, float, bool]] = {}
        self.refused = 0  # refusals so far (the stub logs them, rate-limited)

    def __len__(self) -> int:
        return len(self._owners)

    def check(
        self, sequence_id: SequenceKey, start: bool, end: bool, credential: Optional[str], now: float
    ) -> Optional[str]:
        """None to let this request through (and note its owner), or the error text that refuses it."""
        self._expire(now)
        if not credential:
            return self._refuse(
                f"{_PREFIX}{_shown(sequence_id)} of model {self._model!r}: the request carries no "
                f"{self.header!r} credential (or two different ones); this model lets only the caller that started a "
                f"sequence use it (SequenceBatcher.owner_header={self.header!r}): send that header, and let the "
                "server forward it (TritonConfig http_header_forward_pattern and grpc_header_forward_pattern)"
            )
        digest = hashlib.sha256(credential.encode("utf-8", "surrogatepass")).digest()
        owner = self._owners.get(sequence_id)
        if owner is not None and owner[2] and start:  # an ended sequence's id is free for a new start
            owner = None
        if owner is not None and not hmac.compare_digest(owner[0], digest):
            return self._refuse(
                f"{_PREFIX}{_shown(sequence_id)} of model {self._model!r} was started by another caller "
                f"(another {self.header!r} credential); only its owner may continue, end or restart it: "
                "use an id of your own"
            )
        if owner is None and not start:
            return self._refuse(
                f"{_PREFIX}{_shown(sequence_id)} of model {self._model!r} has no owner on this instance (it was "
                "never started, has ended, or was idle past max_sequence_idle_microseconds): start it with "
                "sequence_start=True"
            )
        # Kept past the sequence's end (marked ended) until idle: the stub repeats a check when it runs
        # the rest of a batch after refusing some of it; a new start takes the id over at once.
        self._owners.pop(sequence_id, None)
        self._owners[sequence_id] = (digest, now, end or bool(owner is not None and owner[2]))
        _trim(self._owners, MAX_OWNERS)
        return None

    def _refuse(self, text: str) -> str:
        self.refused += 1
        return text

    def _expire(self, now: float) -> None:
        while self._owners:
            oldest = next(iter(self._owners))
            if now - self._owners[oldest][1] < self._idle_s:
                break
            del self._owners[oldest]


def _shown(sequence_id: SequenceKey) -> str:
    text = repr(sequence_id)
    return text if len(text) <= 66 else text[:64] + "..."
