"""Deadlines and cancellation in the dispatch loop.

The fake clock moves only when an execution runs or a test advances it, so "expired" is
exact. Dispatch admission re-reads the clock after the purge; one test moves time between
the two with a completion whose ``fail`` advances the clock (the purge answers its expired
requests before the batch is dispatched).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import numpy as np
import pytest

from reactantserver.core.config import SchedulingDiscipline
from reactantserver.core.errors import DeadlineExceededError
from reactantserver.core.hooks import NamedTensor
from reactantserver.worker.runtime.probe import RunKey
from reactantserver.worker.scheduler import FutureCompletion
from reactantserver.worker.testing import FakeClock

from ._fake import SCALE, WAIT_S, Harness, Request, row, wait_for

FIFO = SchedulingDiscipline.FIFO
EDF = SchedulingDiscipline.EDF
FAIR = SchedulingDiscipline.FAIR

Array = np.ndarray[Any, Any]


class AdvancingCompletion(FutureCompletion):
    """Moves the fake clock forward when it is failed (time passing after the purge)."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        super().__init__()
        self.clock = clock
        self.seconds = seconds

    def fail(self, exc: BaseException) -> None:
        self.clock.advance(self.seconds)
        super().fail(exc)


def assert_deadline(request: Request) -> None:
    exc = request.error()
    assert isinstance(exc, DeadlineExceededError)
    assert exc.status is grpc.StatusCode.DEADLINE_EXCEEDED


def expired(h: Harness, name: str) -> int:
    stats = h.scheduler.stats(name)
    assert stats is not None
    return stats.expired


# -- purge ---------------------------------------------------------------------------------


def test_expired_queued_requests_are_purged_without_executing() -> None:
    h = Harness(discipline=FIFO)
    model = h.add("m", sizes=(1, 2))
    doomed = [h.submit("m", row(k), deadline_ns=h.at(0.001)) for k in (1, 2)]
    h.clock.advance(0.002)
    assert h.scheduler.step()
    for request in doomed:
        assert_deadline(request)
    assert h.backend.executions == 0
    assert h.runs == []
    assert expired(h, "m") == 2
    assert h.scheduler.queue_depth("m") == 0
    assert model.outstanding == 0
    assert not h.scheduler.step()


def test_purge_removes_expired_requests_anywhere_in_the_queue_then_plans_the_rest() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2))
    live = h.submit("m", row(1))
    doomed = h.submit("m", row(2), deadline_ns=h.at(0.001))
    other = h.submit("m", row(3), deadline_ns=h.at(1.0))
    h.clock.advance(0.001)  # deadline == now: expired
    assert h.scheduler.step()
    assert_deadline(doomed)
    assert h.ran() == [("m", 2)]
    assert h.runs[0].first_column == [1.0, 3.0]
    np.testing.assert_array_equal(live.value(), row(1) * SCALE)
    np.testing.assert_array_equal(other.value(), row(3) * SCALE)
    assert expired(h, "m") == 1
    assert h.backend.executions == 1


def test_a_request_that_meets_its_deadline_is_served() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1,))
    request = h.submit("m", row(4), deadline_ns=h.at(0.010))
    h.clock.advance(0.009)
    h.drain()
    np.testing.assert_array_equal(request.value(), row(4) * SCALE)
    assert expired(h, "m") == 0


# -- dispatch admission --------------------------------------------------------------------


def test_dispatch_admission_drops_a_request_whose_deadline_passed_after_the_purge() -> None:
    h = Harness(discipline=FIFO)
    model = h.add("m", sizes=(1, 2))
    purged = h.submit(
        "m",
        row(1),
        deadline_ns=h.at(0.001),
        completion=AdvancingCompletion(h.clock, 0.020),
    )
    late = h.submit("m", row(2), deadline_ns=h.at(0.010))
    kept = h.submit("m", row(3))
    h.clock.advance(0.002)
    assert h.scheduler.step()
    # At selection only `purged` had expired; by dispatch time `late` had too.
    assert_deadline(purged)
    assert_deadline(late)
    np.testing.assert_array_equal(kept.value(), row(3) * SCALE)
    assert [r.first_column[0] for r in h.runs] == [3.0]
    assert h.backend.executions == 1
    assert expired(h, "m") == 2
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.requests_served, stats.rows_served) == (1, 1)
    assert model.outstanding == 0


