"""Per-model scheduler statistics: what ``/metrics`` and ``ModelStatistics`` report.

The dispatch thread writes a :class:`ModelStats` under the scheduler lock after every
dispatch; readers take a :class:`StatsSnapshot` (an immutable copy) under the same lock.
"""

from __future__ import annotations

import bisect
import collections
import math
from collections.abc import Mapping, Sequence

import attrs

__all__ = [
    "DURATION_BUCKETS",
    "QUEUE_WAIT_SAMPLES",
    "BatchStats",
    "Durations",
    "ModelStats",
    "StatsSnapshot",
    "nearest_rank",
]

DURATION_BUCKETS = tuple(0.001 * 2**k for k in range(14))
"""Upper bounds of every duration histogram the worker exports: ``0.001 * 2**k`` s, k = 0..13
(1 ms to ~8 s; ``+Inf`` implied)."""

QUEUE_WAIT_SAMPLES = 1024
"""Queue waits kept per model for the percentiles (a ring of the most recent)."""


def nearest_rank(samples: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-quantile (``0 < q <= 1``) of ``samples``; 0.0 when empty."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


@attrs.frozen
class Durations:
    """A histogram of durations over :data:`DURATION_BUCKETS`: per-bucket (not cumulative)
    counts, the last one ``+Inf``, and the sum of the observed seconds."""

    counts: tuple[int, ...] = (0,) * (len(DURATION_BUCKETS) + 1)
    total: float = 0.0

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self.counts)

    def observed(self, *seconds: float) -> Durations:
        """This histogram with ``seconds`` added."""
        counts = list(self.counts)
        for value in seconds:
            counts[bisect.bisect_left(DURATION_BUCKETS, value)] += 1
        return Durations(tuple(counts), self.total + sum(seconds))


@attrs.frozen
class BatchStats:
    """Dispatches at one compiled size and their compute split (nanoseconds)."""

    count: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0


@attrs.frozen
class StatsSnapshot:
    """A copy of one model's counters at one instant (cumulative since install)."""

    dispatch_count: int = 0
    requests_served: int = 0
    rows_served: int = 0
    compute_seconds: float = 0.0
    recent_load: float = 0.0
    queue_depth: int = 0
    queue_wait_count: int = 0
    queue_wait_ns: int = 0
    queue_wait_p50: float = 0.0
    queue_wait_p99: float = 0.0
    queue_waits: Durations = Durations()
    compute_input: Durations = Durations()
    compute_infer: Durations = Durations()
    compute_output: Durations = Durations()
    batches: Mapping[int, BatchStats] = attrs.field(factory=dict)
    failed: int = 0
    expired: int = 0
    cancelled: int = 0
    shed: int = 0
    last_dispatch_ns: int = 0
    queue_cpu_ns: int = 0
    dispatch_cpu_ns: int = 0

    @property
    def batch_histogram(self) -> dict[int, int]:
        """Dispatches per compiled size."""
        return {b: s.count for b, s in self.batches.items()}


@attrs.define
class ModelStats:
    """Mutable counters of one model (the dispatch thread writes them under the lock)."""

    dispatch_count: int = 0
    requests_served: int = 0
    rows_served: int = 0
    compute_seconds: float = 0.0
    queue_wait_count: int = 0
    queue_wait_ns: int = 0
    waits: collections.deque[float] = attrs.field(
        factory=lambda: collections.deque(maxlen=QUEUE_WAIT_SAMPLES)
    )
    queue_waits: Durations = Durations()
    """Every queue wait (the ring above keeps only the recent ones, for ``/status``)."""
    compute_input: Durations = Durations()
    """Per execution: copying the batch's inputs to the device."""
    compute_infer: Durations = Durations()
    """Per execution: running the executable."""
    compute_output: Durations = Durations()
    """Per execution: copying the outputs back."""
    batches: dict[int, BatchStats] = attrs.field(factory=dict)
    failed: int = 0
    """Requests that got an execution error."""
    expired: int = 0
    """Requests answered ``DEADLINE_EXCEEDED`` by the scheduler (purge or dispatch admission)."""
    cancelled: int = 0
    """Requests the client cancelled while still queued."""
    shed: int = 0
    """Requests refused because the model's queue was full."""
    last_dispatch_ns: int = 0
    queue_cpu_ns: int = 0
    """Thread CPU of admission (``submit``) and of settling results on the caller's loop."""
    dispatch_cpu_ns: int = 0
    """Dispatch-thread CPU charged at each execution of this model: all that thread did since
    its previous charge (wake-up, selection, assembly, transfers, execution, slicing, the
    previous delivery), control commands excepted."""

    def record_waits(self, waits_ns: Sequence[int]) -> None:
        """Queue waits of requests entering a dispatch."""
        seconds = [wait * 1e-9 for wait in waits_ns]
        self.waits.extend(seconds)
        self.queue_waits = self.queue_waits.observed(*seconds)
        self.queue_wait_count += len(waits_ns)
        self.queue_wait_ns += sum(waits_ns)

    def record_dispatch(
        self,
        *,
        batch: int,
        requests: int,
        rows: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        now_ns: int,
    ) -> None:
        """One successful execution at compiled size ``batch``."""
        self.dispatch_count += 1
        self.requests_served += requests
        self.rows_served += rows
        self.compute_seconds += (input_ns + infer_ns + output_ns) * 1e-9
        self.compute_input = self.compute_input.observed(input_ns * 1e-9)
        self.compute_infer = self.compute_infer.observed(infer_ns * 1e-9)
        self.compute_output = self.compute_output.observed(output_ns * 1e-9)
        old = self.batches.get(batch, BatchStats())
        self.batches[batch] = BatchStats(
            old.count + 1,
            old.input_ns + input_ns,
            old.infer_ns + infer_ns,
            old.output_ns + output_ns,
        )
        self.last_dispatch_ns = now_ns

    def snapshot(self, *, queue_depth: int, recent_load: float) -> StatsSnapshot:
        """An immutable copy, with the percentiles computed now."""
        # Every counter field is shared with StatsSnapshot; only the ring becomes percentiles.
        counters = attrs.asdict(self, recurse=False, filter=lambda a, _: a.name != "waits")
        counters["batches"] = dict(self.batches)
        waits = list(self.waits)
        return StatsSnapshot(
            **counters,
            queue_depth=queue_depth,
            recent_load=recent_load,
            queue_wait_p50=nearest_rank(waits, 0.5),
            queue_wait_p99=nearest_rank(waits, 0.99),
        )
