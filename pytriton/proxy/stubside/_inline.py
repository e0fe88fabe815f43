"""The model of a backend instance (``bind(..., instance_kind="backend")``): the callable runs here, in the stub.

``model.py`` (``proxy/_stub_model.py``) loads this model instead of ``_stub``'s proxy when the
version directory holds the payload that ``bind`` wrote (``pytriton_backend.pkl``, mode 0600).
Each batch is handled in this process, as a plain Python-backend model handles it: inputs are read
from Triton's tensors (``_stub._read_input``: numpy 1.x conversions, or DLPack under numpy 2),
wrapped in ``Request`` objects, given to the callable, and its checked outputs become Triton's
tensors. No socket message, no shared-memory arena.

What is shared with the proxy model (``_stub.TritonPythonModel``, subclassed here): the slot claim,
the region privacy, the metrics, the sequence controls, the request size limit and the connection
to the slot's worker in the user's process. The connection carries the hello and, at unload, the
goodbye; no batch. A stub that dies closes it without a goodbye, which is how the user's process
notices the death and loads a new generation (self-healing, docs/architecture.md).

Imports: at load time only what any stub module may import. ``pytriton`` itself (``Request``, the
output checks, the decorators the callable uses) and the callable's modules come from the user's
environment, whose ``sys.path`` entries ``initialize`` appends behind the stub's own before it
imports ``pytriton.proxy._backend_kind`` by name. The stub's numpy (pytriton's private numpy 1.x
environment, or the user's numpy 2 on Python 3.13) is the one the callable sees.

Unit tests: tests/unit/test_backend_kind.py.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import site
import sys
import threading
import time
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Collection,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np
import triton_python_backend_utils as pb_utils

from . import (
    _backend_page,
    _messages,
    _stub,
    _stub_bytes,
    _stub_cancel,
    _stub_dlpack,
    _stub_metrics,
    _stub_print,
    _stub_trace,
    _tensors,
    _wire,
)
from ._pb_types import PbRequest

if TYPE_CHECKING:
    import numpy.typing as npt

    Requested = Optional[Collection[str]]  # the output names a request asked for; None: all of them

PAYLOAD_FILE = "pytriton_backend.pkl"  # pytriton.proxy._backend_kind.PAYLOAD_FILE
_RUNNER_MODULE = "pytriton.proxy._backend_kind"  # imported by name: it lives in the user's environment
_CHECK_EVERY = _messages.STREAM_WINDOW  # a stream asks Triton whether its clients cancelled every this many chunks


class _FailedAsStuck(BaseException):
    """Raised in a call by the watch's signal (``_messages.STUCK_SIGNAL``): not an ``Exception``, so that a
    callable's ``except Exception`` does not swallow it; its batch is answered ``STUCK_TEXT`` (HTTP 503)."""


def _user_path(params: Dict[str, Any]) -> None:
    """Append the user's ``sys.path`` (from the private file) so that ``pytriton`` can be imported."""
    for entry in params.get("backend_path", []):
        if not entry or entry in sys.path:
            continue
        if os.path.basename(entry.rstrip(os.sep)) in ("site-packages", "dist-packages"):
            site.addsitedir(entry)  # its .pth files too: an editable install of pytriton is found through one
        else:
            sys.path.append(entry)


def _input_array(value: _stub.InputValue) -> npt.NDArray[np.generic]:
    """A numpy array from ``_stub._read_input``'s result (BYTES arrive serialized), writable."""
    if isinstance(value, _tensors.SerializedBytes):
        raw = value.data
        data = (memoryview(raw) if isinstance(raw, bytes) else raw.data).cast("B")  # ndarray.data: its memoryview
        return _tensors.deserialize_bytes(data, 0, data.nbytes, tuple(value.shape))
    return _writable(value)


