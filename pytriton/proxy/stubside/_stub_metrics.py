"""The callables' metrics, counted in Triton's Python-backend stub and exported on Triton's ``/metrics``.

Imported by the proxy model (``_stub.py``) in the stub process only, where just the standard
library, numpy and ``triton_python_backend_utils`` exist. It is part of the
stub-side package (``stubside/__init__.py``). Unit tests: tests/unit/test_stub_metrics.py. What
each metric means: docs/metrics.md.

Cost. Every operation of the Python backend's metric API (``Metric.increment``, ``set``,
``observe``) is an inter-process round trip from the stub to the server: 15-40 us each on the
development machine (a one-off benchmark, ``bench/history.md`` names its commit), against a whole request of
0.4-0.6 ms. So nothing calls it on the request path: :class:`StubMetrics` counts in plain Python
attributes there (a few hundred nanoseconds per batch), and a daemon thread of the stub
(``pytriton-metrics``) pushes what changed to Triton every ``FLUSH_INTERVAL_S`` and once more when
the instance is finalized. A scrape therefore lags the stub by at most that interval.

Histograms. One ``observe()`` per batch would cost one round trip per batch, even from the
flushing thread. A histogram is therefore exported as the plain counters a Prometheus histogram
consists of: ``<name>_bucket{le="..."}`` (cumulative), ``<name>_sum`` and ``<name>_count``, each a
COUNTER family, which the flusher raises by what changed since its last push: at most one call
per series per interval, however many batches ran. PromQL treats them exactly as a histogram's
series (``histogram_quantile(0.9, rate(pytriton_callable_duration_seconds_bucket[5m]))``); only the
``# TYPE`` lines say ``counter`` instead of ``histogram``.

Lifetime: :func:`create` returns a started :class:`StubMetrics` (or :data:`NULL` when the metrics
are off or the API is missing); ``close()`` stops the thread, pushes the last changes and deletes
the metrics before their families (the backend's required order). If the API fails (creating or
pushing), the stub logs it once and carries on without metrics.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional, Tuple

from ._messages import End, Error, Message, Ok

if TYPE_CHECKING:
    from ._pb_types import PbMetric

FLUSH_INTERVAL_S = 1.0
# Upper bounds (seconds) of the duration buckets: 100 us to 1 min in 1-2.5-5 steps, then +Inf.
DURATION_BOUNDS: Tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
_MAX_SIZE_BUCKETS = 16
# StubMetrics.finished: batches between two flushes. A stub answers at most some tens of thousands
# of batches a second (each costs tens of microseconds at the least), the flusher drains it every
# FLUSH_INTERVAL_S.
_FINISHED_MAX = 1 << 17

DURATION = "pytriton_callable_duration_seconds"
BATCH_SIZE = "pytriton_batch_size"
ERRORS = "pytriton_callable_errors_total"
RECONNECTS = "pytriton_stub_reconnects_total"
IN_FLIGHT = "pytriton_requests_in_flight"
CANCELLED = "pytriton_requests_cancelled_total"

# name -> (kind, help text); every stub of every model creates the same families (Triton shares them).
_FAMILIES: Dict[str, Tuple[str, str]] = {
    DURATION + "_bucket": ("COUNTER", "pytriton: batches whose callable ran at most le seconds (histogram bucket)"),
    DURATION + "_sum": ("COUNTER", "pytriton: seconds the callable ran, all batches (histogram sum)"),
    DURATION + "_count": ("COUNTER", "pytriton: batches with a measured callable duration (histogram count)"),
    BATCH_SIZE + "_bucket": ("COUNTER", "pytriton: batches of at most le requests (histogram bucket)"),
    BATCH_SIZE + "_sum": ("COUNTER", "pytriton: requests handed to the instance (histogram sum)"),
    BATCH_SIZE + "_count": ("COUNTER", "pytriton: batches handed to the instance (histogram count)"),
    ERRORS: ("COUNTER", "pytriton: batches that failed in the user's process (the callable raised or its result was invalid)"),
    RECONNECTS: ("COUNTER", "pytriton: times the stub abandoned a batch at the execution timeout and reconnected"),
    CANCELLED: ("COUNTER", "pytriton: requests answered as cancelled without running: their client cancelled while they queued"),
    IN_FLIGHT: ("GAUGE", "pytriton: requests of the instance being executed (sampled once per second)"),
}  # fmt: skip


def batch_size_bounds(max_batch_size: int) -> Tuple[int, ...]:
    """Upper bounds of the batch-size buckets: powers of two below ``max_batch_size``, then it (then +Inf)."""
    bounds: List[int] = []
    bound = 1
    while bound < max_batch_size and len(bounds) < _MAX_SIZE_BUCKETS - 1:
        bounds.append(bound)
        bound *= 2
    bounds.append(max(1, max_batch_size))
    return tuple(bounds)


def le_text(bound: float) -> str:
    """A bucket bound as Prometheus clients write it (``0.00025``, ``1``, ``+Inf``)."""
    return "+Inf" if bound == float("inf") else f"{bound:g}"


def log(pb_utils: ModuleType, text: str) -> None:
    """A warning in Triton's log (the server's output, which pytriton forwards), else on stderr."""
    logger = getattr(pb_utils, "Logger", None)
    if logger is not None:
        try:
            logger.log_warn(text)
            return
        except Exception:  # noqa: BLE001 - fall back to stderr, which also reaches the server's output
            pass
    print(text, file=sys.stderr, flush=True)


class Counts:
    """Histogram buckets (per bucket, not cumulative; the last is +Inf), sums and errors."""

    __slots__ = ("duration_counts", "duration_sum", "size_counts", "size_sum", "errors")

    def __init__(
        self, duration_counts: List[int], duration_sum: float, size_counts: List[int], size_sum: int, errors: int
    ):
        self.duration_counts = duration_counts
        self.duration_sum = duration_sum
        self.size_counts = size_counts
        self.size_sum = size_sum
        self.errors = errors


class NullMetrics:
    """The metrics turned off: every call does nothing."""

    def enter(self, n_requests: int) -> None:
        pass

    def leave(self) -> None:
        pass

    def settled(self, final: Message) -> None:
        pass

    def reconnected(self) -> None:
        pass

    def cancelled(self, n_requests: int) -> None:
        pass

    def close(self) -> None:
        pass


NULL = NullMetrics()


class StubMetrics(NullMetrics):
    """One instance's metrics: counted on the request path, pushed to Triton by a thread.

    The request-path methods (:meth:`enter`, :meth:`leave`, :meth:`settled`, :meth:`reconnected`,
    :meth:`cancelled`)
    are called by the stub's execute thread only and touch plain attributes; the flusher reads
    them (single reads and writes of Python objects are atomic under the GIL), so no lock is
    taken per batch. The backend kind's short path only appends to :attr:`finished`, which the
    flusher counts into counts of its own (:meth:`counted`, :meth:`totals`): no counter has two
    writers. A flush may see a batch counted in one series and not yet in another; the next flush
    completes it.
    """

    def __init__(
        self,
        pb_utils: ModuleType,
        *,
        model: str,
        version: str,
        instance: int,
        generation: int = 0,
        max_batch_size: int = 0,
        interval_s: float = FLUSH_INTERVAL_S,
    ):
        self._pb_utils = pb_utils
        self._model = model
        # Every live stub has its own label set: Triton 2.51 frees a series once per stub that created
        # it (each stub's family counts its own references), so two stubs sharing one crashed the
        # server when both were unloaded (``malloc(): unaligned tcache chunk detected`` after a
        # version was unbound). The generation makes them unique: a reload raises it, and within one
        # generation the slot lock (``slot-<n>-g<generation>.lock``) gives each slot to one stub.
        self._labels = {
            "model": model,
            "version": str(version),
            "instance": str(instance),
            "generation": str(generation),
        }
        self._interval_s = interval_s
        self.size_bounds = batch_size_bounds(max_batch_size)
        # Written on the request path.
        self.in_flight = 0
        self.errors = 0
        self.reconnects = 0
        self.cancelled_requests = 0
        self.duration_counts = [0] * (len(DURATION_BOUNDS) + 1)  # per bucket, not cumulative; last: +Inf
        self.duration_sum = 0.0
        self.size_counts = [0] * (len(self.size_bounds) + 1)
        self.size_sum = 0
        # Batches the backend kind's short path finished, counted by the flusher: an append is all
        # that path pays per batch (its Python runs cold, so a call into this object costs several
        # microseconds there, see _inline.py). Bounded: a flusher that stopped (metrics off after an
        # API failure) must not let it grow; one flush interval holds far fewer batches.
        self.finished: Deque[Tuple[int, float, bool]] = collections.deque(maxlen=_FINISHED_MAX)
        self._late = Counts([0] * len(self.duration_counts), 0.0, [0] * len(self.size_counts), 0, 0)  # the flusher's
        # The flusher's side: one (metric, is_gauge) per series, in the order of _values(), and what
        # each series was last given.
        self._families: List[object] = []
        self._series: List[Tuple[PbMetric, bool]] = []
        self._pushed: List[float] = []
        self._failed = False
        self._lock = threading.Lock()  # the flusher thread and close() never push at once
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.created = threading.Event()  # set once the flusher tried to create the series

    # -- the request path (the stub's execute thread) ------------------------------------------
    def enter(self, n_requests: int) -> None:
        """A batch of ``n_requests`` starts."""
        self.in_flight = n_requests
        self.size_counts[bisect.bisect_left(self.size_bounds, n_requests)] += 1
        self.size_sum += n_requests

    def leave(self) -> None:
        """The batch is answered (or failed)."""
        self.in_flight = 0

    def settled(self, final: Message) -> None:
        """The batch's final reply from the worker: an ERROR counts as an error; its duration is observed."""
        if not isinstance(final, (Ok, Error, End)):  # not a final reply (a protocol error the stub reports)
            return
        if type(final) is Error:
            self.errors += 1
        duration = final.duration_s
        if duration is not None:
            self.duration_counts[bisect.bisect_left(DURATION_BOUNDS, duration)] += 1
            self.duration_sum += duration

    def reconnected(self) -> None:
        """The stub abandoned a batch at its execution timeout and reconnects to its worker."""
        self.reconnects += 1

    def cancelled(self, n_requests: int) -> None:
        """``n_requests`` requests were answered as cancelled without running (_stub_cancel)."""
        self.cancelled_requests += n_requests

    def totals(self) -> Counts:
        """What has been counted so far: the request path's counts and those of :attr:`finished`
        (after :meth:`counted`), added up."""
        late = self._late
        return Counts(
            [mine + theirs for mine, theirs in zip(self.duration_counts, late.duration_counts)],
            self.duration_sum + late.duration_sum,
            [mine + theirs for mine, theirs in zip(self.size_counts, late.size_counts)],
            self.size_sum + late.size_sum,
            self.errors + late.errors,
        )

    # -- the flusher ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the flusher thread, which first creates the metrics (off the model's load path)."""
        self._thread = threading.Thread(target=self._run, name="pytriton-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        created = self._create()
        self.created.set()
        if not created:
            return
        while not self._stop.wait(self._interval_s):
            self.flush()

    def _create(self) -> bool:
        """Create the families and this instance's series; False (logged) if the API fails."""
        with self._lock:
            try:
                family_type = self._pb_utils.MetricFamily
                families = {}
                for name, (kind, description) in _FAMILIES.items():
                    families[name] = family_type(name=name, description=description, kind=getattr(family_type, kind))
                    self._families.append(families[name])
                for name, labels in self._series_labels():
                    gauge = _FAMILIES[name][0] == "GAUGE"
                    self._series.append((families[name].Metric(labels=labels), gauge))
                    self._pushed.append(0.0)
            except Exception as exc:  # noqa: BLE001 - an older or different backend: no metrics
                self._fail(f"could not create them ({type(exc).__name__}: {exc})")
                return False
        return True

    def _series_labels(self) -> List[Tuple[str, Dict[str, str]]]:
        """(family, labels) of every series, in the order of :meth:`_values`."""
        series = []
        for name, bounds in ((DURATION, DURATION_BOUNDS), (BATCH_SIZE, self.size_bounds)):
            for bound in (*bounds, float("inf")):
                series.append((name + "_bucket", {**self._labels, "le": le_text(bound)}))
            series.append((name + "_sum", self._labels))
            series.append((name + "_count", self._labels))
        for name in (ERRORS, RECONNECTS, CANCELLED, IN_FLIGHT):
            series.append((name, self._labels))
        return series

    def counted(self) -> None:
        """Count the batches in :attr:`finished` (the flusher's thread, and tests).

        Into counts of the flusher's own: the request path goes on writing its counts meanwhile
        (a model on the short path still takes the general path for an unusual batch), and two
        threads adding to one counter could lose an increment.
        """
        finished, late, size_bounds = self.finished, self._late, self.size_bounds
        while finished:
            n_requests, duration_s, failed = finished.popleft()  # atomic: the execute thread appends meanwhile
            late.size_counts[bisect.bisect_left(size_bounds, n_requests)] += 1
            late.size_sum += n_requests
            late.duration_counts[bisect.bisect_left(DURATION_BOUNDS, duration_s)] += 1
            late.duration_sum += duration_s
            if failed:
                late.errors += 1

    def _values(self) -> List[float]:
        """The current value of every series."""
        self.counted()
        totals = self.totals()
        values: List[float] = []
        for counts, total in ((totals.duration_counts, totals.duration_sum), (totals.size_counts, totals.size_sum)):
            cumulative = list(itertools.accumulate(counts))
            values.extend(cumulative)
            values.append(float(total))
            values.append(float(cumulative[-1]))
        values.extend((totals.errors, self.reconnects, self.cancelled_requests, self.in_flight))
        return values

    def flush(self) -> None:
        """Push every series that changed since the last push (counters by their increase, gauges by value)."""
        with self._lock:
            if self._failed or not self._series:
                return
            try:
                for index, value in enumerate(self._values()):
                    pushed = self._pushed[index]
                    if value != pushed:
                        metric, gauge = self._series[index]
                        if gauge:
                            metric.set(float(value))
                        else:
                            metric.increment(float(value - pushed))
                        self._pushed[index] = value
            except Exception as exc:  # noqa: BLE001 - e.g. the server is going away
                self._fail(f"could not update them ({type(exc).__name__}: {exc})")

    def _fail(self, reason: str) -> None:
        self._failed = True
        # Nothing will be pushed again: the short path's appends are dropped from now on (a deque of
        # length 0 keeps nothing), rather than filling up to its bound.
        self.finished = collections.deque(maxlen=0)
        log(
            self._pb_utils,
            f"pytriton: the metrics of model {self._model!r} (instance {self._labels['instance']}) are off: the Python "
            f"backend's metric API {reason}. Inference is not affected.",
        )

    def close(self) -> None:
        """Stop the flusher, push the last changes, delete the series and then their families."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            if self._thread.is_alive():  # stuck in a call to the server: leave the objects to process exit
                return
        self.flush()
        with self._lock:
            self._series.clear()  # each Metric is deleted (in the server too) before its family
            self._families.clear()


def create(pb_utils: ModuleType, enabled: bool, **series: Any) -> NullMetrics:
    """The started metrics of one instance, or :data:`NULL` if off or unsupported (logged once).

    ``series``: the keyword arguments of :class:`StubMetrics` (``model``, ``version``,
    ``instance``, ``generation``, ``max_batch_size``).
    """
    if not enabled:
        return NULL
    if getattr(pb_utils, "MetricFamily", None) is None:
        log(
            pb_utils,
            f"pytriton: the metrics of model {series['model']!r} (instance {series['instance']}) are off: this "
            "Triton's Python backend has no custom-metric API (triton_python_backend_utils.MetricFamily). "
            "Inference is not affected.",
        )
        return NULL
    metrics = StubMetrics(pb_utils, **series)
    metrics.start()
    return metrics
