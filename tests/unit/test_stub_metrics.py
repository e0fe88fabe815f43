"""The callables' metrics (``pytriton/proxy/stubside/_stub_metrics.py``) with a fake metric API, no server.

Covers: the values each series gets (histogram buckets, sums and counts, errors, reconnects, the
in-flight gauge, the labels), that the request path makes no call to the metric API and a
flush one call per changed series, the order of deletion, the stub driving them (through the fake
``triton_python_backend_utils`` and fake worker of test_stub.py, the execution timeout included),
the stub carrying on when the API is missing or fails, the worker's duration field in final
replies, and the switch (``TritonConfig.callable_metrics``, ``allow_metrics``).
"""

from __future__ import annotations

import os
import pathlib
import secrets
import socket
import time

import numpy as np
import pytest

from pytriton.model_config.tensor import Tensor
from pytriton.model_config.triton_model_config import TritonModelConfig
from pytriton.proxy._binding import _resolve_tensors
from pytriton.proxy._worker import InstanceWorker
from pytriton.proxy.stubside import _messages, _segments, _stub_metrics, _tensors, _wire
from pytriton.server.triton_config import TritonConfig
from tests.unit import test_stub
from tests.unit.test_stub import TIMEOUT_S, FakeRequest, _ok

# The stub imported against test_stub.py's fake triton_python_backend_utils, its fake workers, a thread.
stub, setup, pool = test_stub.stub, test_stub.setup, test_stub.pool

LABELS = {"model": "Unit", "version": "1", "instance": "0", "generation": "0"}


class FakeMetricApi:
    """``pb_utils.MetricFamily`` and its ``Metric``: counts every call (each an IPC in the real backend)."""

    def __init__(self, fail_on=None):
        self.calls = 0
        self.values = {}  # (family name, sorted label items) -> value
        self.deletions = []  # "metric" / "family", in order
        api = self

        class FakeMetric:
            def __init__(self, family, labels):
                self._family_name, self._kind = family.name, family.kind  # no reference to the family
                self._key = (family.name, tuple(sorted(labels.items())))
                api.values[self._key] = 0.0

            def increment(self, value):
                api.calls += 1
                if fail_on == "increment":
                    raise RuntimeError("the server is gone")
                assert self._kind == MetricFamily.COUNTER and value > 0, (self._key, value)
                api.values[self._key] += value

            def set(self, value):
                api.calls += 1
                assert self._kind == MetricFamily.GAUGE, self._key
                api.values[self._key] = value

            def __del__(self):
                api.deletions.append("metric")

        class MetricFamily:
            COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

            def __init__(self, name, description, kind):
                api.calls += 1
                if fail_on == "family":
                    raise RuntimeError("metrics are not supported")
                assert description and kind in (self.COUNTER, self.GAUGE)
                self.name, self.kind = name, kind

            def Metric(self, labels, buckets=None):  # noqa: N802 - the backend's name
                api.calls += 1
                assert buckets is None and all(isinstance(value, str) for value in labels.values())
                return FakeMetric(self, labels)

            def __del__(self):
                api.deletions.append("family")

        self.MetricFamily = MetricFamily

    def value(self, name, **labels):
        return self.values[(name, tuple(sorted({**LABELS, **labels}.items())))]

    def has(self, name, **labels):
        return (name, tuple(sorted({**LABELS, **labels}.items()))) in self.values


