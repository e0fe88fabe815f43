"""Cancellation, deadlines and the execution timeout through a live server (docs/cancellation.md).

A callable polls ``Request.is_cancelled()``; it must see a gRPC cancel, a gRPC deadline and a
request timeout (HTTP and gRPC), on a thread and on a backend instance (tests/e2e/_kinds.py; the
callables, in tests/e2e/kind_models.py, note what they saw in files). A call that runs past the model's execution timeout fails at the
client with a clear error, and the instance is recovered: a thread instance's pure-Python call is
interrupted (its thread ends), a process instance's worker process is replaced (``bind`` refuses an
execution timeout for a backend instance). gRPC calls cancelled while they queue behind a busy
instance never reach the callable, on thread, backend and process instances (issue 42, item 5).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pytriton.client import ModelClient
from pytriton.client.exceptions import PyTritonClientInferenceServerError, PyTritonClientTimeoutError
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from tests.conftest import triton_ports, wait_for
from tests.e2e._kinds import KINDS, model
from tests.e2e.kind_models import CANCEL_CAP_S, CountRuns, Watch, WatchBatch
from tests.e2e.test_metrics import parse

CAP_S = CANCEL_CAP_S  # no callable here runs longer than this, whatever happens
QUEUED_CALL_S = 0.1  # each call of the Queued models
# gRPC calls cancelled right after sending in the queueing test (the trial sent 750).
QUEUED_N = int(os.environ.get("PYTRITON_TEST_CANCELLED_N", "30"))


def spin(requests):
    """Pure Python for a negative tag (until interrupted, or CAP_S); else answers at once."""
    if int(requests[0]["tag"].flat[0]) < 0:
        deadline = time.monotonic() + 3 * CAP_S  # longer than the test waits for its thread to end
        count = 0
        while time.monotonic() < deadline:
            count += 1
    return [{"seen": np.array([os.getpid()], np.int32)} for _ in requests]


def sleep_in_native_code(requests):
    """Blocks in time.sleep (native code: nothing can interrupt it in a thread) for a negative tag."""
    if int(requests[0]["tag"].flat[0]) < 0:
        time.sleep(CAP_S)
    return [{"seen": np.array([os.getpid()], np.int32)} for _ in requests]


@pytest.fixture(scope="module")
def urls(tmp_path_factory):
    ports = triton_ports()
    tensors = dict(
        inputs=[Tensor(name="tag", shape=(1,), dtype=np.int32)],
        outputs=[Tensor(name="seen", shape=(1,), dtype=np.int32)],
    )
    plain = ModelConfig(batching=False)
    # What each kind's callables saw ("process": the Queued model of a process instance only).
    notes = {kind: tmp_path_factory.mktemp(f"cancel-{kind}") for kind in (*KINDS, "process")}
    with Triton(config=TritonConfig(**ports)) as triton:
        for kind in KINDS:  # the watching models on each instance kind (tests/e2e/_kinds.py)
            watch = Watch(str(notes[kind]))
            triton.bind(model("Watch", kind), [watch, watch], config=plain, instance_kind=kind, **tensors)
            triton.bind(
                model("WatchBatch", kind),
                batch(WatchBatch(str(notes[kind]))),
                config=ModelConfig(max_batch_size=4),
                instance_kind=kind,
                **tensors,
            )
            triton.bind(  # one slow instance that requests queue behind (issue 42, item 5)
                model("Queued", kind),
                CountRuns(str(notes[kind]), QUEUED_CALL_S),
                config=plain,
                instance_kind=kind,
                **tensors,
            )
        triton.bind(
            "Queued_process",
            CountRuns(str(notes["process"]), QUEUED_CALL_S),
            config=plain,
            instance_kind="process",
            **tensors,
        )
        triton.bind("Spin", spin, config=ModelConfig(batching=False, execution_timeout_s=0.5), **tensors)
        triton.bind(
            "SleepProcess",
            sleep_in_native_code,
            config=ModelConfig(batching=False, execution_timeout_s=0.5),
            instance_kind="process",
            **tensors,
        )
        triton.run()
        yield {
            "http": f"127.0.0.1:{ports['http_port']}",
            "grpc": f"127.0.0.1:{ports['grpc_port']}",
            "metrics": f"http://127.0.0.1:{ports['metrics_port']}/metrics",
            "notes": notes,
        }


def _seen(urls, kind, tag):
    """``[monotonic time, Request.timeout_s]`` of the cancellation the callable saw for ``tag``, or None."""
    path = urls["notes"][kind] / f"{tag}.seen"
    return json.loads(path.read_text()) if path.exists() else None


def _tag_input(lib, tag, batched=False):
    shape = [1, 1] if batched else [1]
    tensor = lib.InferInput("tag", shape, "INT32")
    tensor.set_data_from_numpy(np.full(shape, tag, np.int32))
    return [tensor]


def test_a_grpc_cancel_reaches_the_callable(urls, kind):
    client = grpcclient.InferenceServerClient(urls["grpc"])
    try:
        call = client.async_infer(
            model("Watch", kind), _tag_input(grpcclient, 101), callback=lambda result, error: None
        )
        assert wait_for(lambda: (urls["notes"][kind] / "101.started").exists(), CAP_S)
        time.sleep(0.05)
        cancelled_at = time.monotonic()
        call.cancel()
        assert wait_for(lambda: _seen(urls, kind, 101), CAP_S), "the callable never saw the cancellation"
    finally:
        client.close()
    print(f"gRPC cancel seen by the callable after {(_seen(urls, kind, 101)[0] - cancelled_at) * 1e3:.2f} ms")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_client_timeout_travels_to_the_callable(urls, protocol, kind):
    tag = 200 if protocol == "http" else 201
    with ModelClient(f"{protocol}://{urls[protocol]}", model("Watch", kind), inference_timeout_s=0.5) as client:
        client.wait_for_model(CAP_S)
        sent = time.monotonic()
        with pytest.raises(PyTritonClientTimeoutError):
            client.infer_sample(np.array([tag], np.int32))
    assert wait_for(lambda: _seen(urls, kind, tag), CAP_S), "the callable never saw its request's deadline pass"
    seen_at, timeout_s = _seen(urls, kind, tag)
    assert timeout_s == pytest.approx(0.5)
    print(f"{protocol}: client timeout 0.5 s, the callable stopped {seen_at - sent:.3f} s after the request was sent")


@pytest.mark.parametrize("lib", [httpclient, grpcclient], ids=["http", "grpc"])
def test_raw_tritonclient_request_timeout_reaches_the_callable(urls, lib, kind):
    tag = 300 if lib is httpclient else 301
    client = lib.InferenceServerClient(urls["http" if lib is httpclient else "grpc"])
    try:
        result = client.infer(model("Watch", kind), _tag_input(lib, tag), timeout=300_000)  # microseconds
    finally:
        client.close()
    assert int(result.as_numpy("seen")[0]) == 1  # the callable stopped early, and answered
    assert _seen(urls, kind, tag)[1] == pytest.approx(0.3)


def test_batch_cancelled_is_the_batch_view(urls, kind):
    client = grpcclient.InferenceServerClient(urls["grpc"])
    try:
        with pytest.raises(Exception, match="(?i)deadline"):
            client.infer(model("WatchBatch", kind), _tag_input(grpcclient, 400, batched=True), client_timeout=0.3)
    finally:
        client.close()
    assert wait_for(lambda: _seen(urls, kind, 400), CAP_S)


def _metric(urls, metric_name, name):
    """The sum of ``metric_name``'s series of model ``name`` on the server's /metrics."""
    with urllib.request.urlopen(urls["metrics"], timeout=10) as response:
        samples = parse(response.read().decode())
    return sum(
        value for (metric, labels), value in samples.items() if metric == metric_name and ("model", name) in labels
    )


def _pending(urls, name):
    return _metric(urls, "nv_inference_pending_request_count", name)


def _cancelled_metric(urls, name):
    return _metric(urls, "pytriton_requests_cancelled_total", name)


def test_requests_cancelled_while_queued_never_reach_the_callable(urls, kind):
    _queued_and_cancelled(urls, model("Queued", kind), kind)


def test_requests_cancelled_while_queued_never_reach_a_process_instance(urls):
    _queued_and_cancelled(urls, "Queued_process", "process")


def _queued_and_cancelled(urls, name, kind):
    """Issue 42, item 5: gRPC calls cancelled right after sending, queued behind a slow instance.

    Before: every one of them ran the callable in full. Now only those already started run; the
    others are answered CANCELLED (counted in pytriton_requests_cancelled_total), and healthy calls
    sent beside them are all answered correctly.
    """
    notes = urls["notes"][kind]
    client = grpcclient.InferenceServerClient(urls["grpc"])
    errors: queue.SimpleQueue = queue.SimpleQueue()
    healthy_tags = [5000 + i for i in range(5)]
    try:
        # The instance is busy (a 1 s call); the N calls queue in Triton behind it, and are cancelled.
        blocker: queue.SimpleQueue = queue.SimpleQueue()
        client.async_infer(
            name, _tag_input(grpcclient, -1), callback=lambda result, error: blocker.put((result, error))
        )
        assert wait_for(lambda: (notes / "-1.ran").exists(), CAP_S)
        started = time.monotonic()
        calls = []
        for i in range(QUEUED_N):
            calls.append(
                client.async_infer(name, _tag_input(grpcclient, 1000 + i), callback=lambda result, error: None)
            )
        queued = wait_for(lambda: _pending(urls, name) >= QUEUED_N, 10, 0.01)
        for call in calls:  # right after sending them all
            call.cancel()
        assert queued, f"the calls did not all reach the server's queue ({_pending(urls, name)})"

        def healthy(tag):
            own = grpcclient.InferenceServerClient(urls["grpc"])
            try:
                result = own.infer(name, _tag_input(grpcclient, tag), client_timeout=QUEUED_N * QUEUED_CALL_S + 60)
                if int(result.as_numpy("seen")[0]) != tag:
                    errors.put(f"{tag}: wrong answer {result.as_numpy('seen')}")
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.put(f"{tag}: {exc}")
            finally:
                own.close()

        threads = [threading.Thread(target=healthy, args=(tag,)) for tag in healthy_tags]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(QUEUED_N * QUEUED_CALL_S + 90)
        assert errors.empty(), [errors.get() for _ in range(errors.qsize())]
        result, error = blocker.get(timeout=CAP_S)
        assert error is None and int(result.as_numpy("seen")[0]) == -1, error
        elapsed = time.monotonic() - started
    finally:
        client.close()
    ran = [i for i in range(QUEUED_N) if (notes / f"{1000 + i}.ran").exists()]
    assert all((notes / f"{tag}.ran").exists() for tag in healthy_tags)
    print(
        f"{kind}: {QUEUED_N} gRPC calls cancelled right after sending: the callable ran {len(ran)} of them; "
        f"5 healthy calls beside them answered after {elapsed:.2f} s"
    )
    # The first one started before its cancel arrived; a second one may have been handed over too.
    assert len(ran) <= 2, f"the callable ran {len(ran)} of {QUEUED_N} cancelled requests: {ran}"
    assert wait_for(lambda: _cancelled_metric(urls, name) == QUEUED_N - len(ran), 10), _cancelled_metric(urls, name)


def _session_threads(model):
    return [
        thread
        for thread in threading.enumerate()
        if thread.name.startswith(f"pytriton-{model}-") and "-c" in thread.name
    ]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_execution_timeout_interrupts_a_pure_python_call_of_a_thread_instance(urls, protocol):
    with ModelClient(f"{protocol}://{urls[protocol]}", "Spin") as client:
        client.wait_for_model(CAP_S)
        started = time.monotonic()
        with pytest.raises(PyTritonClientInferenceServerError, match="execution timeout of 0.5 s"):
            client.infer_sample(np.array([-1], np.int32))
        assert time.monotonic() - started < CAP_S
        assert int(client.infer_sample(np.array([1], np.int32))["seen"][0]) == os.getpid()
    # The hung call was interrupted: its thread ends (nothing is left behind per timeout).
    assert wait_for(lambda: len(_session_threads("Spin")) == 1, CAP_S), [t.name for t in _session_threads("Spin")]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_execution_timeout_replaces_a_process_instance(urls, protocol):
    with ModelClient(f"{protocol}://{urls[protocol]}", "SleepProcess") as client:
        client.wait_for_model(CAP_S)
        before = int(client.infer_sample(np.array([1], np.int32))["seen"][0])
        with pytest.raises(PyTritonClientInferenceServerError, match="execution timeout of 0.5 s"):
            client.infer_sample(np.array([-1], np.int32))
        after = int(client.infer_sample(np.array([1], np.int32))["seen"][0])
    assert after != before, "a new worker process serves the instance"
    assert wait_for(lambda: not os.path.exists(f"/proc/{before}"), CAP_S), "the hung worker process is gone"