def _writable(array: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
    """``array``, or a copy of it where it is read-only.

    Why: a callable may change its inputs in place (``Request``'s contract). With numpy 2 in the stub
    the inputs come through DLPack, and numpy marks what it imports read-only when the exporter says
    so; only then is the input copied. Inputs read with ``as_numpy`` (numpy 1.x) are writable.
    """
    return array if array.flags.writeable else array.copy()


def _output_tensor(name: str, array: npt.NDArray[np.generic]) -> object:
    if array.dtype.kind in "OSU":  # BYTES: handed to the stub serialized (_stub_bytes)
        return _stub_bytes.output_tensor(pb_utils, name, _tensors.serialize_bytes(array), tuple(array.shape))
    if _stub._NUMPY2:
        return _stub._dlpack_output(name, array)
    return pb_utils.Tensor(name, np.ascontiguousarray(array))


class InlineModel(_stub.TritonPythonModel):
    """Runs the bound callable in this stub process (see the module docstring)."""

    def _initialize(self, args: Dict[str, str]) -> None:
        """Claim a slot and connect as the proxy does, then import and load this slot's callable.

        A callable that cannot be loaded here (a module the stub cannot import, an object that does
        not unpickle) fails the model's load with that error, which ``bind``/``run()`` report.
        """
        super()._initialize(args)
        _stub_print.install(f"{self._model_name}/{self._slot}")  # the callable's print reaches your process
        repository, version = args["model_repository"], args["model_version"]
        params = json.loads(_wire.read_owned(os.path.join(repository, version, _wire.PRIVATE_FILE)))
        _user_path(params)
        # Busy/idle for stop() and the drain's admission budget (_backend_page); None: not provided.
        self._page = _backend_page.Page.open(
            os.path.join(self._endpoint_dir, _backend_page.PAGE_NAME), int(params["slots"])
        )
        try:
            data = _wire.read_owned(os.path.join(repository, version, PAYLOAD_FILE))  # unpickled: only ours
            runner_type = importlib.import_module(_RUNNER_MODULE).InlineRunner
            self._runner = runner_type.load(data, self._slot)
        except BaseException as exc:
            self.finalize()
            raise pb_utils.TritonModelException(
                f"pytriton: the stub of model {self._model_name!r} could not load its callable "
                f"(instance_kind='backend'): {type(exc).__name__}: {exc}"
            ) from None
        self._tracing = importlib.import_module("pytriton.proxy._tracing") if self._trace else None
        # The short path (_execute_short) serves the common case: a model that is not decoupled, not
        # a sequence model, not traced, without BYTES inputs. Why a separate path: a request spends
        # only a few hundred microseconds in the whole server, and the stub runs its Python with
        # caches that the server and the client evicted since the last request, so every extra line
        # per request shows in the latency (docs/architecture.md, "How a backend instance is wired").
        config = json.loads(args["model_config"])
        in_types = [spec.get("data_type") for spec in config.get("input", [])]
        out_types = [spec.get("data_type") for spec in config.get("output", [])]
        self._short = (
            not self._decoupled and self._sequence is None and self._tracing is None and "TYPE_STRING" not in in_types
        )
        # Numeric outputs are checked and made into Triton tensors in one pass (below), by the
        # stub's Tensor under numpy 1.x and through DLPack under numpy 2; BYTES ones by _output_tensor.
        self._plain_outputs = "TYPE_STRING" not in out_types
        self._new_request = self._runner.new_request
        # The short path's state, looked up once: outputs checked and built in one pass where they
        # become Triton tensors as they are; the page's views (it writes them inline).
        self._fused: Optional[Callable[..., Optional[List[object]]]] = None
        # A model with one numeric output: its spec for the short path's inline check (else None).
        self._one: Optional[Tuple[str, object, int, int, Tuple[int, ...], bool]] = None
        if self._plain_outputs:
            self._fused = self._runner.checker.responses
            self._one = self._runner.checker.single()
        self._page_ints: Optional[memoryview[int]] = None
        self._page_floats: Optional[memoryview[float]] = None
        self._page_item = 0
        if self._page is not None:
            self._page_ints, self._page_floats, self._page_item = self._page.views(self._slot)
        if self._short:
            # Triton calls model.execute: the short path is the instance's execute, one call less per batch.
            self.execute = self._execute_short  # type: ignore[method-assign]
        # The unresponsive-model watch fails a stuck call with a signal (_messages.STUCK_SIGNAL) rather than
        # by killing the stub: the handler runs on the main thread, which runs execute, between two bytecodes
        # of the call (a sleep or a wait is interrupted). 0.0: no call in progress, or it began just now.
        self._call_started = 0.0
        if threading.current_thread() is threading.main_thread():
            signal.signal(_messages.STUCK_SIGNAL, self._on_stuck_signal)

    def _on_stuck_signal(self, signum: int, frame: object) -> None:
        started = self._call_started
        if started and time.monotonic() - started >= _messages.STUCK_MIN_AGE_S:
            self._call_started = 0.0
            raise _FailedAsStuck()

    def finalize(self) -> None:
        runner = getattr(self, "_runner", None)
        if runner is not None:
            runner.close()
        page = getattr(self, "_page", None)
        if page is not None:
            self._page_ints = self._page_floats = None  # the page's views: close() releases them
            page.close()
            self._page = None
        super().finalize()

    def execute(self, requests: List[PbRequest]) -> Optional[List[object]]:
        """Run one batch through the callable here; refused with UNAVAILABLE once a drain has spent its budget.

        A model on the short path never comes here: ``initialize`` makes ``_execute_short`` its
        ``execute``, which does the same in one function.
        """
        return self._gated(requests, self._execute_general)

    def _execute_general(self, requests: List[PbRequest]) -> Optional[List[object]]:
        page = self._page
        if page is None:
            return self._counted(requests)
        if page.draining() and not page.admit(len(requests)):
            return self._fail(requests, _messages.UNAVAILABLE_TEXT)
        page.enter(self._slot)
        try:
            return self._counted(requests)
        finally:
            page.leave(self._slot)
            self._report_unrecoverable()

    def _report_unrecoverable(self) -> None:
        """Hand a ``PyTritonUnrecoverableError`` of the callable to the user's process (``BackendInstance``), which stops the server."""
        text = self._runner.unrecoverable
        if text is not None and self._page is not None:
            self._page.report_unrecoverable(text)
            self._runner.unrecoverable = None

    def _execute_short(self, requests: List[PbRequest]) -> Optional[List[object]]:
        """What ``execute`` does, for the common case (``self._short``), in one function.

        Why one function: the stub's Python runs with caches that the server and the client evicted
        since the last request, so each call, attribute and intermediate list costs far more than
        a benchmark loop shows (the whole path took about 25 us more than a plain model's execute,
        for a few microseconds of warm Python; docs/performance.md). The page is written inline
        (``Page.views``), the metrics get one append (``StubMetrics.finished``), and the outputs
        are checked and made into responses in one pass (inline for a model with one output,
        ``OutputChecker.single``; else ``OutputChecker.responses``).

        Anything unusual (an input over the size limit, a request that cannot be read) hands the
        whole batch to ``_counted`` before the callable is called, which answers it as always.

        Still worth its copy (issue 43, ``python -m bench.kinds --rounds 3`` with this path forced off in
        a scratch copy, 2026-11-29): the general path took the backend kind to 1.19x the plain model's
        HTTP p50, 1.42x its CPU per request and 0.81x its throughput with 32 in flight, against
        1.04-1.13x, 0.87-1.11x and 0.86-0.93x with this path (bench/history.md).
        """
        if (
            time.monotonic() < self._cancel_gate.until
        ):  # right after a long batch: drop what was cancelled (_stub_cancel)
            return self._gated(requests, self._execute_general)
        page_ints = self._page_ints
        item = self._page_item
        if page_ints is not None:
            # draining, and its budget is spent (page_ints is set only with a page)
            if page_ints[0] and not self._page.admit(len(requests)):  # type: ignore[union-attr]
                return self._fail(requests, _messages.UNAVAILABLE_TEXT)
            page_ints[item] = 1  # busy
        runner = self._runner
        metrics = self._metrics
        n_requests = len(requests)
        failed: Optional[bool] = None  # None: the callable was not called here
        started = 0.0
        try:
            new_request = self._new_request
            limit = self._max_request_bytes
            single = self._single_output
            numpy2 = _stub._NUMPY2
            make_tensor = _stub._dlpack_output if numpy2 else pb_utils.Tensor  # numeric outputs, one pass (below)
            batch: List[object] = []
            per_request: List[Requested] = []  # what each request asked for (models with several outputs)
            probe = runner.probe_type(requests)  # Request.is_cancelled() asks Triton's request through it
            unusual = False
            try:
                for request in requests:
                    data = {}
                    size = 0  # summed here: a generator expression cost 3-7 us per request cold, in the real stub
                    for tensor in request.inputs():
                        array = _writable(_stub_dlpack.array(tensor)) if numpy2 else tensor.as_numpy()
                        data[tensor.name()] = array
                        size += array.nbytes
                    if limit and size > limit:
                        unusual = True
                        break
                    raw_parameters = request.parameters()
                    names = None
                    if not single:
                        names = list(request.requested_output_names() or ()) or None
                        per_request.append(names)
                    timeout_us = request.timeout()
                    parameters = json.loads(raw_parameters) if raw_parameters != "{}" else None
                    batch.append(
                        new_request(
                            data, parameters, names, timeout_us / 1e6 if timeout_us else None, probe, len(batch)
                        )
                    )
            except Exception:  # noqa: BLE001 - a malformed request: the full path names it
                unusual = True
            if unusual:  # outside the try: the callable must never run twice for one batch
                return self._counted(requests)
            if metrics is not _stub_metrics.NULL:
                metrics.in_flight = n_requests  # type: ignore[attr-defined]  # a StubMetrics (the NULL one has none)
            failed = True
            started = time.monotonic()
            try:
                self._call_started = started  # until the callable's result is in (_on_stuck_signal)
                result = runner.func(batch)
                if type(result) is not list:
                    result = runner.resolve(result)
                self._call_started = 0.0
                responses = None
                one = self._one
                if one is not None:
                    # One declared output: OutputChecker.check()'s fast-path test, inline (a call to
                    # OutputChecker.responses cost 3-5 us more per batch, cold, in the real stub).
                    # Anything else leaves responses None, and check() below converts or names it.
                    if type(result) is list and len(result) == n_requests:
                        name, dtype, ndim, offset, shape, any_size = one
                        make_response = pb_utils.InferenceResponse
                        built: List[object] = []
                        for outputs in result:
                            value = outputs.get(name) if type(outputs) is dict and len(outputs) == 1 else None
                            if (
                                type(value) is not np.ndarray
                                or value.dtype is not dtype
                                or value.ndim != ndim
                                or not (any_size or value.shape[offset:] == shape)
                            ):
                                break
                            built.append(make_response([make_tensor(name, value)]))
                        else:
                            responses = built
                elif self._fused is not None:
                    responses = self._fused(
                        make_tensor, pb_utils.InferenceResponse, result, n_requests, None if single else per_request
                    )
                if responses is None:
                    groups = runner.outputs(result, n_requests, None if single else per_request)
                    requested = [None] * n_requests if single else per_request  # the rare path: a list is fine
                    responses = [self._response(group, names) for group, names in zip(groups, requested)]
                failed = False
                return responses
            except BaseException as exc:  # noqa: BLE001 - every exception fails this batch only
                self._call_started = 0.0
                if type(exc) is _FailedAsStuck:  # failed by the watch: retryable, and not the callable's error
                    return self._fail(requests, _messages.STUCK_TEXT)
                return self._fail(requests, runner.failure(exc))
        finally:
            ended = time.monotonic()
            if ended - started >= _stub_cancel.CHECK_AFTER_S and failed is not None:  # requests may queue behind it
                self._cancel_gate.until = ended + _stub_cancel.GAP_S
            if page_ints is not None:
                self._page_floats[item + 1] = ended  # type: ignore[index]  # last_active; set with page_ints
                page_ints[item] = 0
            if failed is not None and metrics is not _stub_metrics.NULL:
                metrics.in_flight = 0  # type: ignore[attr-defined]
                metrics.finished.append((n_requests, ended - started, failed))  # type: ignore[attr-defined]
            if runner.unrecoverable is not None:
                self._report_unrecoverable()

    def _counted(self, requests: List[PbRequest]) -> Optional[List[object]]:
        metrics = self._metrics
        if metrics is _stub_metrics.NULL:
            return self._execute(requests)
        metrics.enter(len(requests))
        try:
            return self._execute(requests)
        finally:
            metrics.leave()

    def _execute(self, requests: List[PbRequest]) -> Optional[List[object]]:
        runner = self._runner
        if self._single_output:
            requested: List[Requested] = [None] * len(requests)
        else:
            # Triton gives a set of names (or an empty one): a list, as the proxy path gives, or None for all.
            requested = [list(request.requested_output_names() or ()) or None for request in requests]
        rejected: Dict[int, str] = {}
        batch: List[object] = []
        for index, request in enumerate(requests):
            try:
                built = self._request(request, requested[index])
            except Exception as exc:  # noqa: BLE001 - malformed input: this request only
                rejected[index] = f"pytriton proxy could not read the request: {exc}"
                continue
            if isinstance(built, str):
                rejected[index] = built
            else:
                batch.append(built)
        if rejected:
            return self._reject(requests, rejected)
        runner.attach_cancellation(batch, requests)
        spans = self._start_spans(requests, batch)
        observed = spans is not None or self._metrics is not _stub_metrics.NULL
        started = time.perf_counter() if observed else 0.0
        text: Optional[str] = None
        try:
            self._call_started = time.monotonic()  # until the callable's result is in (_on_stuck_signal)
            result = runner.call(batch)
            self._call_started = 0.0
        except BaseException as exc:  # noqa: BLE001 - every exception fails this batch only
            self._call_started = 0.0
            # Failed by the watch: retryable, and not the callable's error.
            text = _messages.STUCK_TEXT if type(exc) is _FailedAsStuck else runner.failure(exc)
            result = None
        try:
            if text is not None:
                return self._fail(requests, text)
            if not self._decoupled:
                try:
                    groups = runner.outputs(result, len(batch), None if self._single_output else requested)
                    return [self._response(group, names) for group, names in zip(groups, requested)]
                except BaseException as exc:  # noqa: BLE001
                    text = runner.failure(exc)
                    return self._fail(requests, text)
            text = self._run_stream(requests, requested, result if runner.is_stream(result) else iter([result]))
            return None
        finally:
            if observed:
                duration_s = time.perf_counter() - started
                final: Union[_messages.Error, _messages.End] = (
                    _messages.Error(text, False, duration_s) if text is not None else _messages.End(False, duration_s)
                )
                self._metrics.settled(final)
                if spans is not None and self._tracing is not None:
                    self._tracing.end_spans(spans, final)

    def _request(self, request: PbRequest, names: Requested) -> object:
        """The ``Request`` of one Triton request, or the error text that answers it instead."""
        if self._sequence is None and not self._max_request_bytes:  # the common case, on every request
            data = {}
            for tensor in request.inputs():
                value = _stub._read_input(tensor)
                data[tensor.name()] = _input_array(value)
            raw_parameters = request.parameters()
            parameters = json.loads(raw_parameters) if raw_parameters != "{}" else None
            return self._runner.request(data, parameters, names, None, request.timeout() / 1e6)
        tensors = [(tensor.name(), _stub._read_input(tensor)) for tensor in request.inputs()]
        raw_parameters = request.parameters()
        parameters = json.loads(raw_parameters) if raw_parameters != "{}" else None
        sequence = None
        if self._sequence is not None:
            tensors, sequence, parameters = self._sequence_fields(request, tensors, parameters)
            if isinstance(sequence, str):  # a null request or a refused id (_stub._sequence_fields)
                return sequence
        if self._max_request_bytes:
            nbytes = _stub._input_bytes(tensors)
            if nbytes > self._max_request_bytes:
                return self._too_large(nbytes)
        data = {name: _input_array(value) for name, value in tensors}
        return self._runner.request(data, parameters, names, sequence, request.timeout() / 1e6)

    def _start_spans(self, requests: List[PbRequest], batch: List[object]) -> Optional[List[object]]:
        if self._tracing is None:
            return None
        trace = _stub_trace.collect(requests)
        if trace is None:
            return None
        spans: Optional[List[object]] = self._tracing.start_spans(
            trace, batch, self._model_name, int(self._runner.config.model_version)
        )
        return spans

    @staticmethod
    def _response(group: Sequence[Tuple[str, npt.NDArray[np.generic]]], names: Requested) -> object:
        tensors = [_output_tensor(name, array) for name, array in group if names is None or name in names]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _run_stream(
        self, requests: List[PbRequest], requested: List[Requested], stream: Iterator[object]
    ) -> Optional[str]:
        """Send each result of the generator to its clients as it comes; returns the error text, if any.

        Every ``_CHECK_EVERY`` results the clients are asked whether they cancelled; once none is
        left (or Triton refused their responses) the generator is closed. The final flag is sent
        to every client whatever happened.
        """
        runner = self._runner
        senders = [request.get_response_sender() for request in requests]
        live = [True] * len(senders)
        text: Optional[str] = None
        count = 0
        try:
            while any(live):
                try:
                    chunk = next(stream)
                except StopIteration:
                    break
                except BaseException as exc:  # noqa: BLE001 - fails this stream only
                    text = runner.failure(exc)
                    break
                try:
                    groups = runner.outputs(chunk, len(requests))
                    responses = [self._response(group, names) for group, names in zip(groups, requested)]
                except BaseException as exc:  # noqa: BLE001
                    text = runner.failure(exc)
                    break
                self._send(senders, live, responses)
                count += 1
                if count % _CHECK_EVERY == 0:
                    for index, sender in enumerate(senders):
                        live[index] = live[index] and not sender.is_cancelled()
        finally:
            runner.close_stream(stream)
        if text is not None:
            self._send(senders, live, _stub._errors(text, senders))
        for sender in senders:
            try:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception:  # noqa: BLE001 - already closed by Triton (e.g. cancelled)
                pass
        return text
