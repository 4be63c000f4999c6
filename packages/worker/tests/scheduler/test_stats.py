"""Per-model statistics: counters, the queue-wait ring and its percentiles."""

from __future__ import annotations

import pytest

from reactantserver.worker.scheduler.stats import (
    QUEUE_WAIT_SAMPLES,
    BatchStats,
    ModelStats,
    StatsSnapshot,
    nearest_rank,
)


@pytest.mark.parametrize(
    ("samples", "q", "expected"),
    [
        ([], 0.5, 0.0),
        ([3.0], 0.5, 3.0),
        ([3.0], 0.99, 3.0),
        ([4.0, 1.0, 3.0, 2.0], 0.5, 2.0),
        ([4.0, 1.0, 3.0, 2.0], 0.99, 4.0),
        ([4.0, 1.0, 3.0, 2.0], 0.25, 1.0),
        ([4.0, 1.0, 3.0, 2.0], 0.26, 2.0),
        ([float(i) for i in range(1, 101)], 0.5, 50.0),
        ([float(i) for i in range(1, 101)], 0.99, 99.0),
        ([float(i) for i in range(1, 101)], 1.0, 100.0),
        ([5.0, 6.0], 0.001, 5.0),
    ],
)
def test_nearest_rank(samples: list[float], q: float, expected: float) -> None:
    assert nearest_rank(samples, q) == expected


def test_ring_keeps_the_last_1024_waits() -> None:
    assert QUEUE_WAIT_SAMPLES == 1024
    stats = ModelStats()
    waits_ns = [i * 1_000_000 for i in range(1, 1031)]  # 1 ms .. 1030 ms
    stats.record_waits(waits_ns[:10])
    stats.record_waits(waits_ns[10:])
    assert len(stats.waits) == 1024
    assert stats.waits[0] == pytest.approx(0.007)
    assert stats.waits[-1] == pytest.approx(1.030)
    # The cumulative counters cover every sample, not only the ring.
    assert stats.queue_wait_count == 1030
    assert stats.queue_wait_ns == sum(waits_ns)


def test_snapshot_percentiles_over_the_ring() -> None:
    stats = ModelStats()
    stats.record_waits([i * 1_000_000 for i in range(1, 1031)])
    snap = stats.snapshot(queue_depth=3, recent_load=0.5)
    # Ring holds 7 ms .. 1030 ms: p50 = rank 512 -> 518 ms, p99 = rank ceil(0.99*1024)=1014.
    assert snap.queue_wait_p50 == pytest.approx(0.518)
    assert snap.queue_wait_p99 == pytest.approx(1.020)
    assert snap.queue_depth == 3
    assert snap.recent_load == 0.5


def test_record_dispatch_and_histogram() -> None:
    stats = ModelStats()
    stats.record_dispatch(
        batch=4, requests=4, rows=4, input_ns=100, infer_ns=1_000, output_ns=10, now_ns=7
    )
    stats.record_dispatch(
        batch=4, requests=2, rows=3, input_ns=200, infer_ns=2_000, output_ns=20, now_ns=9
    )
    stats.record_dispatch(
        batch=1, requests=1, rows=1, input_ns=1, infer_ns=2, output_ns=3, now_ns=11
    )
    assert stats.dispatch_count == 3
    assert stats.requests_served == 7
    assert stats.rows_served == 8
    assert stats.compute_seconds == pytest.approx(3336e-9)
    assert stats.batches == {4: BatchStats(2, 300, 3_000, 30), 1: BatchStats(1, 1, 2, 3)}
    assert stats.last_dispatch_ns == 11

    snap = stats.snapshot(queue_depth=0, recent_load=0.0)
    assert snap.batch_histogram == {4: 2, 1: 1}
    assert snap.dispatch_count == 3
    assert snap.requests_served == 7
    assert snap.rows_served == 8
    assert snap.last_dispatch_ns == 11


def test_spec_example_counters() -> None:
    # Four one-row requests in one dispatch at B = 4.
    stats = ModelStats()
    stats.record_waits([10, 20, 30, 40])
    stats.record_dispatch(
        batch=4, requests=4, rows=4, input_ns=1, infer_ns=1, output_ns=1, now_ns=1
    )
    snap = stats.snapshot(queue_depth=0, recent_load=0.0)
    assert (snap.dispatch_count, snap.requests_served, snap.rows_served) == (1, 4, 4)
    assert snap.batch_histogram == {4: 1}
    assert snap.queue_wait_count == 4
    assert snap.queue_wait_ns == 100


def test_snapshot_is_an_independent_copy() -> None:
    stats = ModelStats()
    stats.failed, stats.expired, stats.cancelled, stats.shed = 1, 2, 3, 4
    stats.record_dispatch(
        batch=2, requests=1, rows=1, input_ns=0, infer_ns=0, output_ns=0, now_ns=0
    )
    snap = stats.snapshot(queue_depth=0, recent_load=0.0)
    stats.record_dispatch(
        batch=2, requests=1, rows=1, input_ns=0, infer_ns=0, output_ns=0, now_ns=0
    )
    stats.record_dispatch(
        batch=8, requests=1, rows=1, input_ns=0, infer_ns=0, output_ns=0, now_ns=0
    )
    stats.record_waits([5])
    assert snap.batch_histogram == {2: 1}
    assert snap.queue_wait_count == 0
    assert (snap.failed, snap.expired, snap.cancelled, snap.shed) == (1, 2, 3, 4)


def test_empty_snapshot() -> None:
    snap = ModelStats().snapshot(queue_depth=0, recent_load=0.0)
    assert snap == StatsSnapshot()
    assert snap.queue_wait_p50 == 0.0
    assert snap.queue_wait_p99 == 0.0
    assert snap.batch_histogram == {}
