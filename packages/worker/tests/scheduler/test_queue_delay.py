"""The queue delay (``max_queue_delay_microseconds``, 04 beyond): wait for rows on an idle device.

The fake clock moves only when a test advances it, so "still waiting" and "waited long
enough" are exact; ``step`` returns ``False`` while every queued model is waiting. The
threaded tests use the real clock and check only what must happen, never how fast.
"""

from __future__ import annotations

import numpy as np
import pytest

from reactantserver.core.config import SchedulingDiscipline
from reactantserver.worker.scheduler.model import RECENT_BATCHES

from ._fake import SCALE, WAIT_S, Harness, row

FIFO = SchedulingDiscipline.FIFO
DELAY_S = 0.001


def test_without_a_delay_a_lone_request_runs_at_once() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2, 4))
    request = h.submit("m", row(1))
    assert h.scheduler.step()
    assert h.ran() == [("m", 1)]
    np.testing.assert_array_equal(request.value(), row(1) * SCALE)


def test_a_partial_batch_waits_out_the_delay_from_its_oldest_request() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2, 4), queue_delay_s=DELAY_S)
    first = h.submit("m", row(1))
    assert not h.scheduler.step()
    h.clock.advance(DELAY_S * 0.6)
    second = h.submit("m", row(2))
    assert not h.scheduler.step()
    h.clock.advance(DELAY_S * 0.3)
    assert not h.scheduler.step()  # 0.9 of the delay since the oldest
    h.clock.advance(DELAY_S * 0.1)
    assert h.scheduler.step()
    assert h.ran() == [("m", 2)]
    np.testing.assert_array_equal(first.value(), row(1) * SCALE)
    np.testing.assert_array_equal(second.value(), row(2) * SCALE)
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.dispatch_count, stats.requests_served) == (1, 2)


def test_a_full_batch_runs_without_waiting() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2, 4), queue_delay_s=DELAY_S)
    for k in range(3):
        h.submit("m", row(k + 1))
    assert not h.scheduler.step()
    h.submit("m", row(4))
    assert h.scheduler.step()
    assert h.ran() == [("m", 4)]


def test_the_batch_cap_counts_as_full() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2, 4), queue_delay_s=DELAY_S, max_batch_size=2)
    h.submit("m", row(1))
    assert not h.scheduler.step()
    h.submit("m", row(2))
    assert h.scheduler.step()
    assert h.ran() == [("m", 2)]


def test_a_deadline_inside_the_delay_is_not_waited_on() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2, 4), queue_delay_s=DELAY_S)
    h.submit("m", row(1))
    assert not h.scheduler.step()
    urgent = h.submit("m", row(2), deadline_ns=h.at(DELAY_S / 2))
    assert h.scheduler.step()
    assert h.ran() == [("m", 2)]
    np.testing.assert_array_equal(urgent.value(), row(2) * SCALE)


def _one_batch_after_the_delay(h: Harness, rows: int) -> None:
    for k in range(rows):
        h.submit("m", row(k + 1))
    assert not h.scheduler.step()
    h.clock.advance(DELAY_S)
    assert h.scheduler.step()


def test_a_batch_as_large_as_the_recent_ones_goes_without_waiting() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2, 4, 8), queue_delay_s=DELAY_S)
    _one_batch_after_the_delay(h, 4)  # nothing learned yet: the first batch waits
    _one_batch_after_the_delay(h, 2)  # 2 rows wait: the recent batches reached 4
    for k in range(3):
        h.submit("m", row(k + 1))
    assert not h.scheduler.step()
    fourth = h.submit("m", row(4))
    assert h.scheduler.step()  # 4 rows: the usual batch is in, no rows left to wait for
    assert h.ran() == [("m", 4), ("m", 2), ("m", 4)]
    np.testing.assert_array_equal(fourth.value(), row(4) * SCALE)


def test_a_lone_caller_waits_only_for_its_first_batch() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2, 4), queue_delay_s=DELAY_S)
    _one_batch_after_the_delay(h, 1)  # nothing learned yet: the first row waits
    for k in range(3):
        alone = h.submit("m", row(k + 1))
        assert h.scheduler.step()  # the recent batches held one row: no rows are coming
        np.testing.assert_array_equal(alone.value(), row(k + 1) * SCALE)
    assert h.ran() == [("m", 1)] * 4