def test_batches_the_short_path_appended_are_counted_at_the_flush_and_bounded():
    """The backend kind's short path appends ``(requests, seconds, failed)`` and nothing else."""
    api = FakeMetricApi()
    metrics = _started(api)
    try:
        created = api.calls
        metrics.finished.append((2, 0.003, False))
        metrics.finished.append((1, 0.2, True))
        assert api.calls == created and metrics.totals().size_sum == 0  # nothing counted, nothing pushed yet
        metrics.flush()
        assert not metrics.finished
        assert api.value(_stub_metrics.BATCH_SIZE + "_sum") == 3
        assert api.value(_stub_metrics.BATCH_SIZE + "_count") == 2
        assert api.value(_stub_metrics.DURATION + "_sum") == pytest.approx(0.203)
        assert api.value(_stub_metrics.DURATION + "_bucket", le="0.005") == 1
        assert api.value(_stub_metrics.ERRORS) == 1
        # A flusher that stopped (metrics off after an API failure) lets no list grow without end.
        for _ in range(_stub_metrics._FINISHED_MAX + 10):
            metrics.finished.append((1, 0.001, False))
        assert len(metrics.finished) == _stub_metrics._FINISHED_MAX
        # Counted by the flusher into counts of its own, added to the request path's.
        metrics.enter(4)
        metrics.settled(_final(_messages.ERROR, 0.01))
        metrics.leave()
        metrics.counted()
        totals = metrics.totals()
        assert totals.size_sum == 3 + 4 + _stub_metrics._FINISHED_MAX and totals.errors == 2
        assert metrics.size_sum == 4 and metrics.errors == 1  # the request path's own, untouched by the flusher
    finally:
        metrics.close()
    assert not metrics.finished  # close() counted and pushed the rest


def _started(api, **kwargs):
    metrics = _stub_metrics.StubMetrics(
        api, model="Unit", version="1", instance=0, interval_s=3600, **{"max_batch_size": 4, **kwargs}
    )
    metrics.start()
    assert metrics.created.wait(TIMEOUT_S)
    return metrics


def _final(kind, duration=None):
    final = {
        _messages.OK: _messages.Ok(None, []),
        _messages.ERROR: _messages.Error("E: x"),
        _messages.END: _messages.End(),
    }[kind]
    return final if duration is None else final.settled(False, duration)


# -- StubMetrics -----------------------------------------------------------------------------------


def test_bucket_bounds():
    assert _stub_metrics.batch_size_bounds(4) == (1, 2, 4)
    assert _stub_metrics.batch_size_bounds(100) == (1, 2, 4, 8, 16, 32, 64, 100)
    assert _stub_metrics.batch_size_bounds(0) == (1,)  # no batching: one request per batch
    assert len(_stub_metrics.batch_size_bounds(1 << 30)) == 16
    assert [_stub_metrics.le_text(bound) for bound in (0.00025, 1.0, 60.0, 4, float("inf"))] == [
        "0.00025",
        "1",
        "60",
        "4",
        "+Inf",
    ]


def test_flush_exports_histograms_counters_and_gauges():
    api = FakeMetricApi()
    metrics = _started(api)
    try:
        created = api.calls
        assert api.value(_stub_metrics.DURATION + "_bucket", le="+Inf") == 0  # every series exists from the start
        batches = [
            (2, _messages.OK, 0.003),
            (1, _messages.ERROR, 0.0004),
            (3, _messages.END, 0.2),
            (4, _messages.OK, None),
        ]
        for size, kind, duration in batches:
            metrics.enter(size)
            assert metrics.in_flight == size
            metrics.settled(_final(kind, duration))
            metrics.leave()
        metrics.reconnected()
        metrics.enter(2)  # still executing at the flush
        assert api.calls == created, "the request path must not call the metric API"
        metrics.flush()
        flushed = api.calls - created
        bucket = _stub_metrics.DURATION + "_bucket"
        assert [api.value(bucket, le=le) for le in ("0.0001", "0.0005", "0.001", "0.005", "0.25", "60", "+Inf")] == [
            0,
            1,
            1,
            2,
            3,
            3,
            3,
        ]
        assert api.value(_stub_metrics.DURATION + "_count") == 3  # the last batch carried no duration
        assert api.value(_stub_metrics.DURATION + "_sum") == pytest.approx(0.2034)
        size_bucket = _stub_metrics.BATCH_SIZE + "_bucket"
        assert [api.value(size_bucket, le=le) for le in ("1", "2", "4", "+Inf")] == [1, 3, 5, 5]
        assert api.value(_stub_metrics.BATCH_SIZE + "_sum") == 12  # requests
        assert api.value(_stub_metrics.BATCH_SIZE + "_count") == 5  # batches
        assert api.value(_stub_metrics.ERRORS) == 1
        assert api.value(_stub_metrics.RECONNECTS) == 1
        assert api.value(_stub_metrics.IN_FLIGHT) == 2
        assert flushed <= len(metrics._series)  # one call per changed series at most
        metrics.flush()
        assert api.calls == created + flushed, "nothing changed: a flush makes no call"
        metrics.leave()
        metrics.settled(_messages.Chunk(None, []))  # not a final reply: ignored
    finally:
        metrics.close()
    assert api.value(_stub_metrics.IN_FLIGHT) == 0  # close() pushed the last change
    assert "family" in api.deletions and "metric" not in api.deletions[api.deletions.index("family") :]


