"""Per-model request outcomes, counted as requests finish and rendered at scrape time.

Every inference request ends in one :meth:`RequestCounters.observe` call: its final status,
its handler seconds and the CPU of its decode and encode. That is one lock and a few integer
additions, where a ``prometheus_client`` counter plus histogram took five locks and a Python
loop over the buckets. :meth:`RequestCounters.collect` turns the totals into the families
``reactantserver_worker_requests_total{model, status}`` and
``reactantserver_worker_request_latency_seconds{model}``, exactly
as those client-side metrics would render them::

    counters = RequestCounters(known=lambda name: registry.get(name) is not None)
    counters.observe("resnet", grpc.StatusCode.OK, 0.004, decode_ns=5_000, encode_ns=2_000)
    registry.register(counters)
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator, Sequence

import grpc
from prometheus_client import utils as _prometheus_utils
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric

from reactantserver.worker.scheduler.stats import DURATION_BUCKETS

__all__ = ["LATENCY_BUCKETS", "RequestCounters", "cumulative_buckets"]

LATENCY_BUCKETS = DURATION_BUCKETS
"""Upper bounds of the latency histogram: ``0.001 * 2**k`` s, k = 0..13 (``+Inf`` implied)."""

_OK = grpc.StatusCode.OK
# prometheus_client's own spelling of a bucket bound (untyped there, hence the annotation).
_go_float: Callable[[float], str] = _prometheus_utils.floatToGoString
_LE = [_go_float(bound) for bound in LATENCY_BUCKETS] + ["+Inf"]


def cumulative_buckets(counts: Sequence[int]) -> list[tuple[str, float]]:
    """Per-bucket counts over :data:`LATENCY_BUCKETS` (``+Inf`` last) as a histogram's
    cumulative ``(le, count)`` pairs, the bounds spelled as prometheus_client spells them."""
    running, cumulative = 0, []
    for le, count in zip(_LE, counts, strict=True):
        running += count
        cumulative.append((le, float(running)))
    return cumulative


class _Series:
    """One model's totals (guarded by the counters' lock)."""

    __slots__ = ("buckets", "decode_ns", "encode_ns", "failed", "latency_sum", "ok")

    def __init__(self) -> None:
        self.ok = 0
        self.failed: dict[grpc.StatusCode, int] = {}
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # per bucket, not cumulative
        self.latency_sum = 0.0
        self.decode_ns = 0
        self.encode_ns = 0


class RequestCounters:
    """The request families of the worker's registry (a ``prometheus_client`` collector).

    ``known`` says whether a model name is in the registry: requests for other names create
    no series, so clients cannot mint label values.
    """

    def __init__(self, known: Callable[[str], bool]) -> None:
        self._known = known
        self._lock = threading.Lock()
        self._series: dict[str, _Series] = {}

    def observe(
        self,
        model: str,
        status: grpc.StatusCode,
        seconds: float,
        decode_ns: int = 0,
        encode_ns: int = 0,
    ) -> None:
        """Count one finished request (a ``RequestObserver``)."""
        with self._lock:
            series = self._series.get(model)
            if series is None:
                if not self._known(model):
                    return
                series = self._series[model] = _Series()
            if status is _OK:
                series.ok += 1
            else:
                series.failed[status] = series.failed.get(status, 0) + 1
            series.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
            series.latency_sum += seconds
            series.decode_ns += decode_ns
            series.encode_ns += encode_ns

    def forget(self, model: str) -> None:
        """Drop every series of ``model``."""
        with self._lock:
            self._series.pop(model, None)

    def codec_cpu(self) -> dict[str, tuple[int, int]]:
        """Model -> (decode ns, encode ns) so far."""
        with self._lock:
            return {name: (s.decode_ns, s.encode_ns) for name, s in self._series.items()}

    def collect(self) -> Iterator[Metric]:
        """``reactantserver_worker_requests_total`` and
        ``reactantserver_worker_request_latency_seconds`` as they stand.
        """
        requests = CounterMetricFamily(
            "reactantserver_worker_requests_total",
            "Inference requests by final status.",
            labels=["model", "status"],
        )
        latency = HistogramMetricFamily(
            "reactantserver_worker_request_latency_seconds",
            "Inference handler wall time.",
            labels=["model"],
        )
        with self._lock:
            rows = [
                (
                    name,
                    s.ok,
                    sorted(s.failed.items(), key=lambda kv: kv[0].name),
                    list(s.buckets),
                    s.latency_sum,
                )
                for name, s in self._series.items()
            ]
        for name, ok, failed, buckets, total in rows:
            if ok:
                requests.add_metric([name, _OK.name], ok)
            for status, count in failed:
                requests.add_metric([name, status.name], count)
            latency.add_metric([name], cumulative_buckets(buckets), total)
        yield requests
        yield latency
