"""The dispatch loop end to end on a fake clock.

Every test drives :meth:`Scheduler.step` on the test thread over a recording
:class:`MockBackend`; executions take exactly the durations set per model, so learned costs
and fair EMAs are exact and nothing depends on real time.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import attrs
import grpc
import numpy as np
import pytest

from reactantserver.core.config import SchedulingDiscipline
from reactantserver.core.dtypes import DType
from reactantserver.core.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    ModelNotFoundError,
    OverloadedError,
    status_of,
)
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.types import Batch, Fixed, TensorSpec
from reactantserver.worker.runtime.probe import RunKey

from ._fake import SCALE, Harness, Request, row, variant_axes

FIFO = SchedulingDiscipline.FIFO
EDF = SchedulingDiscipline.EDF
FAIR = SchedulingDiscipline.FAIR

Array = np.ndarray[Any, Any]


def rows(*values: float) -> Array:
    """A request of several rows ``[[v, v], ...]``."""
    return np.array([[v, v] for v in values], np.float32)


def expect(x: Array) -> Array:
    return x * SCALE


# -- decision order -----------------------------------------------------------------------


def test_pending_control_commands_run_before_any_dispatch() -> None:
    h = Harness(discipline=FIFO)
    h.add("m")
    request = h.submit("m")
    seen: list[str] = []

    def first() -> int:
        seen.append(f"first after {h.backend.executions} executions")
        return 1

    def second() -> str:
        seen.append(f"second after {h.backend.executions} executions")
        return "two"

    f1 = h.scheduler.control(first)
    f2 = h.scheduler.control(second)
    assert h.scheduler.step()  # one turn: all pending controls, and nothing else
    assert seen == ["first after 0 executions", "second after 0 executions"]
    assert (f1.result(timeout=0), f2.result(timeout=0)) == (1, "two")
    assert h.runs == []
    assert not request.future.done()
    assert h.scheduler.step()
    assert h.ran() == [("m", 1)]
    assert not h.scheduler.step()


def test_a_control_queued_behind_requests_still_runs_first() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1,))
    for k in (1, 2):
        h.submit("m", row(k))
    assert h.scheduler.step()
    order: list[str] = []
    h.scheduler.control(lambda: order.append(f"control after {len(h.runs)} runs"))
    h.drain()
    assert order == ["control after 1 runs"]
    assert len(h.runs) == 2


def test_control_failure_reaches_its_future_and_the_loop_goes_on() -> None:
    h = Harness(discipline=FIFO)
    h.add("m")
    request = h.submit("m", row(2))

    def broken() -> None:
        raise ValueError("control failed")

    future = h.scheduler.control(broken)
    h.drain()
    assert isinstance(future.exception(timeout=0), ValueError)
    np.testing.assert_array_equal(request.value(), expect(row(2)))


def test_committed_sub_call_is_dispatched_first_and_coalesces_with_its_queue() -> None:
    h = Harness(discipline=FIFO)
    h.add("n", sizes=(1,))
    h.add("m", sizes=(1, 4))
    older = h.submit("n", row(1))
    h.clock.advance(0.001)
    normal = [h.submit("m", row(k)) for k in (2, 3, 4)]
    h.clock.advance(0.001)
    committed = h.submit("m", row(9), committed=True)
    assert h.scheduler.step()
    # m is selected although n's head is older; the committed request leads the batch.
    assert h.ran() == [("m", 4)]
    assert h.runs[0].first_column == [9.0, 2.0, 3.0, 4.0]
    np.testing.assert_array_equal(committed.value(), expect(row(9)))
    for k, request in zip((2, 3, 4), normal, strict=True):
        np.testing.assert_array_equal(request.value(), expect(row(k)))
    assert not older.future.done()
    h.drain()
    assert h.ran() == [("m", 4), ("n", 1)]


def test_committed_sub_calls_run_oldest_first_across_models() -> None:
    h = Harness(discipline=FIFO)
    for name in "abc":
        h.add(name, sizes=(1,))
    h.submit("c", row(1))
    h.clock.advance(0.001)
    h.submit("b", row(2), committed=True)
    h.clock.advance(0.001)
    h.submit("a", row(3), committed=True)
    h.drain()
    assert [name for name, _ in h.ran()] == ["b", "a", "c"]


def test_committed_request_queues_ahead_of_more_urgent_priorities() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1,))
    h.submit("m", row(1), priority=1)
    h.submit("m", row(2), committed=True)
    h.drain()
    assert [r.first_column for r in h.runs] == [[2.0], [1.0]]


def test_stale_committed_entry_is_skipped() -> None:
    h = Harness(discipline=FIFO)
    h.add("n", sizes=(1,))
    h.add("m", sizes=(1,))
    h.submit("n", row(1))
    h.clock.advance(0.001)
    h.submit("m", row(2))
    h.clock.advance(0.001)
    stale = h.submit("m", row(3), committed=True)
    assert h.scheduler.cancel(stale.pending)
    assert h.scheduler.step()
    # Without the (cancelled) committed entry, fifo picks n's older head.
    assert h.ran() == [("n", 1)]
    h.drain()
    assert h.ran() == [("n", 1), ("m", 1)]
    assert [r.first_column for r in h.runs] == [[1.0], [2.0]]
    assert isinstance(stale.future.exception(timeout=0), asyncio.CancelledError)


# -- disciplines ---------------------------------------------------------------------------


def test_fifo_serves_the_oldest_head_across_models() -> None:
    h = Harness(discipline=FIFO)
    for name in "abc":
        h.add(name, sizes=(1,))
    h.submit("c", row(1))
    h.clock.advance(0.001)
    h.submit("a", row(2))
    h.clock.advance(0.001)
    h.submit("b", row(3))
    h.clock.advance(0.001)
    h.submit("c", row(4))
    h.drain()
    assert [name for name, _ in h.ran()] == ["c", "a", "b", "c"]


def test_fifo_ties_break_by_model_name() -> None:
    h = Harness(discipline=FIFO)
    for name in "ba":
        h.add(name, sizes=(1,))
    h.submit("b")
    h.submit("a")  # same fake instant
    h.drain()
    assert [name for name, _ in h.ran()] == ["a", "b"]


def test_edf_selects_the_earliest_deadline_anywhere_in_a_queue() -> None:
    h = Harness(discipline=EDF)
    for name in "abc":
        h.add(name, sizes=(1,))
    h.submit("c", row(1))  # oldest, no deadline (+inf)
    h.clock.advance(0.001)
    h.submit("a", row(2))  # a's head has no deadline ...
    h.submit("a", row(3), deadline_ns=h.at(5.0))  # ... but a holds the earliest one
    h.clock.advance(0.001)
    h.submit("b", row(4), deadline_ns=h.at(9.0))
    h.drain()
    assert [name for name, _ in h.ran()] == ["a", "a", "b", "c"]
    # The queue itself is not reordered: a's head ran first.
    assert [r.first_column[0] for r in h.runs] == [2.0, 3.0, 4.0, 1.0]


def test_edf_without_deadlines_falls_back_to_the_oldest_head_then_name() -> None:
    h = Harness(discipline=EDF)
    for name in "abc":
        h.add(name, sizes=(1,))
    h.submit("c")
    h.submit("b")
    h.clock.advance(0.001)
    h.submit("a")
    h.drain()
    assert [name for name, _ in h.ran()] == ["b", "c", "a"]


def test_fair_reproduces_the_worked_example() -> None:
    """A, B, C with EMAs 0.7 / 0.2 / 0.1 and cost[., 2] of 10 / 30 / 100 ms: B, then C, then A."""
    h = Harness(discipline=FAIR)
    ema = {"A": 0.7, "B": 0.2, "C": 0.1}
    cost = {"A": 0.010, "B": 0.030, "C": 0.100}
    for name in "ABC":
        h.add(name, sizes=(1, 2), durations={1: ema[name], 2: cost[name]})
    # Build the EMAs with one single-row dispatch each, of exactly the EMA's duration.
    for name in "ABC":
        h.submit(name)
        h.drain()
    assert h.ran() == [("A", 1), ("B", 1), ("C", 1)]
    halflife = h.config.ema_halflife_seconds
    assert h.scheduler.stats("A") is not None
    loads = {n: s.recent_load for n in "ABC" if (s := h.scheduler.stats(n)) is not None}
    assert loads["A"] == pytest.approx(0.7 * 2 ** (-0.3 / halflife))
    assert loads["B"] == pytest.approx(0.2 * 2 ** (-0.1 / halflife))
    assert loads["C"] == pytest.approx(0.1)
    h.scheduler.seed_costs({RunKey(n, None, 2): cost[n] for n in "ABC"})
    # Two one-row requests each, A's the oldest (fifo would pick A).
    for name in "ABC":
        h.submit(name)
        h.submit(name)
        h.clock.advance(0.001)
    h.runs.clear()
    assert h.scheduler.step()
    assert h.ran() == [("B", 2)]
    depths = {n: h.scheduler.queue_depth(n) for n in "ABC"}
    assert depths == {"A": 2, "B": 0, "C": 2}
    h.drain()
    assert h.ran() == [("B", 2), ("C", 2), ("A", 2)]


def test_fair_weights_share_compute_under_sustained_backlog() -> None:
    h = Harness(discipline=FAIR)
    h.add("heavy", sizes=(1,), weight=3.0, duration_s=0.010)
    h.add("light", sizes=(1,), weight=1.0, duration_s=0.010)
    for _ in range(400):
        for name in ("heavy", "light"):
            while h.scheduler.queue_depth(name) < 2:
                h.submit(name)
        assert h.scheduler.step()
    served = Counter(name for name, _ in h.ran())
    assert served["heavy"] + served["light"] == 400
    assert served["heavy"] / served["light"] == pytest.approx(3.0, rel=0.05)
    heavy, light = h.scheduler.stats("heavy"), h.scheduler.stats("light")
    assert heavy is not None
    assert light is not None
    assert heavy.compute_seconds / light.compute_seconds == pytest.approx(3.0, rel=0.05)


def test_fair_equal_weights_alternate_under_backlog() -> None:
    h = Harness(discipline=FAIR)
    h.add("a", sizes=(1,), duration_s=0.010)
    h.add("b", sizes=(1,), duration_s=0.010)
    for _ in range(100):
        for name in "ab":
            while h.scheduler.queue_depth(name) < 2:
                h.submit(name)
        h.scheduler.step()
    served = Counter(name for name, _ in h.ran())
    assert abs(served["a"] - served["b"]) <= 2


def test_fair_ema_decays_with_the_clock() -> None:
    h = Harness(discipline=FAIR)
    h.add("m", sizes=(1,), duration_s=1.0)
    h.submit("m")
    h.drain()
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert stats.recent_load == pytest.approx(1.0)
    h.clock.advance(30.0)
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert stats.recent_load == pytest.approx(0.5)
    h.clock.advance(30.0)
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert stats.recent_load == pytest.approx(0.25)
    # A new 1 s dispatch: decay to its end, then add its compute.
    h.submit("m")
    h.drain()
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert stats.recent_load == pytest.approx(0.25 * 2 ** (-1 / 30) + 1.0)


def test_fair_model_never_dispatched_is_preferred_over_a_busy_one() -> None:
    h = Harness(discipline=FAIR)
    h.add("busy", sizes=(1,), duration_s=0.5)
    h.add("idle", sizes=(1,), duration_s=0.5)
    h.submit("busy")
    h.drain()
    h.submit("busy")
    h.clock.advance(0.001)
    h.submit("idle")
    h.runs.clear()
    h.drain()
    assert [name for name, _ in h.ran()] == ["idle", "busy"]


# -- cost learning -------------------------------------------------------------------------


def test_costs_follow_the_ema_of_measured_dispatch_times() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2), durations={1: 0.04, 2: 0.5})
    costs = h.scheduler.costs
    assert costs.measured("m", 1) is None
    h.submit("m")
    h.drain()
    assert costs.measured("m", 1) == pytest.approx(0.04)  # the first sample replaces the default
    h.durations[("m", 1)] = 0.01
    for _ in range(50):
        h.submit("m")
        h.drain()
    assert costs.measured("m", 1) == pytest.approx(0.01 + 0.03 * 0.8**50)
    assert costs.measured("m", 1) == pytest.approx(0.0100004, abs=1e-7)
    assert costs.measured("m", 2) is None
    h.submit("m")
    h.submit("m")
    h.drain()
    assert costs.measured("m", 2) == pytest.approx(0.5)
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert stats.compute_seconds == pytest.approx(0.04 + 50 * 0.01 + 0.5)


def test_a_seeded_cost_is_replaced_by_the_ema_not_by_the_first_sample() -> None:
    h = Harness(discipline=FIFO, cost_ema_alpha=0.5)
    h.add("m", sizes=(1,), duration_s=0.02)
    h.scheduler.seed_costs({RunKey("m", None, 1): 0.10})
    h.submit("m")
    h.drain()
    assert h.scheduler.costs.measured("m", 1) == pytest.approx(0.5 * 0.02 + 0.5 * 0.10)


# -- priority ------------------------------------------------------------------------------


def test_priority_orders_requests_within_a_model() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1,))
    h.submit("m", row(5), priority=5)
    h.submit("m", row(1), priority=1)
    h.submit("m", row(6), priority=5)
    h.submit("m", row(2), priority=1)
    h.drain()
    assert [r.first_column[0] for r in h.runs] == [1.0, 2.0, 5.0, 6.0]


def test_priority_does_not_change_which_model_is_selected() -> None:
    h = Harness(discipline=FIFO)
    h.add("a", sizes=(1,))
    h.add("b", sizes=(1,))
    h.submit("a", priority=9)
    h.clock.advance(0.001)
    h.submit("b", priority=1)
    h.drain()
    assert [name for name, _ in h.ran()] == ["a", "b"]


def test_unprioritised_requests_get_the_default_priority() -> None:
    h = Harness(discipline=FIFO, default_priority=3)
    h.add("m", sizes=(1,))
    late = h.submit("m", row(5), priority=5)
    plain = h.submit("m", row(3))
    negative = h.submit("m", row(4), priority=-2)
    urgent = h.submit("m", row(2), priority=2)
    assert (plain.pending.priority, negative.pending.priority) == (3, 3)
    assert (late.pending.priority, urgent.pending.priority) == (5, 2)
    h.drain()
    assert [r.first_column[0] for r in h.runs] == [2.0, 3.0, 4.0, 5.0]


def test_default_priority_is_the_top_level() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1,))
    demoted = h.submit("m", row(7), priority=2)
    plain = h.submit("m", row(1))
    assert plain.pending.priority == 1
    h.drain()
    assert [r.first_column[0] for r in h.runs] == [1.0, 7.0]
    np.testing.assert_array_equal(demoted.value(), expect(row(7)))


# -- batching ------------------------------------------------------------------------------


def test_the_spec_batching_example() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 4))
    requests = {k: h.submit("m", row(k)) for k in (1, 2, 3, 4)}
    assert h.scheduler.step()
    assert h.ran() == [("m", 4)]
    for k, request in requests.items():
        np.testing.assert_array_equal(request.value(), [[10.0 * k, 100.0 * k]])
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.dispatch_count, stats.requests_served, stats.rows_served) == (1, 4, 4)
    assert stats.batch_histogram == {4: 1}
    assert stats.queue_depth == 0
    assert not h.scheduler.step()


def test_a_lone_request_is_padded_to_the_only_compiled_size() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(4,))
    request = h.submit("m", row(3, 5))
    h.drain()
    assert h.ran() == [("m", 4)]
    np.testing.assert_array_equal(request.value(), [[30.0, 500.0]])
    (run,) = h.runs
    np.testing.assert_array_equal(run.inputs[0], [[3, 5], [0, 0], [0, 0], [0, 0]])
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.rows_served, stats.batch_histogram) == (1, {4: 1})


def test_requests_of_several_rows_are_concatenated_and_sliced_back() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 4, 8))
    first = h.submit("m", rows(1, 2, 3))
    second = h.submit("m", rows(4, 5))
    third = h.submit("m", rows(6, 7, 8))
    h.drain()
    assert h.ran() == [("m", 8)]
    assert h.runs[0].first_column == [1, 2, 3, 4, 5, 6, 7, 8]
    np.testing.assert_array_equal(first.value(), expect(rows(1, 2, 3)))
    np.testing.assert_array_equal(second.value(), expect(rows(4, 5)))
    np.testing.assert_array_equal(third.value(), expect(rows(6, 7, 8)))
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.requests_served, stats.rows_served) == (3, 8)


def test_max_batch_size_caps_the_batch() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 4, 8), max_batch_size=4)
    requests = [h.submit("m", rows(k, k)) for k in (1, 2, 3, 4)]
    h.drain()
    assert h.ran() == [("m", 4), ("m", 4)]
    for k, request in zip((1, 2, 3, 4), requests, strict=True):
        np.testing.assert_array_equal(request.value(), expect(rows(k, k)))
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.dispatch_count, stats.requests_served) == (2, 4)


def test_batch_stops_at_the_first_request_that_does_not_fit() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 4, 8))
    h.submit("m", rows(1, 1))
    h.submit("m", rows(2, 2))
    h.submit("m", rows(3, 3))
    h.drain()
    # R = 6 -> B = 4 takes two requests; the third (2 rows) runs alone, padded to 4.
    assert [r.first_column for r in h.runs] == [[1, 1, 2, 2], [3, 3, 0, 0]]


@pytest.mark.parametrize(
    ("queued", "sizes", "cap", "batch", "taken"),
    [
        ((2, 2, 2), (1, 4, 8), None, 4, 2),
        ((1,), (4, 8), None, 4, 1),
        ((6, 1), (1, 4, 8), None, 8, 2),
        ((2, 2, 2, 2), (1, 4, 8), 4, 4, 2),
        ((1, 1, 1), (4, 8), 2, 4, 2),
        ((6,), (1, 4, 8), 2, 8, 1),
        ((1, 1, 1, 1, 1), (1, 8), None, 1, 1),
        ((1, 1, 1, 1), (1, 4), None, 4, 4),
    ],
)
def test_the_planning_table_end_to_end(
    queued: tuple[int, ...], sizes: tuple[int, ...], cap: int | None, batch: int, taken: int
) -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=sizes, max_batch_size=cap)
    requests = [
        h.submit("m", rows(*[10 * i + j + 1 for j in range(n)])) for i, n in enumerate(queued)
    ]
    assert h.scheduler.step()
    assert h.ran() == [("m", batch)]
    done = [r for r in requests if r.future.done()]
    assert done == requests[:taken]
    assert h.scheduler.queue_depth("m") == len(queued) - taken
    h.drain()
    for n, request in zip(queued, requests, strict=True):
        assert request.value().shape == (n, 2)
        np.testing.assert_array_equal(request.value(), expect(request.pending.inputs[0]))


@pytest.mark.parametrize("pad_up", [False, True])
def test_pad_up_when_cheaper_uses_measured_costs(pad_up: bool) -> None:
    h = Harness(discipline=FIFO, pad_up_when_cheaper=pad_up)
    h.add("m", sizes=(1, 8), durations={1: 0.010, 8: 0.012})
    h.submit("m")
    h.drain()  # measures cost[1]
    for _ in range(8):
        h.submit("m")
    h.drain()  # measures cost[8]
    assert h.ran() == [("m", 1), ("m", 8)]
    h.runs.clear()
    requests = [h.submit("m", row(k)) for k in range(1, 6)]
    h.drain()
    if pad_up:  # 5 rows / 12 ms beats 1 row / 10 ms
        assert h.ran() == [("m", 8)]
    else:
        assert h.ran() == [("m", 1)] * 5
    for k, request in zip(range(1, 6), requests, strict=True):
        np.testing.assert_array_equal(request.value(), expect(row(k)))


def test_batch_axis_at_any_position_is_concatenated_and_sliced_along_it() -> None:
    spec = TensorSpec("x", DType.F32, (Fixed(2), Batch()))
    h = Harness(discipline=FIFO)
    h.add(
        "t",
        sizes=(1, 4),
        inputs=(spec,),
        output_axes=(1,),
        compute=lambda x: x * SCALE[:, None],
    )
    first = h.submit("t", np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))  # 2 rows
    second = h.submit("t", np.array([[5.0], [6.0]], np.float32))  # 1 row
    h.drain()
    assert h.ran() == [("t", 4)]
    np.testing.assert_array_equal(h.runs[0].inputs[0], [[1, 2, 5, 0], [3, 4, 6, 0]])
    np.testing.assert_array_equal(first.value(), [[10.0, 20.0], [300.0, 400.0]])
    np.testing.assert_array_equal(second.value(), [[50.0], [600.0]])
    stats = h.scheduler.stats("t")
    assert stats is not None
    assert stats.rows_served == 3


def test_a_model_without_batch_axis_runs_one_request_per_dispatch_at_size_0() -> None:
    spec = TensorSpec("x", DType.F32, (Fixed(2),))
    h = Harness(discipline=FIFO)
    h.add("u", sizes=(0,), inputs=(spec,), output_axes=(None,), coalescable=False)
    first = h.submit("u", np.array([1.0, 2.0], np.float32))
    second = h.submit("u", np.array([3.0, 4.0], np.float32))
    h.drain()
    assert h.ran() == [("u", 0), ("u", 0)]
    np.testing.assert_array_equal(first.value(), [10.0, 200.0])
    np.testing.assert_array_equal(second.value(), [30.0, 400.0])
    stats = h.scheduler.stats("u")
    assert stats is not None
    assert (stats.requests_served, stats.rows_served, stats.batch_histogram) == (2, 2, {0: 2})


def test_variants_coalesce_only_with_themselves() -> None:
    spec, axes = variant_axes()
    h = Harness(discipline=FIFO)
    h.add(
        "v",
        sizes=(1, 2),
        inputs=(spec,),
        variants=(0, 1),
        variable_axes=axes,
        variant_keys={(2,): 0, (3,): 1},
        compute=lambda x: x * 2,
    )
    a1 = h.submit("v", np.full((1, 2), 1, np.float32))
    a2 = h.submit("v", np.full((1, 2), 2, np.float32))
    b1 = h.submit("v", np.full((1, 3), 3, np.float32))
    h.drain()
    assert [(r.variant, r.batch) for r in h.runs] == [(0, 2), (1, 1)]
    np.testing.assert_array_equal(a1.value(), np.full((1, 2), 2))
    np.testing.assert_array_equal(a2.value(), np.full((1, 2), 4))
    np.testing.assert_array_equal(b1.value(), np.full((1, 3), 6))
    # A, B, A: the window stops at the other variant (no skipping).
    h.runs.clear()
    for extent in (2, 3, 2):
        h.submit("v", np.ones((1, extent), np.float32))
    h.drain()
    assert [(r.variant, r.batch) for r in h.runs] == [(0, 1), (1, 1), (0, 1)]


def test_uncompiled_variant_is_refused() -> None:
    spec, axes = variant_axes()
    h = Harness(discipline=FIFO)
    h.add(
        "v",
        sizes=(1,),
        inputs=(spec,),
        variants=(0, 1),
        variable_axes=axes,
        variant_keys={(2,): 0, (4,): 1},
    )
    with pytest.raises(InvalidArgumentError, match=r"variant \[5\]; compiled: \[\[2\], \[4\]\]"):
        h.submit("v", np.ones((1, 5), np.float32))


def test_a_non_coalescable_model_serves_one_request_per_dispatch() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 4), coalescable=False)
    singles = [h.submit("m", row(k)) for k in (1, 2, 3)]
    double = h.submit("m", rows(4, 5))
    h.drain()
    assert h.ran() == [("m", 1), ("m", 1), ("m", 1), ("m", 4)]
    for k, request in zip((1, 2, 3), singles, strict=True):
        np.testing.assert_array_equal(request.value(), expect(row(k)))
    np.testing.assert_array_equal(double.value(), expect(rows(4, 5)))
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.dispatch_count, stats.requests_served, stats.rows_served) == (4, 4, 5)
    assert stats.batch_histogram == {1: 3, 4: 1}


def test_unbatched_outputs_go_whole_to_every_request() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2), output_axes=(None,), compute=lambda x: x.sum(axis=0, keepdims=True))
    first = h.submit("m", row(1))
    second = h.submit("m", row(2))
    h.drain()
    assert h.ran() == [("m", 2)]
    np.testing.assert_array_equal(first.value(), [[3.0, 3.0]])
    np.testing.assert_array_equal(second.value(), [[3.0, 3.0]])


def test_queue_wait_statistics_come_from_the_clock() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(4,))
    for _ in range(3):
        h.submit("m")
        h.clock.advance(1.0)
    h.drain()
    assert h.ran() == [("m", 4)]
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert stats.queue_wait_count == 3
    assert stats.queue_wait_ns == 6_000_000_000  # waits 3 s, 2 s, 1 s
    assert stats.queue_wait_p50 == pytest.approx(2.0)
    assert stats.queue_wait_p99 == pytest.approx(3.0)


def test_queue_wait_percentiles_cover_the_last_1024_dispatched_requests() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1,))
    for _ in range(76):
        h.submit("m")
    h.clock.advance(100.0)
    h.drain()  # 76 waits of 100 s
    for _ in range(1024):
        h.submit("m")
    h.drain()  # 1024 waits of 0 s push the old ones out of the ring
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert stats.queue_wait_count == 1100
    assert stats.queue_wait_ns == 76 * 100_000_000_000
    assert (stats.queue_wait_p50, stats.queue_wait_p99) == (0.0, 0.0)


def test_effective_max_batch_is_reported_by_the_model() -> None:
    h = Harness(discipline=FIFO)
    assert h.add("a", sizes=(1, 4, 8)).max_batch == 8
    assert h.add("b", sizes=(1, 4, 8), max_batch_size=6).max_batch == 6
    assert h.add("c", sizes=(1, 4), coalescable=False).max_batch == 0


# -- admission -----------------------------------------------------------------------------


def test_unknown_model_is_not_found() -> None:
    h = Harness()
    with pytest.raises(ModelNotFoundError) as info:
        h.submit("ghost")
    assert info.value.status is grpc.StatusCode.NOT_FOUND
    assert h.scheduler.stats("ghost") is None


def test_a_full_queue_sheds_with_resource_exhausted() -> None:
    h = Harness(discipline=FIFO, max_queue_depth=2)
    h.add("m", sizes=(1,))
    kept = [h.submit("m", row(k)) for k in (1, 2)]
    with pytest.raises(OverloadedError) as info:
        h.submit("m", row(3))
    assert info.value.status is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(info.value) == "queue for model 'm' is full (2)"
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.shed, stats.queue_depth) == (1, 2)
    h.drain()
    assert [r.value()[0, 0] for r in kept] == [10.0, 20.0]
    h.submit("m", row(3))  # room again
    assert h.scheduler.queue_depth("m") == 1


@pytest.mark.parametrize(
    ("tensors", "match"),
    [
        pytest.param([NamedTensor("x", np.ones((1, 2), np.float64))], "datatype", id="dtype"),
        pytest.param([], "expects input 'x'", id="missing"),
        pytest.param(
            [NamedTensor("x", np.ones((1, 2), np.float32)), NamedTensor("y", np.ones(1))],
            "unexpected",
            id="undeclared",
        ),
        pytest.param([NamedTensor("x", np.ones((1, 3), np.float32))], "shape", id="fixed-extent"),
        pytest.param([NamedTensor("x", np.ones((2,), np.float32))], "rank", id="rank"),
        pytest.param([NamedTensor("x", np.ones((0, 2), np.float32))], "0 rows", id="no-rows"),
        pytest.param(
            [NamedTensor("x", np.ones((3, 2), np.float32))], "largest compiled", id="too-many-rows"
        ),
    ],
)
def test_invalid_inputs_are_refused_and_nothing_is_queued(
    tensors: list[NamedTensor], match: str
) -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2))
    with pytest.raises(InvalidArgumentError, match=match) as info:
        h.submit("m", tensors=tensors)
    assert info.value.status is grpc.StatusCode.INVALID_ARGUMENT
    assert h.scheduler.queue_depth("m") == 0
    assert not h.scheduler.step()


def test_admission_checks_run_in_the_spec_order() -> None:
    h = Harness(discipline=FIFO)
    h.add("m")
    past = h.at(-1.0)
    with pytest.raises(ModelNotFoundError):  # lookup before the deadline
        h.submit("ghost", deadline_ns=past)
    bad = [NamedTensor("x", np.ones((1, 3), np.float32))]
    with pytest.raises(DeadlineExceededError):  # the deadline before validation
        h.submit("m", tensors=bad, deadline_ns=past)
    with pytest.raises(InvalidArgumentError):
        h.submit("m", tensors=bad, deadline_ns=h.at(1.0))


@pytest.mark.parametrize("before_s", [0.0, 0.001])
def test_a_deadline_already_passed_queues_nothing(before_s: float) -> None:
    h = Harness(discipline=FIFO)
    model = h.add("m")
    with pytest.raises(DeadlineExceededError) as info:
        h.submit("m", deadline_ns=h.at(-before_s))
    assert info.value.status is grpc.StatusCode.DEADLINE_EXCEEDED
    assert h.scheduler.queue_depth("m") == 0
    assert model.outstanding == 0
    assert not h.scheduler.step()
    assert h.runs == []


# -- failure isolation ---------------------------------------------------------------------


def test_a_failed_merged_dispatch_reruns_each_request_alone() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2))
    first, second = h.submit("m", row(1)), h.submit("m", row(2))
    h.backend.fail_next_execution(RuntimeError("transient device error"))
    assert h.scheduler.step()
    assert h.ran() == [("m", 1), ("m", 1)]
    np.testing.assert_array_equal(first.value(), expect(row(1)))
    np.testing.assert_array_equal(second.value(), expect(row(2)))
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.dispatch_count, stats.requests_served, stats.failed) == (2, 2, 0)


def test_only_the_request_that_fails_alone_gets_the_error() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 4))
    requests = [h.submit("m", row(k)) for k in (1, -2, 3, 4)]
    h.drain()
    merged, *alone = [(r.batch, r.ok) for r in h.runs]
    assert merged == (4, False)
    assert alone == [(1, True), (1, False), (1, True), (1, True)]
    bad = requests[1].error()
    assert isinstance(bad, RuntimeError)
    assert "poisoned" in str(bad)
    assert status_of(bad) is grpc.StatusCode.INTERNAL
    for k, request in zip((1, 3, 4), (requests[0], *requests[2:]), strict=True):
        np.testing.assert_array_equal(request.value(), expect(row(k)))
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.requests_served, stats.failed, stats.dispatch_count) == (3, 1, 3)


def test_a_single_request_failure_goes_to_that_request_and_others_keep_working() -> None:
    h = Harness(discipline=FIFO)
    h.add("m", sizes=(1, 2))
    h.add("n", sizes=(1,))
    boom = RuntimeError("boom")
    doomed = h.submit("m", row(1))
    h.backend.fail_next_execution(boom)
    h.drain()
    assert doomed.error() is boom
    assert h.runs == []  # one attempt, no retry of a single-request dispatch
    stats = h.scheduler.stats("m")
    assert stats is not None
    assert (stats.failed, stats.dispatch_count) == (1, 0)
    after_m = h.submit("m", row(2))
    after_n = h.submit("n", row(3))
    h.drain()
    np.testing.assert_array_equal(after_m.value(), expect(row(2)))
    np.testing.assert_array_equal(after_n.value(), expect(row(3)))


def test_a_failing_model_does_not_affect_the_next_model_in_line() -> None:
    h = Harness(discipline=FIFO)
    h.add("bad", sizes=(1, 2))
    h.add("good", sizes=(1, 2))
    broken = [h.submit("bad", row(-1)), h.submit("bad", row(-2))]
    h.clock.advance(0.001)
    fine = h.submit("good", row(5))
    h.drain()
    assert all(isinstance(r.error(), RuntimeError) for r in broken)
    np.testing.assert_array_equal(fine.value(), expect(row(5)))
    bad = h.scheduler.stats("bad")
    assert bad is not None
    assert (bad.failed, bad.dispatch_count) == (2, 0)


def test_every_future_is_resolved_after_draining() -> None:
    h = Harness(discipline=FAIR)
    for name, sizes in (("a", (1, 2, 4)), ("b", (1,)), ("c", (2, 8))):
        h.add(name, sizes=sizes, duration_s=0.003)
    submitted: list[Request] = []
    for i in range(60):
        name = "abc"[i % 3]
        submitted.append(h.submit(name, row(-1 if i % 17 == 5 else i + 1)))
        if i % 7 == 0:
            h.scheduler.step()
    h.drain()
    assert all(r.future.done() for r in submitted)
    failed = [r for r in submitted if r.future.exception(timeout=0) is not None]
    assert len(failed) == sum(1 for i in range(60) if i % 17 == 5)
    served = sum(s.requests_served for s in h.scheduler.all_stats().values())
    assert served == 60 - len(failed)


# -- a random workload ---------------------------------------------------------------------


@attrs.define
class Workload:
    """Seeded random traffic against one harness, and what each caller should see."""

    h: Harness
    rng: np.random.Generator
    shapes: dict[str, tuple[tuple[int, ...], int | None]] = attrs.Factory(
        lambda: {"a": ((1, 2, 4), None), "b": ((1, 8), 3), "c": ((2, 4), None), "d": ((1, 2), None)}
    )
    generation: dict[str, int] = attrs.Factory(dict)
    drained: Counter[tuple[str, int]] = attrs.Factory(Counter)
    retired: list[tuple[str, int]] = attrs.Factory(list)
    submitted: list[tuple[Request, bool, bool]] = attrs.Factory(list)
    """``(request, poisoned, cancelled)``."""
    injected: int = 0
    shed: int = 0

    def install(self, name: str) -> None:
        sizes, cap = self.shapes[name]
        gen = self.generation[name] = self.generation.get(name, 0) + 1

        def drained() -> None:
            self.drained.update([(name, gen)])

        self.h.add(
            name,
            sizes=sizes,
            max_batch_size=cap,
            coalescable=name != "d",
            generation=gen,
            weight=float(1 + ord(name) % 3),
            duration_s=float(self.rng.uniform(0.001, 0.01)),
            compute=lambda x: x * SCALE * gen,
            on_drained=drained,
        )

    def submit(self, name: str) -> None:
        rng = self.rng
        x = rows(*(float(v) for v in rng.integers(1, 100, int(rng.integers(1, 3)))))
        poisoned = bool(rng.random() < 0.05)
        if poisoned:
            x[0, 0] = -1.0
        deadline = self.h.at(float(rng.uniform(0.001, 0.05))) if rng.random() < 0.3 else None
        try:
            request = self.h.submit(
                name,
                x,
                deadline_ns=deadline,
                priority=int(rng.integers(0, 4)),
                committed=bool(rng.random() < 0.1),
            )
        except OverloadedError:
            self.shed += 1
        else:
            self.submitted.append((request, poisoned, False))

    def cancel_one(self) -> None:
        i = int(self.rng.integers(0, len(self.submitted)))
        request, poisoned, _ = self.submitted[i]
        if self.h.scheduler.cancel(request.pending):
            self.submitted[i] = (request, poisoned, True)

    def turn(self) -> None:
        action = int(self.rng.integers(0, 20))
        name = "abcd"[int(self.rng.integers(0, 4))]
        if action < 12:
            self.submit(name)
        elif action < 14 and self.submitted:
            self.cancel_one()
        elif action == 14:
            self.h.backend.fail_next_execution(RuntimeError("injected"))
            self.injected += 1
        elif action == 15:
            self.retired.append((name, self.generation[name]))
            self.install(name)
        elif action == 16:
            self.h.clock.advance(float(self.rng.uniform(0.0, 0.02)))
        else:
            self.h.scheduler.step()

    def outcome(self, request: Request, poisoned: bool, cancelled: bool) -> str:
        assert request.future.done()
        exc = request.future.exception(timeout=0)
        if cancelled:
            assert isinstance(exc, asyncio.CancelledError)
            return "cancelled"
        if exc is None:
            assert not poisoned
            g = request.pending.model.generation
            np.testing.assert_array_equal(request.value(), request.pending.inputs[0] * SCALE * g)
            return "served"
        if isinstance(exc, DeadlineExceededError):
            assert request.pending.deadline_ns is not None
            return "expired"
        assert isinstance(exc, RuntimeError)
        return "failed" if poisoned else "injected"


@pytest.mark.parametrize("discipline", [FIFO, EDF, FAIR])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_workload_keeps_every_invariant(discipline: SchedulingDiscipline, seed: int) -> None:
    """Mixed traffic, failures, cancellations, deadlines and reloads: every caller answered once."""
    h = Harness(discipline=discipline, max_queue_depth=12)
    work = Workload(h, np.random.default_rng(seed))
    for name in work.shapes:
        work.install(name)
    for _ in range(400):
        work.turn()
    h.drain()
    outcomes = Counter(work.outcome(*entry) for entry in work.submitted)
    assert outcomes["injected"] <= work.injected
    stats = h.scheduler.all_stats()
    assert sum(s.requests_served for s in stats.values()) == outcomes["served"]
    assert sum(s.cancelled for s in stats.values()) == outcomes["cancelled"]
    assert sum(s.expired for s in stats.values()) == outcomes["expired"]
    assert sum(s.failed for s in stats.values()) == outcomes["failed"] + outcomes["injected"]
    assert sum(s.shed for s in stats.values()) == work.shed
    assert all(s.queue_depth == 0 for s in stats.values())
    assert all(r.pending.model.outstanding == 0 for r, _, _ in work.submitted)
    assert sorted(work.drained) == sorted(work.retired)
    assert all(count == 1 for count in work.drained.values())


def test_set_weight_changes_the_live_weight_and_checks_it() -> None:
    h = Harness(discipline=FAIR)
    model = h.add("m")
    assert h.scheduler.set_weight("m", 3.5)
    assert model.weight == 3.5
    assert not h.scheduler.set_weight("unknown", 2.0)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite and > 0"):
            h.scheduler.set_weight("m", bad)
    assert model.weight == 3.5
