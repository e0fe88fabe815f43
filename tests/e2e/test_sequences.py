"""Sequence models through a live server: ids and flags reach the callable, state per sequence, idle timeout.

Clients: pytriton's three clients (keyword arguments ``sequence_id``, ``sequence_start``,
``sequence_end``) and raw tritonclient, over HTTP and gRPC. docs/sequences.md.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from pytriton.client import AsyncioModelClient, FuturesModelClient, ModelClient
from pytriton.client.exceptions import PyTritonClientInferenceServerError, PyTritonClientValueError
from pytriton.exceptions import PyTritonBadParameterError
from pytriton.model_config import ModelConfig, SequenceBatcher, SequenceStrategy, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports
from tests.e2e._kinds import model

IDLE_S = 0.5


class RunningSum:
    """A running total per sequence; records what each request said about its sequence."""

    def __init__(self):
        self.totals = {}
        self.seen = []  # (sequence_id, start, end)
        self.lock = threading.Lock()

    def __call__(self, requests):
        responses = []
        with self.lock:
            for request in requests:
                if set(request.keys()) != {"value"}:  # the control inputs never reach the callable
                    raise AssertionError(f"unexpected inputs {sorted(request.keys())}")
                self.seen.append((request.sequence_id, request.sequence_start, request.sequence_end))
                if request.sequence_start:
                    self.totals[request.sequence_id] = 0.0
                total = self.totals[request.sequence_id] + float(request["value"].sum())
                if request.sequence_end:
                    del self.totals[request.sequence_id]
                else:
                    self.totals[request.sequence_id] = total
                responses.append({"total": np.full((1, 1), total, np.float32)})
        return responses


_PROCESS_TOTALS = {}  # in the worker process


def process_running_sum(requests):
    """A process (or backend) instance's state lives in its worker process (or stub); the sequence fields reach it
    the same way."""
    responses = []
    for request in requests:
        start = 0.0 if request.sequence_start else _PROCESS_TOTALS[request.sequence_id]
        _PROCESS_TOTALS[request.sequence_id] = start + float(request["value"].sum())
        responses.append({"total": np.full((1, 1), _PROCESS_TOTALS[request.sequence_id], np.float32)})
        if request.sequence_end:
            del _PROCESS_TOTALS[request.sequence_id]
    return responses


DIRECT = RunningSum()
OLDEST = RunningSum()


@pytest.fixture(scope="module")
def urls():
    ports = triton_ports()
    tensors = dict(
        inputs=[Tensor(name="value", shape=(1,), dtype=np.float32)],
        outputs=[Tensor(name="total", shape=(1,), dtype=np.float32)],
    )
    with Triton(config=TritonConfig(**ports)) as triton:
        idle = int(IDLE_S * 1e6)
        triton.bind(
            "Sum",
            DIRECT,
            config=ModelConfig(max_batch_size=4, sequence_batcher=SequenceBatcher(max_sequence_idle_microseconds=idle)),
            **tensors,
        )
        oldest = SequenceBatcher(
            strategy=SequenceStrategy.OLDEST,
            string_ids=True,
            max_candidate_sequences=8,
            max_queue_delay_microseconds=2000,
        )
        triton.bind("SumOldest", OLDEST, config=ModelConfig(max_batch_size=4, sequence_batcher=oldest), **tensors)
        triton.bind(
            "SumProcess",
            process_running_sum,
            config=ModelConfig(max_batch_size=4, sequence_batcher=SequenceBatcher()),
            instance_kind="process",
            **tensors,
        )
        # Sum and SumOldest on backend instances too (tests/e2e/_kinds.py): the running totals live in
        # the stub, so the tests check what the answers say (what RunningSum records is this process's).
        sum_backend = ModelConfig(
            max_batch_size=4, sequence_batcher=SequenceBatcher(max_sequence_idle_microseconds=idle)
        )
        triton.bind(
            model("Sum", "backend"), process_running_sum, config=sum_backend, instance_kind="backend", **tensors
        )
        oldest_backend = ModelConfig(max_batch_size=4, sequence_batcher=oldest)
        triton.bind(
            model("SumOldest", "backend"),
            process_running_sum,
            config=oldest_backend,
            instance_kind="backend",
            **tensors,
        )
        triton.bind(
            "SumBackend",
            process_running_sum,
            config=ModelConfig(max_batch_size=4, sequence_batcher=SequenceBatcher()),
            instance_kind="backend",
            **tensors,
        )
        # A model of its own for the flood test, so that its backlog never delays the other tests.
        flood = ModelConfig(
            max_batch_size=2, sequence_batcher=SequenceBatcher(max_sequence_idle_microseconds=3_000_000)
        )
        triton.bind("SumFlood", process_running_sum, config=flood, **tensors)
        triton.run()
        yield {"http": f"http://127.0.0.1:{ports['http_port']}", "grpc": f"grpc://127.0.0.1:{ports['grpc_port']}"}


def _steps(client, sequence_id, values):
    result = None
    for step, value in enumerate(values):
        result = client.infer_sample(
            np.array([value], np.float32),
            sequence_id=sequence_id,
            sequence_start=step == 0,
            sequence_end=step == len(values) - 1,
        )
    return float(result["total"][0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_concurrent_sequences_keep_their_own_state(urls, protocol, kind):
    base = 1000 if protocol == "http" else 2000
    totals = {}

    def run(sequence_id):
        with ModelClient(urls[protocol], model("Sum", kind)) as client:
            totals[sequence_id] = _steps(client, sequence_id, [float(sequence_id - base)] * 6)

    threads = [threading.Thread(target=run, args=(base + n,)) for n in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert totals == {base + n: 6.0 * n for n in range(1, 7)}
    if kind == "backend":
        return  # what the callable saw stays in its stub; the totals above are per sequence
    mine = [entry for entry in DIRECT.seen if base < entry[0] < base + 100]
    assert len(mine) == 36
    assert sorted(entry for entry in mine if entry[1]) == [(base + n, True, False) for n in range(1, 7)]
    assert sorted(entry for entry in mine if entry[2]) == [(base + n, False, True) for n in range(1, 7)]
    assert all(sid not in DIRECT.totals for sid in totals)  # every sequence's state was dropped at its end


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_futures_and_asyncio_clients_send_sequences(urls, protocol, kind):
    sid = 3000 if protocol == "http" else 3100
    with FuturesModelClient(urls[protocol], model("Sum", kind)) as client:
        first = client.infer_sample(np.array([2.0], np.float32), sequence_id=sid, sequence_start=True).result(30)
        last = client.infer_sample(np.array([3.0], np.float32), sequence_id=sid, sequence_end=True).result(30)
    assert (float(first["total"][0]), float(last["total"][0])) == (2.0, 5.0)

    async def steps():
        async with AsyncioModelClient(urls[protocol], model("Sum", kind)) as client:
            await client.infer_sample(np.array([1.0], np.float32), sequence_id=sid + 1, sequence_start=True)
            out = await client.infer_sample(np.array([4.0], np.float32), sequence_id=sid + 1, sequence_end=True)
        return float(out["total"][0])

    assert asyncio.run(steps()) == 5.0


@pytest.mark.parametrize("lib", [httpclient, grpcclient], ids=["http", "grpc"])
def test_raw_tritonclient_with_string_ids_and_the_oldest_strategy(urls, lib, kind):
    address = urls["http" if lib is httpclient else "grpc"].split("://")[1]
    client = lib.InferenceServerClient(address)
    names = [f"{lib.__name__}-a", f"{lib.__name__}-b"]
    try:
        for step in range(3):
            for index, name in enumerate(names):
                tensor = lib.InferInput("value", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.array([[index + 1.0]], np.float32))
                result = client.infer(
                    model("SumOldest", kind),
                    [tensor],
                    sequence_id=name,
                    sequence_start=step == 0,
                    sequence_end=step == 2,
                )
                assert float(result.as_numpy("total")[0, 0]) == (index + 1.0) * (step + 1)
    finally:
        client.close()
    if kind == "backend":
        return  # what the callable saw stays in its stub; the totals above are per sequence
    starts = {entry[0] for entry in OLDEST.seen if entry[1] and entry[0] in names}
    assert starts == set(names)
    assert all(isinstance(entry[0], str) for entry in OLDEST.seen)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_sequence_idle_too_long_is_ended_by_triton(urls, protocol):
    # Thread instances only: Triton's sequence batcher ends the sequence, whatever runs the callable.
    sid = 4000 if protocol == "http" else 4100
    with ModelClient(urls[protocol], "Sum") as client:
        client.infer_sample(np.array([1.0], np.float32), sequence_id=sid, sequence_start=True)
        time.sleep(IDLE_S * 3)
        with pytest.raises(PyTritonClientInferenceServerError, match="START"):
            client.infer_sample(np.array([1.0], np.float32), sequence_id=sid)
        # A new sequence under the same id starts afresh.
        assert _steps(client, sid, [5.0, 1.0]) == 6.0


@pytest.mark.parametrize("model", ["SumProcess", "SumBackend"])
def test_a_process_or_backend_instance_gets_the_sequence_fields(urls, model):
    with ModelClient(urls["grpc"], model) as client:
        assert _steps(client, 5000, [1.0, 2.0, 4.0]) == 7.0


def test_sequence_flags_need_an_id(urls):
    with ModelClient(urls["http"], "Sum") as client:
        with pytest.raises(PyTritonClientValueError, match="sequence_id"):
            client.infer_sample(np.array([1.0], np.float32), sequence_start=True)


def test_a_string_id_to_a_model_with_integer_ids_is_refused_over_http(urls, kind):
    # Before: Triton 2.51 answered 200 and the callable got the str "abc" (SequenceBatcher(string_ids=False)).
    import requests

    url = f"{urls['http']}/v2/models/{model('Sum', kind)}/infer"
    body = {
        "inputs": [{"name": "value", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}],
        "parameters": {"sequence_id": "abc", "sequence_start": True},
    }
    answer = requests.post(url, json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert "'abc' is a string" in answer.json()["error"] and "string_ids=True" in answer.json()["error"]
    body["parameters"] = {"sequence_id": "abc", "sequence_end": True}  # nor can the refused id be continued or ended
    assert requests.post(url, json=body, timeout=30).status_code == 400
    body["parameters"] = {"sequence_id": 6000 + len(kind), "sequence_start": True, "sequence_end": True}
    healthy = requests.post(url, json=body, timeout=30)  # an integer id beside it is served as before
    assert healthy.status_code == 200 and healthy.json()["outputs"][0]["data"] == [1.0]
    if kind == "thread":
        assert all(not isinstance(entry[0], str) for entry in DIRECT.seen)  # "abc" never reached the callable


def test_a_string_id_to_a_model_with_integer_ids_is_refused_over_grpc(urls, kind):
    client = grpcclient.InferenceServerClient(urls["grpc"].split("://")[1])
    try:
        tensor = grpcclient.InferInput("value", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[2.0]], np.float32))
        with pytest.raises(Exception, match="is a string") as caught:
            client.infer(model("Sum", kind), [tensor], sequence_id="abc", sequence_start=True)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        sid = 6100 + len(kind)  # healthy traffic beside it
        result = client.infer(model("Sum", kind), [tensor], sequence_id=sid, sequence_start=True, sequence_end=True)
        assert float(result.as_numpy("total")[0, 0]) == 2.0
    finally:
        client.close()


def test_never_ended_starts_wait_in_the_backlog_while_an_open_sequence_keeps_working(urls):
    # The documented trust model (docs/security.md, "Sequence ids are capabilities"): starts beyond the
    # slots wait in Triton's backlog; a sequence holding a slot is not delayed by them, and the backlog
    # drains once the idle timeout passes. This holds on eb8c679 too: it guards the documentation.
    flood_count = 60
    answered = threading.Semaphore(0)
    flood = grpcclient.InferenceServerClient(urls["grpc"].split("://")[1])
    try:
        with ModelClient(urls["http"], "SumFlood") as client:
            client.infer_sample(np.array([1.0], np.float32), sequence_id=9000, sequence_start=True)
            for index in range(flood_count):
                tensor = grpcclient.InferInput("value", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.array([[1.0]], np.float32))
                flood.async_infer(
                    "SumFlood",
                    [tensor],
                    lambda result, error: answered.release(),
                    sequence_id=9100 + index,
                    sequence_start=True,
                    client_timeout=120,
                )
            # A new start that carries Triton's request timeout (pytriton's clients send their
            # inference_timeout_s as it) is refused with a retryable 503 at that time instead of waiting for
            # the backlog to drain, and is dropped from the backlog (docs/security.md).
            # Once a flood start is answered, both slots are held (9000 and that start, idle for 3 s).
            assert answered.acquire(timeout=60), "no start of the flood was served"
            answered.release()
            raw = httpclient.InferenceServerClient(urls["http"].split("://")[1], network_timeout=60)
            try:
                tensor = httpclient.InferInput("value", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.array([[1.0]], np.float32))
                began = time.monotonic()
                with pytest.raises(InferenceServerException, match="timeout of the corresponding sequence") as late:
                    raw.infer("SumFlood", [tensor], sequence_id=9002, sequence_start=True, timeout=500_000)
                assert late.value.status() == "503" and time.monotonic() - began < 2.9  # before the 3 s idle
            finally:
                raw.close()
            # The open sequence goes on and ends while the starts are still waiting.
            client.infer_sample(np.array([2.0], np.float32), sequence_id=9000)
            last = client.infer_sample(np.array([4.0], np.float32), sequence_id=9000, sequence_end=True)
            assert float(last["total"][0]) == 7.0
            deadline = time.monotonic() + 120
            for _ in range(flood_count):  # every start is answered once the backlog drains
                assert answered.acquire(timeout=max(0.0, deadline - time.monotonic())), "the backlog did not drain"
            assert _steps(client, 9001, [1.0, 1.0]) == 2.0  # and new sequences are served again
    finally:
        flood.close()


@pytest.fixture(scope="module")
def bounded_urls():
    """A server of its own: an OLDEST model with many candidates, bounded to 3 open sequences per instance."""
    ports = triton_ports()
    batcher = SequenceBatcher(
        strategy=SequenceStrategy.OLDEST,
        max_candidate_sequences=1000,
        max_sequence_idle_microseconds=30_000_000,
        max_open_sequences=3,
    )
    with Triton(config=TritonConfig(**ports)) as triton:
        for kind in ("thread", "backend"):
            triton.bind(
                model("Bounded", kind),
                process_running_sum,
                inputs=[Tensor(name="value", shape=(1,), dtype=np.float32)],
                outputs=[Tensor(name="total", shape=(1,), dtype=np.float32)],
                config=ModelConfig(max_batch_size=4, sequence_batcher=batcher),
                **({"instance_kind": "backend"} if kind == "backend" else {}),
            )
        triton.run()
        yield {"http": f"127.0.0.1:{ports['http_port']}", "grpc": f"127.0.0.1:{ports['grpc_port']}"}


@pytest.mark.parametrize("lib", [httpclient, grpcclient], ids=["http", "grpc"])
def test_starts_beyond_the_open_sequence_bound_are_refused_while_open_sequences_go_on(bounded_urls, lib, kind):
    # Before: no bound; every start reached the callable, which kept state for it.
    client = lib.InferenceServerClient(bounded_urls["http" if lib is httpclient else "grpc"])
    base = 7000 if lib is httpclient else 7100

    def step(sequence_id, value, start=False, end=False):
        tensor = lib.InferInput("value", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[value]], np.float32))
        result = client.infer(
            model("Bounded", kind), [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end
        )
        return float(result.as_numpy("total")[0, 0])

    try:
        assert [step(base + n, 1.0, start=True) for n in range(3)] == [1.0, 1.0, 1.0]  # 3 open: the bound
        with pytest.raises(InferenceServerException, match="too many open sequences") as caught:
            step(base + 3, 1.0, start=True)
        assert "max_open_sequences=3" in str(caught.value) and "sequence_end=True" in str(caught.value)
        assert caught.value.status() in ("503", "StatusCode.UNAVAILABLE")
        with pytest.raises(InferenceServerException, match="too many open sequences"):
            step(base + 3, 1.0)  # nor does the refused sequence go on
        assert step(base, 2.0) == 3.0  # open sequences are served beside the refusals
        assert step(base, 4.0, end=True) == 7.0  # an end frees a place...
        assert step(base + 4, 5.0, start=True) == 5.0  # ...for a new start
        for sequence_id in (base + 1, base + 2, base + 4):  # leave nothing open for the other runs
            step(sequence_id, 0.0, end=True)
    finally:
        client.close()


# -- the owner check: SequenceBatcher(owner_header=...) -------------------------------------------


@pytest.fixture(scope="module")
def owned_urls():
    """A server of its own that forwards the ``authorization`` header; DIRECT models (2 instances) that check owners."""
    ports = triton_ports()
    forward = dict(http_header_forward_pattern="^authorization$", grpc_header_forward_pattern="^authorization$")
    batcher = SequenceBatcher(max_sequence_idle_microseconds=10_000_000, owner_header="authorization")
    with Triton(config=TritonConfig(**forward, **ports)) as triton:
        for kind in ("thread", "backend"):
            triton.bind(
                model("Owned", kind),
                [process_running_sum, process_running_sum],
                inputs=[Tensor(name="value", shape=(1,), dtype=np.float32)],
                outputs=[Tensor(name="total", shape=(1,), dtype=np.float32)],
                config=ModelConfig(max_batch_size=4, sequence_batcher=batcher),
                **({"instance_kind": "backend"} if kind == "backend" else {}),
            )
        triton.run()
        yield {"http": f"127.0.0.1:{ports['http_port']}", "grpc": f"127.0.0.1:{ports['grpc_port']}"}


@pytest.mark.parametrize("lib", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_caller_with_another_credential_cannot_touch_a_sequence_while_its_owner_goes_on(owned_urls, lib, kind):
    # Before: any caller that knew an id could continue, end or restart another caller's sequence.
    address = owned_urls["http" if lib is httpclient else "grpc"]
    base = 11000 if lib is httpclient else 11100
    owners = 4
    stop = threading.Event()
    refusals, failures, ended = [], [], set()

    def step(client, who, sequence_id, value, start=False, end=False):
        tensor = lib.InferInput("value", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[value]], np.float32))
        headers = {"authorization": f"Bearer {who}"} if who else None
        result = client.infer(
            model("Owned", kind),
            [tensor],
            sequence_id=sequence_id,
            sequence_start=start,
            sequence_end=end,
            headers=headers,
        )
        return float(result.as_numpy("total")[0, 0])

    def attacker():  # holds a credential of its own and goes through the owners' ids while they run
        client = lib.InferenceServerClient(address)
        try:
            for attempt in range(400):
                if stop.is_set():
                    break
                sequence_id = base + attempt % owners
                # Continues and restarts: a stranger's end flag still ends the sequence in Triton (see below).
                start = attempt % 2 == 1
                if sequence_id in ended:  # the owner is done with it: any caller may start that id anew
                    continue
                try:
                    step(client, "mallory" if attempt % 5 else None, sequence_id, 1000.0, start=start)
                    if sequence_id in ended:  # its owner's end came first: a new sequence of mallory's
                        step(client, "mallory", sequence_id, 0.0, end=True)
                    else:
                        failures.append(f"attempt {attempt} on {sequence_id} was served")
                except InferenceServerException as exc:
                    refusals.append(exc)
        finally:
            client.close()

    totals = {}

    def owner(index):
        client = lib.InferenceServerClient(address)
        try:
            sequence_id = base + index
            totals[sequence_id] = [step(client, f"alice-{index}", sequence_id, 1.0, start=True)]
            for _ in range(8):
                totals[sequence_id].append(step(client, f"alice-{index}", sequence_id, 1.0))
            ended.add(sequence_id)
            totals[sequence_id].append(step(client, f"alice-{index}", sequence_id, 1.0, end=True))
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(f"owner {index}: {exc}")
        finally:
            client.close()

    first = lib.InferenceServerClient(address)
    try:  # the owners' sequences are open before the attacker starts
        for index in range(owners):
            assert step(first, f"alice-{index}", base + index, 0.0, start=True) == 0.0
    finally:
        first.close()
    threads = [threading.Thread(target=attacker)] + [threading.Thread(target=owner, args=(n,)) for n in range(owners)]
    for thread in threads:
        thread.start()
    for thread in threads[1:]:
        thread.join(120)
    stop.set()
    threads[0].join(120)
    assert failures == []
    assert totals == {base + n: [float(k) for k in range(1, 11)] for n in range(owners)}  # nothing of mallory's
    assert any("started by another caller" in str(exc) for exc in refusals), "no attempt met an open sequence"
    for exc in refusals:
        assert exc.status() in ("400", "StatusCode.INVALID_ARGUMENT"), exc
        text = str(exc)  # Triton's own answer to a continue once its owner had ended the sequence
        assert "started by another caller" in text or "carries no 'authorization'" in text or "START flag" in text
        assert "alice" not in str(exc)  # no credential is echoed
    # A caller's own sequences work the same with the check.
    client = lib.InferenceServerClient(address)
    try:
        assert step(client, "mallory", base + 50, 2.0, start=True) == 2.0
        assert step(client, "mallory", base + 50, 3.0, end=True) == 5.0
        assert step(client, "alice-0", base + 50, 1.0, start=True, end=True) == 1.0  # an ended id is free
        # The limit of a check in the model: Triton's batcher acts on a stranger's end flag before any
        # backend sees the request, so the sequence is ended in Triton though the stranger's request is
        # refused and the state stays untouched; the owner's next request then needs a new start.
        assert step(client, "alice-0", base + 60, 1.0, start=True) == 1.0
        with pytest.raises(InferenceServerException, match="started by another caller"):
            step(client, "mallory", base + 60, 1.0, end=True)
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            step(client, "alice-0", base + 60, 1.0)
    finally:
        client.close()


def test_bind_refuses_an_owner_check_the_server_does_not_forward():
    with Triton(config=TritonConfig(**triton_ports())) as triton:
        with pytest.raises(PyTritonBadParameterError, match="http_header_forward_pattern='authorization'"):
            triton.bind(
                "NotForwarded",
                process_running_sum,
                inputs=[Tensor(name="value", shape=(1,), dtype=np.float32)],
                outputs=[Tensor(name="total", shape=(1,), dtype=np.float32)],
                config=ModelConfig(max_batch_size=4, sequence_batcher=SequenceBatcher(owner_header="authorization")),
            )