@pytest.mark.parametrize("discipline", [EDF, FIFO, FAIR])
def test_edf_sheds_a_request_whose_laxity_is_below_the_measured_cost(
    discipline: SchedulingDiscipline,
) -> None:
    h = Harness(discipline=discipline)
    h.add("m", sizes=(1,), duration_s=0.005)
    h.scheduler.seed_costs({RunKey("m", None, 1): 0.005})
    tight = h.submit("m", row(1), deadline_ns=h.at(0.003))
    h.drain()
    if discipline is EDF:
        assert_deadline(tight)
        assert h.backend.executions == 0
        assert expired(h, "m") == 1
    else:
        np.testing.assert_array_equal(tight.value(), row(1) * SCALE)
        assert h.backend.executions == 1
        assert expired(h, "m") == 0
    roomy = h.submit("m", row(2), deadline_ns=h.at(0.006))
    h.drain()
    np.testing.assert_array_equal(roomy.value(), row(2) * SCALE)


def test_edf_laxity_uses_only_a_measured_or_seeded_cost() -> None:
    h = Harness(discipline=EDF)
    h.add("m", sizes=(1,), duration_s=0.005)
    # Never measured: margin 0 (not the 10 ms default), so 3 ms of laxity is enough.
    first = h.submit("m", row(1), deadline_ns=h.at(0.003))
    h.drain()
    np.testing.assert_array_equal(first.value(), row(1) * SCALE)
    assert h.scheduler.costs.measured("m", 1) == pytest.approx(0.005)
    # Now measured at 5 ms: the same laxity is shed.
    second = h.submit("m", row(2), deadline_ns=h.at(0.003))
    h.drain()
    assert_deadline(second)
    assert h.backend.executions == 1


def test_edf_margin_is_the_cost_of_the_planned_batch_size() -> None:
    h = Harness(discipline=EDF)
    h.add("m", sizes=(1, 2), durations={1: 0.001, 2: 0.050})
    h.scheduler.seed_costs({RunKey("m", None, 1): 0.001, RunKey("m", None, 2): 0.050})
    alone = h.submit("m", row(1), deadline_ns=h.at(0.010))
    h.drain()
    np.testing.assert_array_equal(alone.value(), row(1) * SCALE)  # planned B = 1: 1 ms
    pair = [h.submit("m", row(k), deadline_ns=h.at(0.010)) for k in (2, 3)]
    h.drain()
    for request in pair:  # planned B = 2: 50 ms > 10 ms of laxity
        assert_deadline(request)
    assert h.backend.executions == 1


def test_committed_sub_calls_skip_the_laxity_margin() -> None:
    h = Harness(discipline=EDF)
    h.add("m", sizes=(1,), duration_s=0.005)
    h.scheduler.seed_costs({RunKey("m", None, 1): 0.005})
    committed = h.submit("m", row(1), deadline_ns=h.at(0.003), committed=True)
    plain = h.submit("m", row(2), deadline_ns=h.at(0.003))
    h.drain()
    np.testing.assert_array_equal(committed.value(), row(1) * SCALE)
    assert_deadline(plain)
    assert h.backend.executions == 1


def test_committed_sub_calls_keep_the_hard_deadline() -> None:
    h = Harness(discipline=EDF)
    h.add("m", sizes=(1,))
    queued = h.submit("m", row(1), deadline_ns=h.at(0.001), committed=True)
    h.clock.advance(0.002)
    h.drain()
    assert_deadline(queued)  # purged
    assert h.backend.executions == 0
    # At dispatch admission: time passes between the purge and the dispatch.
    purged = h.submit(
        "m", row(2), deadline_ns=h.at(0.001), completion=AdvancingCompletion(h.clock, 0.020)
    )
    committed = h.submit("m", row(3), deadline_ns=h.at(0.010), committed=True)
    h.clock.advance(0.002)
    h.drain()
    assert_deadline(purged)
    assert_deadline(committed)
    assert h.backend.executions == 0
    assert expired(h, "m") == 3


def test_when_every_taken_request_is_dropped_nothing_executes() -> None:
    h = Harness(discipline=EDF)
    model = h.add("m", sizes=(1, 2, 4), duration_s=0.005)
    h.scheduler.seed_costs({RunKey("m", None, s): 0.005 for s in (1, 2, 4)})
    doomed = [h.submit("m", row(k), deadline_ns=h.at(0.004)) for k in (1, 2, 3, 4)]
    assert h.scheduler.step()
    for request in doomed:
        assert_deadline(request)
    assert h.backend.executions == 0
    assert h.backend.transfers == 0
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.expired, stats.dispatch_count, stats.requests_served) == (4, 0, 0)
    assert stats.batch_histogram == {}
    assert model.outstanding == 0
    assert not h.scheduler.step()