def test_more_callers_than_usual_raise_the_rows_waited_for() -> None:
    h = Harness(discipline=FIFO)
    model = h.add("m", sizes=(1, 2, 4, 8), queue_delay_s=DELAY_S)
    _one_batch_after_the_delay(h, 1)
    for k in range(4):  # four rows arrived while the device was busy: they go together
        h.submit("m", row(k + 1))
    assert h.scheduler.step()
    assert model.usual_rows() == 4
    h.submit("m", row(1))
    assert not h.scheduler.step()  # one row of the usual four: wait for the others
    for k in range(3):
        h.submit("m", row(k + 2))
    assert h.scheduler.step()
    assert h.ran() == [("m", 1), ("m", 4), ("m", 4)]


def test_the_recent_batches_are_forgotten_after_a_while() -> None:
    h = Harness(discipline=FIFO)
    model = h.add("m", sizes=(1, 2, 4, 8), queue_delay_s=DELAY_S)
    _one_batch_after_the_delay(h, 4)
    for _ in range(RECENT_BATCHES):
        _one_batch_after_the_delay(h, 2)
    assert model.usual_rows() == 2  # the 4-row batch has left the window
    h.submit("m", row(1))
    h.submit("m", row(2))
    assert h.scheduler.step()


def test_a_model_without_coalescing_never_waits() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1,), coalescable=False, queue_delay_s=DELAY_S)
    h.submit("m", row(1))
    assert h.scheduler.step()
    assert h.ran() == [("m", 1)]


@pytest.mark.parametrize("discipline", list(SchedulingDiscipline))
def test_a_waiting_model_does_not_hold_up_another(discipline: SchedulingDiscipline) -> None:
    h = Harness(discipline=discipline)
    h.add("slow", sizes=(1, 2, 4), queue_delay_s=DELAY_S)
    h.add("eager", sizes=(1, 2, 4))
    h.submit("slow", row(1))
    assert not h.scheduler.step()
    h.submit("eager", row(2))
    assert h.scheduler.step()
    assert h.ran() == [("eager", 1)]  # "slow" may not jump the wait for lack of work
    assert not h.scheduler.step()


def test_a_committed_sub_call_is_not_held() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2, 4), queue_delay_s=DELAY_S)
    h.submit("m", row(1), committed=True)
    assert h.scheduler.step()
    assert h.ran() == [("m", 1)]


def test_the_dispatch_thread_wakes_when_the_delay_ends() -> None:
    h = Harness(discipline=FIFO, real_clock=True)
    h.add("m", sizes=(1, 2, 4), queue_delay_s=0.05)
    h.start()
    try:
        request = h.submit("m", row(3))
        np.testing.assert_array_equal(request.value(), row(3) * SCALE)
        assert h.ran() == [("m", 1)]
    finally:
        h.close()


def test_filling_the_batch_wakes_a_waiting_dispatch_thread() -> None:
    h = Harness(discipline=FIFO, real_clock=True)
    h.add("m", sizes=(1, 2), queue_delay_s=3600.0)
    h.start()
    try:
        first = h.submit("m", row(1))
        second = h.submit("m", row(2))
        np.testing.assert_array_equal(first.value(), row(1) * SCALE)
        np.testing.assert_array_equal(second.value(), row(2) * SCALE)
        assert h.ran() == [("m", 2)]
    finally:
        h.close()


def test_stopping_dispatches_a_waiting_batch_at_once() -> None:
    h = Harness(discipline=FIFO, real_clock=True)
    h.add("m", sizes=(1, 2, 4), queue_delay_s=3600.0)
    h.start()
    request = h.submit("m", row(5))
    h.close(grace_s=WAIT_S)  # a batch still waiting at the grace's end would fail instead
    np.testing.assert_array_equal(request.value(), row(5) * SCALE)
    assert h.ran() == [("m", 1)]