def test_every_series_carries_the_stubs_generation():
    # Two live stubs never share a label set: Triton 2.51 frees a shared series once per stub.
    api = FakeMetricApi()
    _started(api, generation=3).close()
    assert api.values and all(dict(labels)["generation"] == "3" for _, labels in api.values)
    assert {dict(labels)["instance"] for _, labels in api.values} == {"0"}


def test_the_flusher_thread_pushes_by_itself():
    api = FakeMetricApi()
    metrics = _stub_metrics.StubMetrics(api, model="Unit", version="1", instance=0, interval_s=0.01)
    metrics.start()
    try:
        metrics.enter(1)
        metrics.settled(_final(_messages.OK, 0.01))
        metrics.leave()
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and not (
            api.has(_stub_metrics.DURATION + "_count") and api.value(_stub_metrics.DURATION + "_count") == 1
        ):
            time.sleep(0.01)
        assert api.value(_stub_metrics.DURATION + "_count") == 1
        assert api.value(_stub_metrics.BATCH_SIZE + "_sum") == 1
    finally:
        metrics.close()
    assert not metrics._thread.is_alive()


def test_a_failing_api_is_logged_once_and_counting_goes_on(capsys):
    api = FakeMetricApi(fail_on="family")
    metrics = _started(api)
    metrics.enter(1)
    metrics.leave()
    metrics.flush()
    metrics.finished.append((1, 0.001, False))  # the short path's append: kept nowhere, as nothing is pushed
    assert not metrics.finished
    metrics.close()
    assert capsys.readouterr().err.count("the metrics of model 'Unit' (instance 0) are off") == 1
    api = FakeMetricApi(fail_on="increment")
    metrics = _started(api)
    for _ in range(2):
        metrics.enter(1)
        metrics.flush()
    metrics.close()
    err = capsys.readouterr().err
    assert err.count("could not update them (RuntimeError: the server is gone)") == 1


def test_create_is_null_when_off_or_unsupported(capsys):
    assert _stub_metrics.create(FakeMetricApi(), False, model="Unit", version="1", instance=0) is _stub_metrics.NULL
    assert capsys.readouterr().err == ""
    unsupported = object()  # a backend without MetricFamily (an older Triton)
    assert _stub_metrics.create(unsupported, True, model="Unit", version="1", instance=0) is _stub_metrics.NULL
    assert "has no custom-metric API" in capsys.readouterr().err


def test_the_log_goes_through_the_backend_logger_when_it_has_one(capsys):
    logged = []

    class Logger:
        @staticmethod
        def log_warn(text):
            logged.append(text)

    _stub_metrics.log(type("pb_utils", (), {"Logger": Logger}), "hello")
    assert logged == ["hello"] and capsys.readouterr().err == ""


# -- through the stub (fakes of test_stub.py) ------------------------------------------------------


