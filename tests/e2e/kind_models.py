"""Callables of e2e test modules that serve them on every instance kind (tests/e2e/_kinds.py).

A backend instance's stub unpickles its callable, which imports the callable's module: kept apart
from the test modules so that each stub imports numpy and pytriton only (not pytest, tritonclient
and the tests' fixtures). What a test must observe of a call from another process travels in the
call's outputs or in files (the stub does not share this process's memory).
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import time
import uuid

import numpy as np

from pytriton.decorators import batch, batch_cancelled, current_requests, fill_optionals, first_value, pad_batch

# tests/e2e/test_clients.py


@batch
def add_sub(a, b):
    return {"add": a + b, "sub": a - b}


@batch
def params_echo(x):
    encoded = [json.dumps(r.parameters or {}, sort_keys=True).encode() for r in current_requests()]
    return {"params": np.array([[e] for e in encoded], dtype=object)}


def no_batch(requests):
    return [{"y": r["x"] * 2} for r in requests]


@batch
def slow(x):
    time.sleep(float(x[0, 0]))
    return {"y": x}


def fails(requests):
    raise KeyError("missing vocabulary entry")


@batch
def tokens(n):
    for step in range(int(n[0, 0])):
        yield {"token": np.full((len(n), 1), step, dtype=np.int32)}


# tests/e2e/test_cancellation.py: the callables write what they saw into files of ``directory``
# (``<tag>.started`` when called, ``<tag>.seen`` holding ``[time.monotonic(), Request.timeout_s]``
# when they saw the cancellation; CLOCK_MONOTONIC is the same in every process of the host).

CANCEL_CAP_S = 10.0  # no callable here runs longer than this, whatever happens
LINGER_S = 0.2  # how long Watch waits to answer once it saw its request cancelled


def _note(directory, tag, suffix, value=None):
    path = f"{directory}/{tag}.{suffix}"
    with open(path + ".tmp", "w") as file:
        json.dump(value, file)
    os.replace(path + ".tmp", path)  # whole or absent for the reader


class Watch:
    """Polls ``is_cancelled()`` until it turns true (or CANCEL_CAP_S); output 1 if it did."""

    def __init__(self, directory):
        self.directory = directory

    def __call__(self, requests):
        request = requests[0]
        tag = int(request["tag"].flat[0])
        _note(self.directory, tag, "started")
        deadline = time.monotonic() + CANCEL_CAP_S
        while time.monotonic() < deadline:
            if request.is_cancelled():
                _note(self.directory, tag, "seen", [time.monotonic(), request.timeout_s])
                # Answer a little later: the server sees a gRPC deadline pass about when the client
                # does, so an answer at once could reach a client whose own deadline had not fired yet.
                time.sleep(LINGER_S)
                return [{"seen": np.array([1], np.int32)}]
            time.sleep(0.001)
        return [{"seen": np.array([0], np.int32)}]


class CountRuns:
    """Notes every request it runs (``<tag>.ran``), then sleeps ``seconds`` (a second for a negative tag)."""

    def __init__(self, directory, seconds):
        self.directory = directory
        self.seconds = seconds

    def __call__(self, requests):
        for request in requests:
            _note(self.directory, int(request["tag"].flat[0]), "ran")
        time.sleep(self.seconds if int(requests[0]["tag"].flat[0]) >= 0 else 1.0)
        return [{"seen": request["tag"]} for request in requests]


class WatchBatch:
    """Polls ``batch_cancelled()`` (the batch's view) until it turns true (or CANCEL_CAP_S); bound under ``@batch``."""

    def __init__(self, directory):
        self.directory = directory

    def __call__(self, tag):
        deadline = time.monotonic() + CANCEL_CAP_S
        while time.monotonic() < deadline:
            if batch_cancelled():
                _note(self.directory, int(tag.flat[0]), "seen", [time.monotonic(), None])
                break
            time.sleep(0.001)
        return {"seen": np.ones_like(tag)}


# tests/e2e/test_limits.py


def identity(requests):
    return [dict(request.items()) for request in requests]


def float64_out(requests):
    return [{"y": r["x"].astype(np.float64)} for r in requests]


def object_out(requests):
    return [{"y": r["x"].astype(object)} for r in requests]


def extra_dims(requests):
    return [{"y": r["x"][..., None]} for r in requests]


def widened(requests):
    return [{"y": r["x"].astype(np.int16)} for r in requests]


def only_first(requests):
    # Returns only the first output the client asked for (Triton lists all when it named none).
    return [{sorted(r.requested_output_names or ["a", "b"])[0]: r["x"]} for r in requests]


def stream_identity(requests):
    yield [{"x": r["x"]} for r in requests]
    yield [{"x": r["x"] + 1} for r in requests]


# tests/e2e/test_metrics.py


class Metered:
    """Doubles ``x`` (bound under ``@batch``); raises on a negative input; for the input 7 creates
    ``running`` in ``directory`` and waits (30 s at most) until ``release`` exists there."""

    def __init__(self, directory):
        self.directory = directory

    def __call__(self, x):
        if (x < 0).any():
            raise ValueError("negative input")
        if (x == 7).any():
            _note(self.directory, "state", "running")
            deadline = time.monotonic() + 30
            while not os.path.exists(f"{self.directory}/state.release") and time.monotonic() < deadline:
                time.sleep(0.005)
        return {"y": x * 2}


# tests/e2e/test_versions.py


class Constant:
    """Answers ``value`` for each ``x`` (bound under ``@batch``)."""

    def __init__(self, value):
        self.value = value

    def __call__(self, x):
        return {"y": np.full_like(x, self.value)}


# tests/e2e/test_warmup.py


def _ready(http_url, path):
    host, port = http_url[len("http://") :].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", path)
        return connection.getresponse().status == 200
    except OSError:  # endpoints not open yet
        return False
    finally:
        connection.close()


def _texts(array):
    return [
        [item.decode("latin-1") if isinstance(item, bytes) else str(item) for item in row] for row in array.tolist()
    ]


class Recorder:
    """A decorated callable that notes every batch, and whether model ``name`` was ready while it
    ran, as ``call-<n>.json`` in ``directory`` (read back by :func:`recorded`)."""

    def __init__(self, http_url, name, directory):
        self.http_url = http_url
        self.name = name
        self.directory = directory
        self.count = 0

    @fill_optionals(scale=np.array([2.0], dtype=np.float32))
    @batch
    @pad_batch
    @first_value("scale")
    def __call__(self, x, label, scale):
        ready = _ready(self.http_url, f"/v2/models/{self.name}/ready")
        call = {"x": x.tolist(), "label": _texts(label), "scale": float(scale), "ready": ready}
        if ready is False:
            call["server_ready"] = _ready(self.http_url, "/v2/health/ready")
        self.count += 1
        _note(self.directory, f"call-{self.count:04d}", "json", call)
        return {"y": x * scale}


class EchoRecorder:
    """Echoes each input as ``<name>_out`` (bound under ``@batch``) and notes the inputs of every
    batch as ``call-<n>.json`` in ``directory``."""

    def __init__(self, directory):
        self.directory = directory
        self.count = 0

    def __call__(self, **inputs):
        self.count += 1
        _note(
            self.directory, f"call-{self.count:04d}", "json", {name: array.tolist() for name, array in inputs.items()}
        )
        return {f"{name}_out": array for name, array in inputs.items()}


def recorded(directory):
    """The calls a :class:`Recorder` or :class:`EchoRecorder` noted in ``directory``, in order."""
    calls = []
    for path in sorted(pathlib.Path(directory).glob("call-*.json")):
        calls.append(json.loads(path.read_text()))
    return calls


def refuses(requests):
    raise ValueError("cannot warm up: weights missing")


# tests/e2e/test_tracing.py

SPANS_FILE = "spans.jsonl"  # in a Traced's directory: one finished span a line (see Traced)


@batch
def _doubled(k):
    return {"y": k * 2}


class Traced:
    """Opens a span of its own (``user_work``) for each request and doubles ``k``.

    Unpickled (in a backend instance's stub) into a process without a tracer provider, it sets one
    that writes every finished span of that process as a JSON line into ``directory``/SPANS_FILE:
    the test's in-memory exporter only sees the spans of the test's own process."""

    def __init__(self, directory):
        self.directory = directory

    def __setstate__(self, state):
        self.__dict__.update(state)
        from opentelemetry import trace

        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            trace.set_tracer_provider(_file_provider(os.path.join(self.directory, SPANS_FILE)))

    def __call__(self, requests):
        for request in requests:
            with request.traced_span("user_work"):
                pass
        return _doubled(requests)


def untraced(requests):
    return [{"y": request["k"] * 2} for request in requests]


def _file_provider(path):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class FileExporter(SpanExporter):
        def export(self, spans):
            with open(path, "a") as file:
                for span in spans:
                    file.write(json.dumps(span_record(span)) + "\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    return provider


def span_record(span):
    """What the tracing tests check of a finished span, as plain data."""
    return {
        "name": span.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_span_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "model_name": (span.attributes or {}).get("pytriton.model_name"),
    }


# tests/e2e/test_drain.py: a gate is a file; its callable waits (``wait_s`` at most) until it exists.


def _wait_for_file(path, wait_s):
    deadline = time.monotonic() + wait_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)


class Gate:
    """Bound under ``@batch``: notes each batch's size as ``entered-<id>.json`` in ``directory``, waits
    for the gate file ``open`` there, and echoes ``x``."""

    def __init__(self, directory, wait_s):
        self.directory = directory
        self.wait_s = wait_s

    def __call__(self, x):
        _note(self.directory, f"entered-{uuid.uuid4().hex}", "json", len(x))
        _wait_for_file(os.path.join(self.directory, "open"), self.wait_s)
        return {"x": x}


class Hold:
    """Waits for the gate file ``hold`` in ``directory``, and echoes its requests."""

    def __init__(self, directory, wait_s):
        self.directory = directory
        self.wait_s = wait_s

    def __call__(self, requests):
        _wait_for_file(os.path.join(self.directory, "hold"), self.wait_s)
        return [dict(request.items()) for request in requests]


# tests/e2e/test_openai.py

SLOW_TOKENS = 500


class SlowStream:
    """Streams SLOW_TOKENS tokens, 10 ms apart (bound under ``@batch``); when its generator is closed,
    notes how many it had yielded as ``<tag>.closed`` in ``directory`` (the tag: the last message)."""

    def __init__(self, directory):
        self.directory = directory

    def __call__(self, messages):
        tag = json.loads(messages[0, 0])[-1]["content"]
        produced = 0
        _note(self.directory, tag, "started")
        try:
            for produced in range(SLOW_TOKENS):
                time.sleep(0.01)
                yield {"text": np.array([[f"t{produced} ".encode()]], dtype=object)}
        finally:
            _note(self.directory, tag, "closed", produced)


@batch
def gives_up(messages):
    raise ValueError("the model gave up")


# tests/e2e/test_pipeline.py


def outer_naming_the_url(requests, url):
    """A process or backend instance has no Triton of its own: it names the server (and gets a clear error if not)."""
    from pytriton import pipeline

    x = requests[0]["x"]
    handle = pipeline.model("Inner") if float(x.flat[0]) < -100 else pipeline.model("Inner", url=url)
    return [{"y": handle.infer_sample(x)["y"]}]


# tests/e2e/test_memory.py


def fresh_copy(requests):
    return [{"x": request["x"].copy()} for request in requests]


# tests/e2e/test_clients_compat.py


@batch
def ticks(n):
    for step in range(int(n[0, 0])):
        time.sleep(0.1)
        yield {"token": np.full((len(n), 1), step, dtype=np.int32)}


@batch
def breaks(n):
    yield {"token": np.zeros((len(n), 1), dtype=np.int32)}
    if int(n[0, 0]) < 0:
        raise RuntimeError("generator broke on purpose")
    yield {"token": np.ones((len(n), 1), dtype=np.int32)}


# tests/e2e/test_healing.py


class CustomBase(BaseException):
    pass


class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("this exception cannot be printed")


RAISES = [
    ("SystemExit", lambda: SystemExit(3)),
    ("KeyboardInterrupt", lambda: KeyboardInterrupt("pressed inside")),
    ("GeneratorExit", lambda: GeneratorExit("closed inside")),
    ("CustomBase", lambda: CustomBase("a custom BaseException")),
    ("BadStr", BadStr),
]


def raiser(requests):
    kind = int(requests[0]["k"].flat[0])
    if kind >= 0:
        raise RAISES[kind][1]()
    return [{"y": r["k"]} for r in requests]


def raising_stream(requests):
    yield [{"y": r["k"]} for r in requests]
    kind = int(requests[0]["k"].flat[0])
    if kind >= 0:
        raise RAISES[kind][1]()


# tests/e2e/test_remote.py


def identity_to_y(requests):
    return [{"y": request["x"]} for request in requests]


def counting_stream(requests):
    for step in range(20):  # more than one streaming window of inline chunks
        yield [{"y": request["x"] + step} for request in requests]


# tests/e2e/test_unresponsive.py


class HangsOnOne:
    """Echoes ``x``; a batch holding the value 1 first waits (60 s at most) until ``release`` exists in ``directory``."""

    def __init__(self, directory):
        self.directory = directory

    def __call__(self, requests):
        if any(float(request["x"].flat[0]) == 1.0 for request in requests):
            _wait_for_file(os.path.join(self.directory, "release"), 60)
        return [{"y": request["x"]} for request in requests]


def sleeps_for_x(requests):
    """Echoes ``x``; a batch whose first value is above 1 first sleeps that many seconds (20 s at most)."""
    seconds = float(requests[0]["x"].flat[0])
    if seconds > 1.0:
        time.sleep(min(seconds, 20.0))
    return [{"y": request["x"]} for request in requests]


# tests/e2e/test_backend_instances.py


class Weighted:
    """A stateful callable whose weights are numpy objects made in ``__init__`` (in the user's process).

    Bound with instance_kind="backend" it is pickled under the user's numpy and unpickled by the
    stub's (numpy 1.x beside numpy 2 on Python 3.9-3.12): stubside/_portable_pickle.py.
    """

    def __init__(self) -> None:
        self.weights = np.arange(9, dtype=np.float32).reshape(3, 3).T  # Fortran order: not C-contiguous
        self.bias = np.float32(0.5)
        self.out_type = np.dtype(np.float32)
        self.layers = {"scale": np.array([1.0, 2.0, 3.0], dtype=np.float64)}

    @batch
    def __call__(self, x):
        y = (x @ self.weights) * self.layers["scale"] + self.bias
        return {"y": y.astype(self.out_type)}
