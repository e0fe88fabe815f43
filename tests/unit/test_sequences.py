"""Sequence models through their seams: the generated config, bind's checks, the stub's control
inputs, the wire entry and the worker's ``Request`` fields, the clients' keyword arguments.

End to end: tests/e2e/test_sequences.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http

from pytriton.client._clients import _sequence
from pytriton.client._core import ClientCore
from pytriton.client._url import parse_url
from pytriton.client.exceptions import PyTritonClientValueError
from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config import DynamicBatcher, ModelConfig, SequenceBatcher, SequenceStrategy, Tensor
from pytriton.model_config.generator import SEQUENCE_CONTROLS, from_dict, to_dict, to_pbtxt
from pytriton.proxy.stubside import _arena, _messages, _sequences, _tensors
from tests.unit.test_binding import _model, context  # noqa: F401 - the fixture
from tests.unit.test_client_core import DRIVERS, FakeServer, _drive
from tests.unit.test_stub import TIMEOUT_S, FakeRequest, _ok, pool, setup, stub  # noqa: F401 - fixtures
from tests.unit.test_worker import make_worker  # noqa: F401 - the fixture


def _controls(raw):
    return {entry["name"]: entry["control"][0] for entry in raw["sequence_batching"]["control_input"]}


def test_direct_strategy_renders_every_control_and_replaces_the_dynamic_batcher(context):  # noqa: F811
    model = _model(
        context, config=ModelConfig(sequence_batcher=SequenceBatcher(max_sequence_idle_microseconds=2_000_000))
    )
    raw = to_dict(model.config)
    assert "dynamic_batching" not in raw
    assert raw["sequence_batching"]["direct"] == {}
    assert raw["sequence_batching"]["max_sequence_idle_microseconds"] == 2_000_000
    controls = _controls(raw)
    assert controls[SEQUENCE_CONTROLS["start"]] == {"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}
    assert controls[SEQUENCE_CONTROLS["ready"]]["kind"] == "CONTROL_SEQUENCE_READY"
    assert controls[SEQUENCE_CONTROLS["corrid"]] == {"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}
    assert [spec.name for spec in model.config.inputs] == ["x"]  # controls are not inputs clients send
    assert model._private["sequence"] == SEQUENCE_CONTROLS
    text = to_pbtxt(model.config)
    assert "sequence_batching {" in text and "kind: CONTROL_SEQUENCE_END" in text
    assert "int32_false_true: [0, 1]" in text and "data_type: TYPE_UINT64" in text
    assert from_dict(raw).sequence_batcher == SequenceBatcher(max_sequence_idle_microseconds=2_000_000)


def test_oldest_strategy_with_string_ids_round_trips(context):  # noqa: F811
    batcher = SequenceBatcher(
        strategy=SequenceStrategy.OLDEST,
        string_ids=True,
        max_candidate_sequences=8,
        max_queue_delay_microseconds=500,
        preferred_batch_size=[2, 4],
    )
    raw = to_dict(_model(context, config=ModelConfig(sequence_batcher=batcher)).config)
    assert raw["sequence_batching"]["oldest"] == {
        "max_candidate_sequences": 8,
        "preferred_batch_size": [2, 4],
        "max_queue_delay_microseconds": 500,
    }
    assert SEQUENCE_CONTROLS["corrid"] not in _controls(raw)  # see the generator: Triton 2.51 and string CORRID
    assert from_dict(raw).sequence_batcher == batcher


@pytest.mark.parametrize(
    "config, match",
    [
        (ModelConfig(sequence_batcher={"strategy": "direct"}), "must be a SequenceBatcher"),
        (ModelConfig(sequence_batcher=SequenceBatcher(strategy="oldest")), "SequenceStrategy.DIRECT"),
        (
            ModelConfig(sequence_batcher=SequenceBatcher(), batcher=DynamicBatcher(max_queue_delay_microseconds=5)),
            "either a dynamic batcher or a sequence batcher",
        ),
        (ModelConfig(sequence_batcher=SequenceBatcher(), decoupled=True), "cannot be decoupled"),
        (
            ModelConfig(sequence_batcher=SequenceBatcher(max_sequence_idle_microseconds=-1)),
            "max_sequence_idle_microseconds must be an int",
        ),
    ],
)
def test_bind_refuses_bad_sequence_settings(context, config, match):  # noqa: F811
    with pytest.raises(PyTritonBadParameterError, match=match):
        _model(context, config=config)


def test_reserved_control_names_cannot_be_declared(context):  # noqa: F811
    with pytest.raises(PyTritonBadParameterError, match="reserved by pytriton"):
        _model(context, inputs=[Tensor(name=SEQUENCE_CONTROLS["start"], shape=(1,), dtype=np.bool_)])


def _sequence_request(value, sequence_id, start=False, end=False, ready=True):
    flags = {"start": start, "end": end, "ready": ready}
    inputs = {"x": np.array([[value]], np.int32)}
    inputs.update({SEQUENCE_CONTROLS[key]: np.array([[int(flag)]], np.int32) for key, flag in flags.items()})
    # Triton fills the UINT64 CORRID control with 0 for a string id (it cannot hold one).
    corrid = 0 if isinstance(sequence_id, str) else sequence_id
    inputs[SEQUENCE_CONTROLS["corrid"]] = np.array([[corrid]], np.uint64)
    return FakeRequest(inputs, correlation_id=sequence_id)


def test_the_stub_turns_controls_into_sequence_fields_and_answers_null_requests(setup, pool):  # noqa: F811
    worker = setup.worker()
    model = setup.model(sequence=SEQUENCE_CONTROLS)
    channel = worker.channel()
    requests = [
        _sequence_request(1, 7, start=True),
        _sequence_request(0, 0, ready=False),  # a null request of the direct strategy
        _sequence_request(3, 8, end=True),
    ]
    future = pool.submit(model.execute, requests)
    message = channel.recv()
    entries = [raw for raw in message.entries]
    assert [entry.sequence for entry in entries] == [(7, True, False), (8, False, True)]
    assert [[meta.name for meta in entry.tensors] for entry in entries] == [["x"], ["x"]]  # controls stay in the stub
    arena = _arena.SharedArena(f"{setup.shm_prefix}-w")
    try:
        channel.send(_ok(arena, [{"y": np.array([[10]], np.int32)}, {"y": np.array([[30]], np.int32)}]))
        responses = future.result(TIMEOUT_S)
    finally:
        arena.close()
    assert [response.error is None for response in responses] == [True, False, True]
    np.testing.assert_array_equal(responses[2].outputs()["y"], [[30]])


@pytest.mark.parametrize("string_ids", [False, True])
def test_the_generated_config_tells_the_stub_whether_ids_are_integers_only(context, string_ids):  # noqa: F811
    raw = to_dict(_model(context, config=ModelConfig(sequence_batcher=SequenceBatcher(string_ids=string_ids))).config)
    assert _sequences.integer_ids(raw) is not string_ids
    assert _sequences.integer_ids(to_dict(_model(context).config)) is False  # no sequence batcher: nothing to check


class _CodedError:
    """Triton's TritonError with its code (the fake utils' error has none)."""

    INVALID_ARG = "INVALID_ARG"

    def __init__(self, message, code=None):
        self._message, self.code = message, code

    def message(self):
        return self._message


@pytest.mark.parametrize("string_ids", [False, True])
def test_a_string_id_is_refused_as_invalid_for_a_model_with_integer_ids(setup, pool, monkeypatch, context, string_ids):  # noqa: F811
    # Before: Triton 2.51 lets a string id through to an integer-id model and the stub handed the str
    # to the callable (HTTP 200). Now it is answered INVALID_ARG (HTTP 400) by the stub while the
    # integer-id requests of the same batch run as usual.
    monkeypatch.setattr(setup.stub.pb_utils, "TritonError", _CodedError)
    worker = setup.worker()
    bound = _model(context, config=ModelConfig(sequence_batcher=SequenceBatcher(string_ids=string_ids)))
    batching = to_dict(bound.config)["sequence_batching"]
    model = setup.model(sequence=SEQUENCE_CONTROLS, config_update={"sequence_batching": batching})
    channel = worker.channel()
    requests = [
        _sequence_request(1, 7, start=True),
        _sequence_request(2, "abc", start=True),
        _sequence_request(3, 8, end=True),
    ]
    future = pool.submit(model.execute, requests)
    message = channel.recv()
    sequences = [entry.sequence for entry in message.entries]
    arena = _arena.SharedArena(f"{setup.shm_prefix}-w")
    try:  # answer whatever reached the worker first, so that a failed check below never leaves execute waiting
        channel.send(_ok(arena, [{"y": np.array([[10 * (n + 1)]], np.int32)} for n in range(len(sequences))]))
        responses = future.result(TIMEOUT_S)
    finally:
        arena.close()
    if string_ids:
        assert sequences == [(7, True, False), ("abc", True, False), (8, False, True)]
    else:
        assert sequences == [(7, True, False), (8, False, True)]  # the string id never reaches the callable
    assert len(responses) == 3
    if string_ids:
        assert all(response.error is None for response in responses)
        return
    assert responses[0].error is None and responses[2].error is None
    np.testing.assert_array_equal(responses[2].outputs()["y"], [[20]])
    error = responses[1].error
    assert error.code == "INVALID_ARG"
    assert "'abc' is a string" in error.message() and "SequenceBatcher(string_ids=True)" in error.message()


def test_refusals_are_recognised_and_long_ids_are_shortened():
    text = _sequences.refusal("x" * 1000, True, "M")
    assert text is not None and _sequences.is_refusal(text) and len(text) < 400
    assert _sequences.refusal(5, True, "M") is None and _sequences.refusal("a", False, "M") is None
    assert not _sequences.is_refusal("pytriton: null request of the sequence batcher")


def test_the_worker_hands_the_sequence_fields_to_the_callable(make_worker):  # noqa: F811
    seen = []

    def func(requests):
        seen.extend((r.sequence_id, r.sequence_start, r.sequence_end, r.timeout_s) for r in requests)
        return [{"y": r["k"]} for r in requests]

    worker, _ = make_worker(func)
    segment, metas = _tensors.write_tensors(None, [[("k", np.array([[1]], np.int32))]] * 3)
    entries = [
        _messages.Entry(metas[0], None, None, (5, True, False)),
        _messages.Entry(metas[1], None, None, ("text-id", False, True), 2.5),
        _messages.Entry(metas[2], None, None),
    ]
    assert entries[2].sequence is None and entries[2].timeout_s == 0.0  # a plain request: the fields stay empty
    reply = worker._infer(_messages.Infer(segment, entries), None)
    assert type(reply) is _messages.Ok
    assert seen == [(5, True, False, None), ("text-id", False, True, 2.5), (None, False, False, None)]


def test_client_sequence_arguments():
    assert _sequence(0, False, False) is None
    assert _sequence(12, True, False) == (12, True, False)
    assert _sequence("abc", 0, 1) == ("abc", False, True)
    with pytest.raises(PyTritonClientValueError, match="need a sequence_id"):
        _sequence(0, True, False)


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_core_sends_the_sequence_and_the_request_timeout(driver):
    server = FakeServer()
    core = ClientCore(parse_url("http://fake:1"), "AddSub", None, 5.0, 2.5)
    a = np.ones(3, np.float32)
    _drive(driver, core.infer((a, a), {}, None, None, False, tritonclient.http, (42, True, False)), server)
    kwargs = server.last_kwargs
    assert (kwargs["sequence_id"], kwargs["sequence_start"], kwargs["sequence_end"]) == (42, True, False)
    assert kwargs["timeout"] == 2_500_000  # microseconds: Request.timeout_s in the callable
    _drive(driver, core.infer((a, a), {}, None, None, False, tritonclient.http), server)
    assert "sequence_id" not in server.last_kwargs and server.last_kwargs["timeout"] == 2_500_000


def test_open_sequences_refuse_starts_beyond_the_bound_while_open_ones_go_on():
    opened = _sequences.OpenSequences(limit=2, idle_s=5.0, model="M")
    assert opened.admit(1, True, False, 0.0) is None and opened.admit(2, True, False, 0.0) is None
    text = opened.admit(3, True, False, 1.0)
    assert text is not None and _sequences.is_bound(text) and not _sequences.is_refusal(text)
    assert "'M' has 2 open sequences" in text and "max_open_sequences=2" in text and "sequence_end=True" in text
    assert _sequences.is_bound(opened.admit(3, False, False, 1.5))  # the refused sequence's later requests too
    assert opened.admit(1, False, False, 2.0) is None  # healthy traffic: open sequences are served
    assert opened.admit(1, False, True, 2.5) is None and len(opened) == 1  # an end frees its place...
    assert _sequences.is_bound(opened.admit(3, False, True, 2.6))  # (the refused one's end is refused, then forgotten)
    assert opened.admit(4, True, False, 3.0) is None  # ...for a new start
    assert opened.admit(2, True, False, 3.2) is None  # a start of an open id is no new sequence


def test_open_sequences_expire_after_the_idle_timeout_and_a_zero_limit_keeps_nothing():
    opened = _sequences.OpenSequences(limit=1, idle_s=1.0, model="M")
    assert opened.admit("a", True, False, 0.0) is None
    assert _sequences.is_bound(opened.admit("b", True, False, 0.5))
    assert opened.admit("b", True, False, 1.2) is None  # "a" idle for 1 s: Triton ended it, so does the count
    assert len(opened) == 1
    assert opened.admit("c", True, True, 1.3) is not None  # a one-request sequence beyond the bound is refused...
    assert opened.admit("c", True, False, 2.5) is None  # ...and remembered for nothing ("b" expired meanwhile)
    unbounded = _sequences.OpenSequences(limit=0, idle_s=1.0, model="M")
    assert all(unbounded.admit(n, True, False, 0.0) is None for n in range(100)) and len(unbounded) == 0


def test_the_idle_timeout_is_read_as_triton_applies_it():
    assert _sequences.idle_s({"sequence_batching": {"max_sequence_idle_microseconds": 2_500_000}}) == 2.5
    assert _sequences.idle_s({"sequence_batching": {}}) == 1.0  # Triton's default


def test_bind_hands_the_bound_to_the_stub(context):  # noqa: F811
    model = _model(context, config=ModelConfig(sequence_batcher=SequenceBatcher()))
    assert model._private["max_open_sequences"] == 4096  # the documented default
    model = _model(context, config=ModelConfig(sequence_batcher=SequenceBatcher(max_open_sequences=0)))
    assert model._private["max_open_sequences"] == 0
    with pytest.raises(PyTritonBadParameterError, match="max_open_sequences must be an int >= 0"):
        _model(context, config=ModelConfig(sequence_batcher=SequenceBatcher(max_open_sequences=-1)))


def test_the_bound_is_kept_for_the_oldest_strategy_only():
    assert _sequences.open_limit({"sequence_batching": {"oldest": {}}}, 7) == 7
    assert _sequences.open_limit({"sequence_batching": {"direct": {}}}, 7) == 0  # Triton's slots bound it
    assert _sequences.open_limit({}, 7) == 0


# -- the owner check (SequenceBatcher.owner_header) -------------------------------------------------


def test_owners_let_only_the_starting_credential_continue_end_or_restart_a_sequence():
    owners = _sequences.SequenceOwners("authorization", idle_s=5.0, model="M")
    assert owners.check(7, True, False, "Bearer alice", 0.0) is None
    assert owners.check(8, True, False, "Bearer bob", 0.0) is None  # another caller's own sequence
    for start, end in ((False, False), (False, True), (True, False), (True, True)):  # continue, end, restart
        text = owners.check(7, start, end, "Bearer bob", 1.0)
        assert text is not None and _sequences.is_refusal(text) and "started by another caller" in text
        assert "alice" not in text and "bob" not in text  # no credential is echoed
    assert owners.check(7, False, False, "Bearer alice", 1.0) is None  # the owner goes on
    assert owners.check(8, False, True, "Bearer bob", 1.0) is None  # and so does bob with his
    assert owners.check(7, False, True, "Bearer alice", 2.0) is None  # its end
    assert owners.check(7, False, True, "Bearer alice", 2.0) is None  # checked again (a partly refused batch)
    assert owners.check(7, False, False, "Bearer bob", 2.0) is not None  # still the owner's
    assert owners.refused == 5
    assert owners.check(7, True, False, "Bearer bob", 2.5) is None  # but free for a new start
    assert owners.check(7, False, False, "Bearer alice", 2.5) is not None  # now bob's


def test_owners_refuse_requests_without_a_credential_and_unowned_continues():
    owners = _sequences.SequenceOwners("authorization", idle_s=5.0, model="M")
    text = owners.check(7, True, False, None, 0.0)
    assert text is not None and "carries no 'authorization' credential" in text and "forward_pattern" in text
    assert owners.check(7, True, False, "", 0.0) is not None  # two different values: refused the same way
    text = owners.check(9, False, False, "Bearer alice", 0.0)  # never started here: nobody owns it yet
    assert text is not None and "has no owner" in text and "sequence_start=True" in text
    assert len(owners) == 0


def test_owners_expire_with_the_idle_timeout_and_are_bounded(monkeypatch):
    owners = _sequences.SequenceOwners("authorization", idle_s=1.0, model="M")
    assert owners.check(7, True, False, "a", 0.0) is None
    assert owners.check(7, False, False, "a", 0.9) is None  # each request renews it
    assert owners.check(7, True, False, "b", 1.5) is not None
    assert owners.check(7, True, False, "b", 2.0) is None  # idle past the timeout: Triton ended it
    monkeypatch.setattr(_sequences, "MAX_OWNERS", 3)
    for n in range(10):
        assert owners.check(100 + n, True, False, "a", 2.0) is None
    assert len(owners) == 3


def test_the_credential_is_found_without_case_and_taken_out_of_the_parameters():
    found, kept = _sequences.credential({"Authorization": "Bearer a", "k": 1}, "authorization")
    assert found == "Bearer a" and kept == {"k": 1}
    assert _sequences.credential({"k": 1}, "authorization") == (None, {"k": 1})
    assert _sequences.credential(None, "authorization") == (None, None)
    found, kept = _sequences.credential({"Authorization": "a", "authorization": "b"}, "authorization")
    assert found == "" and kept is None  # ambiguous: refused as carrying none
    assert _sequences.credential({"authorization": "a", "Authorization": "a"}, "authorization")[0] == "a"


def test_the_stub_refuses_a_strangers_request_before_the_callable_and_hides_the_credential(setup, pool, monkeypatch):  # noqa: F811
    # Before: any caller could continue, end or restart another's sequence by its id; the stub had no owner.
    monkeypatch.setattr(setup.stub.pb_utils, "TritonError", _CodedError)
    worker = setup.worker()
    model = setup.model(sequence=SEQUENCE_CONTROLS, owner_header="authorization")
    channel = worker.channel()

    def run(requests):
        future = pool.submit(model.execute, requests)
        message = channel.recv()
        arena = _arena.SharedArena(f"{setup.shm_prefix}-w")
        try:
            channel.send(_ok(arena, [{"y": np.array([[1]], np.int32)} for _ in message.entries]))
            return message, future.result(TIMEOUT_S)
        finally:
            arena.close()

    def request(value, sequence_id, who, **flags):
        req = _sequence_request(value, sequence_id, **flags)
        req._parameters = json.dumps({"Authorization": who, "kept": 1} if who else {})
        return req

    message, responses = run([request(1, 7, "alice", start=True), request(2, 8, "bob", start=True)])
    assert [entry.sequence for entry in message.entries] == [(7, True, False), (8, True, False)]
    assert [entry.parameters for entry in message.entries] == [{"kept": 1}, {"kept": 1}]  # no credential
    assert all(response.error is None for response in responses)
    message, responses = run(
        [request(3, 7, "bob"), request(4, 7, "alice"), request(5, 7, None, end=True), request(6, 8, "bob", end=True)]
    )
    assert [entry.sequence for entry in message.entries] == [(7, False, False), (8, False, True)]
    assert [response.error is None for response in responses] == [False, True, False, True]
    assert responses[0].error.code == "INVALID_ARG" and "started by another caller" in responses[0].error.message()


def test_bind_checks_the_owner_header_and_hands_it_to_the_stub(context):  # noqa: F811
    from pytriton.proxy._binding import check_owner_forwarded

    batcher = SequenceBatcher(owner_header="authorization")
    model = _model(context, config=ModelConfig(sequence_batcher=batcher))
    assert model._private["owner_header"] == "authorization"
    assert "owner_header" not in _model(context, config=ModelConfig(sequence_batcher=SequenceBatcher()))._private
    for bad in ("Authorization", "", "a b", 5):
        with pytest.raises(PyTritonBadParameterError, match="owner_header must be None or a lower-case header"):
            _model(context, config=ModelConfig(sequence_batcher=SequenceBatcher(owner_header=bad)))
    oldest = SequenceBatcher(strategy=SequenceStrategy.OLDEST, owner_header="authorization")
    with pytest.raises(PyTritonBadParameterError, match="OLDEST strategy needs one instance"):
        _model(context, config=ModelConfig(sequence_batcher=oldest), infer_funcs=[lambda r: r, lambda r: r])
    check_owner_forwarded(batcher, "authorization", "(?i)^authorization$", "M")
    check_owner_forwarded(SequenceBatcher(), None, None, "M")  # no owner check: nothing to forward
    with pytest.raises(PyTritonBadParameterError, match="grpc_header_forward_pattern='authorization'") as raised:
        check_owner_forwarded(batcher, "authorization", "x-other", "M")
    assert "http_header_forward_pattern" not in str(raised.value)
    with pytest.raises(PyTritonBadParameterError, match="http_header_forward_pattern"):
        check_owner_forwarded(batcher, "[", None, "M")