def test_the_stub_counts_batches_errors_and_durations(setup, pool, monkeypatch):
    api = FakeMetricApi()
    monkeypatch.setattr(setup.stub.pb_utils, "MetricFamily", api.MetricFamily, raising=False)
    worker = setup.worker()
    model = setup.model(metrics=True)
    channel = worker.channel()
    assert model._metrics.created.wait(TIMEOUT_S)
    # Two requests answered OK after 3 ms of callable, then one that failed after 0.5 s.
    future = pool.submit(model.execute, [FakeRequest({"x": np.ones(1)}), FakeRequest({"x": np.ones(1)})])
    channel.recv()
    channel.send(_ok(None, [{"y": np.ones(1)}] * 2).settled(False, 0.003))
    assert all(response.error is None for response in future.result(TIMEOUT_S))
    future = pool.submit(model.execute, [FakeRequest({"x": np.ones(1)})])
    channel.recv()
    assert model._metrics.in_flight == 1
    channel.send(_messages.Error("ValueError: bad").settled(False, 0.5))
    (response,) = future.result(TIMEOUT_S)
    assert response.error.message() == "ValueError: bad"
    assert model._metrics.in_flight == 0
    setup.finalize(model)  # pushes the last changes
    assert api.value(_stub_metrics.BATCH_SIZE + "_sum") == 3 and api.value(_stub_metrics.BATCH_SIZE + "_count") == 2
    assert api.value(_stub_metrics.DURATION + "_bucket", le="0.005") == 1
    assert api.value(_stub_metrics.DURATION + "_bucket", le="0.5") == 2
    assert api.value(_stub_metrics.DURATION + "_sum") == pytest.approx(0.503)
    assert api.value(_stub_metrics.ERRORS) == 1 and api.value(_stub_metrics.IN_FLIGHT) == 0
    assert api.value(_stub_metrics.RECONNECTS) == 0


def test_the_stub_counts_a_reconnect_after_the_execution_timeout(setup, pool, monkeypatch):
    api = FakeMetricApi()
    monkeypatch.setattr(setup.stub.pb_utils, "MetricFamily", api.MetricFamily, raising=False)
    worker = setup.worker()
    model = setup.model(metrics=True, execution_timeout_s=0.2)
    channel = worker.channel()
    future = pool.submit(model.execute, [FakeRequest({"x": np.ones(1)})])
    channel.recv()  # and never answer
    (response,) = future.result(TIMEOUT_S)
    assert "execution timeout" in response.error.message()
    worker.channel()  # the stub connected again
    setup.finalize(model)
    assert api.value(_stub_metrics.RECONNECTS) == 1
    assert api.value(_stub_metrics.ERRORS) == 0  # not a failure of the callable
    assert api.value(_stub_metrics.BATCH_SIZE + "_count") == 1 and api.value(_stub_metrics.IN_FLIGHT) == 0


def test_the_stub_serves_without_the_metric_api(setup, pool, capsys):
    assert not hasattr(setup.stub.pb_utils, "MetricFamily")
    worker = setup.worker()
    model = setup.model(metrics=True)
    channel = worker.channel()
    assert model._metrics is _stub_metrics.NULL
    future = pool.submit(model.execute, [FakeRequest({"x": np.ones(1)})])
    channel.recv()
    channel.send(_ok(None, [{"y": np.full(1, 2.0)}]).settled(False, 0.001))
    (response,) = future.result(TIMEOUT_S)
    assert response.error is None and response.outputs()["y"][0] == 2.0
    assert capsys.readouterr().err.count("has no custom-metric API") == 1


# -- the worker's duration field -------------------------------------------------------------------


@pytest.fixture()
def worker_channel(tmp_path):
    """``worker_channel(func, metrics, decoupled=False)`` -> a Channel to a running worker (HELLO done)."""
    prefix = f"pytriton-{os.getpid()}-metr{secrets.token_hex(3)}"
    workers, sockets = [], []

    def make(func, metrics, decoupled=False):
        config = TritonModelConfig(
            model_name="Metr",
            batching=True,
            max_batch_size=4,
            decoupled=decoupled,
            inputs=_resolve_tensors([Tensor(name="x", shape=(-1,), dtype=np.float32)], "INPUT", "Metr"),
            outputs=_resolve_tensors([Tensor(name="y", shape=(-1,), dtype=np.float32)], "OUTPUT", "Metr"),
        )
        worker = InstanceWorker(
            path=str(tmp_path / f"w{len(workers)}.sock"),
            infer_func=func,
            config=config,
            strict=False,
            shm_prefix=f"{prefix}-w",
            on_unrecoverable=lambda exc: None,
            name=f"Metr-{len(workers)}",
            metrics=metrics,
        )
        worker.start()
        workers.append(worker)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT_S)
        sock.connect(worker._path)
        sockets.append(sock)
        channel = _wire.SocketChannel(sock)
        channel.send(_messages.Hello(os.getpid(), 0))
        assert type(channel.recv()) is _messages.Welcome
        return channel

    yield make
    for sock in sockets:
        sock.close()
    for worker in workers:
        worker.stop()
    _segments.sweep_segments(prefix)


