"""The adaptive wait's rules as pure logic (``scheduler.adaptive``), one situation each."""

from __future__ import annotations

from reactantserver.worker.scheduler.adaptive import ADAPTIVE_MAX_HOLD_NS, adaptive_end
from reactantserver.worker.scheduler.arrivals import Arrivals

MS = 1_000_000
SIZES = (1, 2, 4, 8, 16, 32)
# A heavy model: one row 5.7 ms, 16 rows 17 ms, 32 rows 25 ms (rows are cheaper in bulk).
COSTS = {1: 5.7e-3, 2: 6.5e-3, 4: 8e-3, 8: 13e-3, 16: 17e-3, 32: 25e-3}


def _end(
    arrivals: Arrivals, rows: int, *, usual: int, now: int, oldest: int | None = None
) -> int | None:
    return adaptive_end(
        arrivals,
        usual_rows=usual,
        rows=rows,
        oldest_ns=now if oldest is None else oldest,
        now_ns=now,
        sizes=SIZES,
        cost_of=COSTS.get,
    )


def _closed_loop_half_batches() -> Arrivals:
    """32 callers split into two halves: one half just answered, the other queued."""
    arrivals = Arrivals(gap_ns=0.2 * MS, last_ns=90 * MS, turnaround_ns=1.0 * MS)
    arrivals.done(100 * MS, 16)
    return arrivals


def test_callers_just_answered_are_waited_for_when_they_fill_a_cheaper_size() -> None:
    arrivals = _closed_loop_half_batches()
    end = _end(arrivals, 16, usual=16, now=100 * MS)
    assert end == 102 * MS  # two turnarounds after the execution ended


def test_once_they_are_all_back_the_batch_goes() -> None:
    arrivals = _closed_loop_half_batches()
    for k in range(16):
        arrivals.arrived(101 * MS + k * 10_000)
    assert arrivals.arrived_since_done == 16
    assert _end(arrivals, 32, usual=16, now=102 * MS) is None  # 32 rows: the largest size


def test_a_lone_caller_is_back_with_its_own_request() -> None:
    arrivals = Arrivals(gap_ns=7 * MS, last_ns=0, turnaround_ns=1.2 * MS)
    arrivals.done(6 * MS, 1)
    arrivals.arrived(7 * MS)
    assert _end(arrivals, 1, usual=1, now=7 * MS) is None


def test_fewer_rows_than_usual_wait_until_the_next_arrival_is_overdue() -> None:
    arrivals = Arrivals(gap_ns=0.1 * MS, last_ns=10 * MS, last_gap_ns=100_000)
    assert _end(arrivals, 3, usual=8, now=10 * MS) == 10 * MS + 200_000
    assert _end(arrivals, 3, usual=8, now=10 * MS + 200_000) is None


def test_a_request_after_an_idle_spell_does_not_wait_for_a_burst_long_gone() -> None:
    arrivals = Arrivals()
    for t in (0, 100_000, 200_000, 300_000):  # a burst, 0.1 ms apart
        arrivals.arrived(t)
    arrivals.arrived(2_000 * MS)  # seconds later, alone
    assert not arrivals.on_the_beat()
    assert _end(arrivals, 1, usual=4, now=2_000 * MS) is None


def test_the_bound_grows_with_a_long_execution() -> None:
    arrivals = Arrivals(gap_ns=10 * MS, last_ns=0, last_gap_ns=10 * MS)
    # Waiting to become the usual 16 rows, which cost 17 ms: a quarter is 4.25 ms, above the
    # 2 ms floor.
    assert _end(arrivals, 5, usual=16, now=0, oldest=0) == 4_250_000
    tiny = dict.fromkeys(SIZES, 3e-05)
    end = adaptive_end(
        arrivals, usual_rows=16, rows=5, oldest_ns=0, now_ns=0, sizes=SIZES, cost_of=tiny.get
    )
    assert end == ADAPTIVE_MAX_HOLD_NS


def test_no_gap_measured_yet_no_wait() -> None:
    assert _end(Arrivals(), 1, usual=8, now=0) is None
