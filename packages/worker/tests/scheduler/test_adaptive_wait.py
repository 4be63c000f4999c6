"""The adaptive wait: without ``max_queue_delay_microseconds`` a partial batch waits only
while requests keep arriving, and only when they come faster than the device runs them one
by one or the model's recent batches were bigger (issue 32: coalescing without tuning).

The fake clock moves only when a test advances it; costs are seeded into the cost table.
"""

from __future__ import annotations

import numpy as np

from reactantserver.core.config import SchedulingDiscipline
from reactantserver.worker.scheduler.adaptive import max_hold_ns

from ._fake import SCALE, Harness, row

FIFO = SchedulingDiscipline.FIFO
US = 1e-6


def _adaptive(cost_s: float = 100 * US) -> Harness:
    """A model without a fixed delay whose executions take ``cost_s`` on the fake clock."""
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2, 4, 8), queue_delay_s=None, duration_s=cost_s)
    for size in (1, 2, 4, 8):
        h.scheduler.costs.record("m", size, cost_s)
    return h


def test_a_lone_caller_never_waits() -> None:
    h = _adaptive()
    for k in range(5):
        request = h.submit("m", row(k + 1))
        assert h.scheduler.step(), f"request {k} waited"
        np.testing.assert_array_equal(request.value(), row(k + 1) * SCALE)
        h.clock.advance(1000 * US)  # its next request comes only after its answer
    assert h.ran() == [("m", 1)] * 5


def test_the_first_requests_do_not_wait_without_a_measured_gap() -> None:
    h = _adaptive()
    h.submit("m", row(1))
    assert h.scheduler.step()
    assert h.ran() == [("m", 1)]


def test_arrivals_faster_than_one_execution_grow_the_batch_while_the_device_is_busy() -> None:
    h = _adaptive(cost_s=200 * US)
    h.submit("m", row(1))
    assert h.scheduler.step()  # no gap measured yet: runs at once, until t = 200 us
    for k in range(3):  # these came in while it ran: the usual 1 row is exceeded already
        h.submit("m", row(k + 2))
    # Arrivals ~100 us apart against 200 us per execution, the device busy until just now:
    # the batch waits one gap for more.
    assert not h.scheduler.step()
    h.clock.advance(50 * US)
    h.submit("m", row(5))
    assert not h.scheduler.step()
    h.clock.advance(100 * US)  # more than a gap since the last arrival: it goes
    assert h.scheduler.step()
    assert h.ran() == [("m", 1), ("m", 4)]
    assert h.scheduler.stats("m").requests_served == 5  # type: ignore[union-attr]


def test_a_device_idle_for_a_gap_does_not_wait_for_faster_arrivals() -> None:
    h = _adaptive(cost_s=1.0)  # a slow model: every gap is shorter than one execution
    h.submit("m", row(1))
    assert h.scheduler.step()
    h.clock.advance(2.0)  # idle since its last execution ended
    h.submit("m", row(2))
    assert h.scheduler.step()  # the request to the idle device runs at once


def test_a_batch_goes_as_soon_as_it_holds_the_usual_rows() -> None:
    h = _adaptive(cost_s=10 * US)  # fast device: only the recent batches ask for a wait
    h.submit("m", row(1))
    assert h.scheduler.step()
    h.clock.advance(300 * US)
    for k in range(4):
        h.submit("m", row(k + 2))
    assert h.scheduler.step()
    assert h.ran() == [("m", 1), ("m", 4)]  # usual is now 4 rows
    for k in range(3):
        h.clock.advance(30 * US)
        h.submit("m", row(k + 6))
        assert not h.scheduler.step()  # fewer than the usual 4 rows, arrivals still due
    h.clock.advance(30 * US)
    h.submit("m", row(9))
    assert h.scheduler.step()  # the fourth row: it goes at once
    assert h.ran()[-1] == ("m", 4)


def test_the_wait_ends_when_arrivals_stop() -> None:
    h = _adaptive(cost_s=10 * US)
    h.submit("m", row(1))
    for k in range(3):
        h.submit("m", row(k + 2))
    assert h.scheduler.step()  # 4 rows at once, done at t = 10 us: usual 4
    h.clock.advance(100 * US)
    h.submit("m", row(5))  # one of the four callers is back after 100 us (the turnaround)
    arrivals = h.scheduler.model("m").arrivals  # type: ignore[union-attr]
    assert arrivals.turnaround_ns == 100_000
    assert not h.scheduler.step()
    # The other three are waited for until two turnarounds after the execution ended (the
    # longest rule: the usual rows' wait ends after two average gaps, sooner).
    h.clock.advance(100 * US - 1 * US)
    assert not h.scheduler.step()
    h.clock.advance(2 * US)
    assert h.scheduler.step()  # they did not come: it goes with one row
    assert h.ran()[-1] == ("m", 1)


def test_the_wait_never_exceeds_its_bound() -> None:
    cost_s = 20e-3  # a slow device: the bound grows to a quarter of its cost, 5 ms
    bound_s = max_hold_ns(cost_s) * 1e-9
    assert bound_s == 5e-3
    h = _adaptive(cost_s=cost_s)
    for k in range(8):
        h.submit("m", row(k + 1))  # together: the usual rows are now 8, the gap 0
    assert h.scheduler.step()
    step_s = 1e-3
    h.clock.advance(step_s)
    h.submit("m", row(5))  # the oldest of the next batch
    waited = 0.0
    while not h.scheduler.step():
        h.clock.advance(step_s)
        waited += step_s
        if waited < bound_s:
            h.submit("m", row(6))  # arrivals keep coming, fewer than the usual 8 rows
        assert waited <= bound_s + step_s
    assert waited >= bound_s - step_s


def test_a_fixed_delay_overrides_the_adaptive_wait() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2, 4, 8), queue_delay_s=0.0)
    h.scheduler.costs.record("m", 1, 1.0)
    h.submit("m", row(1))
    h.clock.advance(1 * US)
    h.submit("m", row(2))
    assert h.scheduler.step()  # 0 never waits, however fast the arrivals