def _send_infer(channel, x):
    segment, metas = _tensors.write_tensors(None, [[("x", x)]])
    channel.send(_messages.Infer(segment, [_messages.Entry(metas[0])]))


def _final_reply(channel):
    while True:
        message = channel.recv()
        if isinstance(message, (_messages.Ok, _messages.Error, _messages.End)):
            return message
        channel.send(_messages.NEXT_MESSAGE)  # a chunk (small: acknowledged after each one is harmless)


def test_the_worker_measures_the_callable_around_the_call(worker_channel):
    def sleepy(requests):
        time.sleep(0.05)
        if requests[0]["x"][0, 0] < 0:
            raise ValueError("negative")
        return [{"y": request["x"]} for request in requests]

    channel = worker_channel(sleepy, metrics=True)
    _send_infer(channel, np.ones((1, 1), np.float32))
    reply = channel.recv()
    assert type(reply) is _messages.Ok and not reply.retire
    assert reply.duration_s >= 0.05
    _send_infer(channel, -np.ones((1, 1), np.float32))
    reply = channel.recv()
    assert reply.text == "ValueError: negative" and reply.duration_s >= 0.05

    plain = worker_channel(sleepy, metrics=False)
    _send_infer(plain, np.ones((1, 1), np.float32))
    reply = plain.recv()
    assert type(reply) is _messages.Ok and reply.duration_s is None


def test_a_streams_duration_lasts_until_its_generator_finished(worker_channel):
    def stream(requests):
        for _ in range(3):
            time.sleep(0.02)
            yield [{"y": request["x"]} for request in requests]

    channel = worker_channel(stream, metrics=True, decoupled=True)
    _send_infer(channel, np.ones((1, 1), np.float32))
    final = _final_reply(channel)
    assert type(final) is _messages.End and final.duration_s >= 0.06


def test_the_duration_field_keeps_the_retire_flag_readable():
    for final in (_messages.Ok(None, []), _messages.Error("boom"), _messages.End()):
        timed = final.settled(True, 0.25)
        assert timed.retire and timed.duration_s == 0.25
        assert final.duration_s is None
    assert _messages.Ok("s", [[]], True).settled(True, 1.0).retire is True


# -- the switch ------------------------------------------------------------------------------------


def test_the_switch(monkeypatch):
    from pytriton.server.settings import resolve

    assert resolve(TritonConfig(), environ={}).callable_metrics is True  # on by default
    assert resolve(TritonConfig(callable_metrics=False), environ={}).callable_metrics is False
    assert resolve(TritonConfig(allow_metrics=False), environ={}).callable_metrics is False  # no /metrics
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_CALLABLE_METRICS", "off")
    assert resolve(None).callable_metrics is False
    from pytriton._serving.plan import LaunchPlan
    from pytriton.server.command import LaunchSettings

    argv = LaunchPlan.build(
        pathlib.Path("/bin/tritonserver"),
        TritonConfig(callable_metrics=False),
        LaunchSettings(
            model_repository=pathlib.Path("/r"),
            backend_directory=pathlib.Path("/b"),
            cache_directory=None,
            shm_region_prefix="p",
        ),
    ).to_argv()
    assert not any("callable" in arg for arg in argv)  # pytriton's own setting, not a server flag