def test_the_survivors_of_a_partly_dropped_batch_are_served() -> None:
    h = Harness(discipline=EDF)
    h.add("m", sizes=(1, 2, 4), duration_s=0.005)
    h.scheduler.seed_costs({RunKey("m", None, s): 0.005 for s in (1, 2, 4)})
    requests = [
        h.submit("m", row(1), deadline_ns=h.at(0.004)),
        h.submit("m", row(2)),
        h.submit("m", row(3), deadline_ns=h.at(0.004)),
        h.submit("m", row(4), deadline_ns=h.at(1.0)),
    ]
    assert h.scheduler.step()
    assert_deadline(requests[0])
    assert_deadline(requests[2])
    np.testing.assert_array_equal(requests[1].value(), row(2) * SCALE)
    np.testing.assert_array_equal(requests[3].value(), row(4) * SCALE)
    (run,) = h.runs
    assert run.first_column[:2] == [2.0, 4.0]
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.expired, stats.requests_served, stats.rows_served) == (2, 2, 2)


# -- cancellation --------------------------------------------------------------------------


def test_cancel_removes_a_queued_request() -> None:
    h = Harness(discipline=FIFO)
    model = h.add("m", sizes=(1, 2))
    gone = h.submit("m", row(1))
    kept = h.submit("m", row(2))
    assert h.scheduler.cancel(gone.pending)
    assert not h.scheduler.cancel(gone.pending)  # only once
    assert h.scheduler.queue_depth("m") == 1
    assert isinstance(gone.future.exception(timeout=0), asyncio.CancelledError)
    h.drain()
    assert h.ran() == [("m", 1)]
    assert h.runs[0].first_column == [2.0]
    np.testing.assert_array_equal(kept.value(), row(2) * SCALE)
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.cancelled, stats.requests_served) == (1, 1)
    assert model.outstanding == 0


def test_cancel_after_the_request_was_taken_returns_false_and_discards_the_result() -> None:
    h = Harness(discipline=FIFO)
    answers: list[bool] = []
    holder: list[Request] = []

    def compute(x: Array) -> Array:
        # The caller goes away while its request executes.
        answers.append(h.scheduler.cancel(holder[0].pending))
        holder[0].future.cancel()
        return x * SCALE

    h.add("m", sizes=(1,), compute=compute)
    holder.append(h.submit("m", row(1)))
    h.drain()
    assert answers == [False]
    assert holder[0].future.cancelled()
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.cancelled, stats.requests_served, stats.failed) == (0, 1, 0)
    assert not h.scheduler.cancel(holder[0].pending)


def test_cancelling_the_awaiting_task_withdraws_a_queued_request(started: Harness) -> None:
    h = started
    h.add("m", sizes=(1,))
    gate = h.hold("m")

    async def scenario() -> None:
        blocker = asyncio.ensure_future(h.scheduler.infer("m", [NamedTensor("x", row(1))]))
        assert await asyncio.to_thread(gate.entered.wait, WAIT_S)
        task = asyncio.ensure_future(h.scheduler.infer("m", [NamedTensor("x", row(2))]))
        await asyncio.sleep(0)  # the task submits, then awaits its future
        assert h.scheduler.queue_depth("m") == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert h.scheduler.queue_depth("m") == 0
        gate.release.set()
        (out,) = await asyncio.wait_for(blocker, WAIT_S)
        np.testing.assert_array_equal(out, row(1) * SCALE)

    asyncio.run(scenario())
    assert [r.first_column for r in h.runs] == [[1.0]]
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.cancelled, stats.requests_served) == (1, 1)


def test_cancelling_the_task_of_a_running_request_discards_its_result(started: Harness) -> None:
    h = started
    h.add("m", sizes=(1,))
    gate = h.hold("m")

    async def scenario() -> None:
        task = asyncio.ensure_future(h.scheduler.infer("m", [NamedTensor("x", row(1))]))
        assert await asyncio.to_thread(gate.entered.wait, WAIT_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.release.set()

        def served() -> bool:
            stats = h.scheduler.stats("m")
            return stats is not None and stats.requests_served == 1

        await asyncio.to_thread(wait_for, served)

    asyncio.run(scenario())
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert stats.cancelled == 0


def test_call_withdraws_a_request_still_queued_at_its_deadline(started: Harness) -> None:
    h = started
    h.add("m", sizes=(1,))
    gate = h.hold("m")
    blocker = h.submit("m", row(1))
    assert gate.entered.wait(WAIT_S)
    with pytest.raises(DeadlineExceededError):
        h.scheduler.call(
            "m", [NamedTensor("x", row(2))], deadline_ns=time.monotonic_ns() + 20_000_000
        )
    assert h.scheduler.queue_depth("m") == 0
    gate.release.set()
    np.testing.assert_array_equal(blocker.value(), row(1) * SCALE)
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert stats.cancelled == 1
    assert [r.first_column for r in h.runs] == [[1.0]]
