"""The fair discipline's arithmetic and selection."""

from __future__ import annotations

import math

import pytest

from reactantserver.worker.scheduler.costs import CostTable
from reactantserver.worker.scheduler.disciplines import PlannedBatch, select_fair
from reactantserver.worker.scheduler.fair import (
    DEFAULT_COST_S,
    MIN_COST_S,
    RecentLoad,
    decay,
    fair_priority,
    shares,
)
from reactantserver.worker.scheduler.planning import plan_batch
from reactantserver.worker.scheduler.queue import ModelQueue

from ._builders import pending, queue_of, scheduled

CAP = 0.25
DISCOUNT = 0.1
SHARE = 1.0 / 3.0
EMAS = {"A": 0.7, "B": 0.2, "C": 0.1}
COSTS_S = {"A": 0.010, "B": 0.030, "C": 0.100}
S = 1_000_000_000  # ns per second


def _priority(share: float, nema: float, cost: float, requests: int) -> float:
    return fair_priority(
        share=share, nema=nema, cost=cost, requests=requests, cap=CAP, discount=DISCOUNT
    )


# -- worked example ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [("A", -27.78), ("B", 4.938), ("C", 2.593)],
)
def test_worked_example_priorities(model: str, expected: float) -> None:
    got = _priority(SHARE, EMAS[model], COSTS_S[model], requests=2)
    assert got == pytest.approx(expected, rel=5e-4)


def test_worked_example_intermediate_values() -> None:
    # share - nema: -0.3667 / +0.1333 / +0.2333; A is clamped to -0.25; eff. cost = 0.9 * cost.
    assert SHARE - EMAS["A"] == pytest.approx(-0.3667, abs=1e-4)
    assert _priority(SHARE, EMAS["A"], 0.009 / 0.9, 2) * 0.009 == pytest.approx(-0.25)
    assert _priority(SHARE, EMAS["B"], 0.027 / 0.9, 2) * 0.027 == pytest.approx(0.1333, abs=1e-4)
    assert _priority(SHARE, EMAS["C"], 0.090 / 0.9, 2) * 0.090 == pytest.approx(0.2333, abs=1e-4)


def test_worked_example_ranking_is_b_c_a() -> None:
    ranked = sorted(EMAS, key=lambda m: -_priority(SHARE, EMAS[m], COSTS_S[m], 2))
    assert ranked == ["B", "C", "A"]


@pytest.mark.parametrize(
    ("model", "expected"),
    [("A", -0.0278), ("B", 0.00494), ("C", 0.00259)],
)
def test_worked_example_in_milliseconds(model: str, expected: float) -> None:
    got = _priority(SHARE, EMAS[model], COSTS_S[model] * 1000.0, requests=2)
    assert got == pytest.approx(expected, rel=2e-3)


def test_worked_example_ranking_is_unit_free() -> None:
    in_s = sorted(EMAS, key=lambda m: -_priority(SHARE, EMAS[m], COSTS_S[m], 2))
    in_ms = sorted(EMAS, key=lambda m: -_priority(SHARE, EMAS[m], COSTS_S[m] * 1e3, 2))
    assert in_s == in_ms == ["B", "C", "A"]


# -- the three checks ---------------------------------------------------------------------------


def test_clamp_check() -> None:
    assert _priority(SHARE, 0.7, 1.0, requests=1) == -0.25
    assert _priority(SHARE, 0.0, 1.0, requests=1) == 0.25


def test_clamp_uses_the_configured_cap() -> None:
    got = fair_priority(share=1.0, nema=0.0, cost=1.0, requests=1, cap=0.5, discount=0.0)
    assert got == 0.5


def test_discount_check() -> None:
    x = _priority(0.5, 0.4, 0.010, requests=1)
    y = _priority(0.5, 0.4, 0.0105, requests=4)
    assert x == pytest.approx(10.0)
    assert y == pytest.approx(10.58, rel=5e-4)
    assert y > x


def test_discount_applies_only_to_coalesced_plans() -> None:
    one = _priority(0.5, 0.4, 0.01, requests=1)
    two = _priority(0.5, 0.4, 0.01, requests=2)
    assert one == pytest.approx(0.1 / 0.01)
    assert two == pytest.approx(0.1 / 0.009)


def test_zero_cost_does_not_divide_by_zero() -> None:
    got = fair_priority(share=0.5, nema=0.4, cost=0.0, requests=1, cap=CAP, discount=DISCOUNT)
    assert got == pytest.approx(0.1 / MIN_COST_S)


def test_decay_check() -> None:
    assert decay(1.0, 30.0, 30.0) == pytest.approx(0.5)
    assert decay(1.0, 60.0, 30.0) == pytest.approx(0.25)


def test_decay_without_elapsed_time_is_identity() -> None:
    assert decay(0.7, 0.0, 30.0) == 0.7
    assert decay(0.7, -5.0, 30.0) == 0.7
    assert decay(0.0, 100.0, 30.0) == 0.0


def test_default_cost() -> None:
    assert DEFAULT_COST_S == 0.01


# -- shares -------------------------------------------------------------------------------------


def test_shares_are_weights_over_their_sum() -> None:
    assert shares({"a": 1.0, "b": 1.0, "c": 1.0}) == pytest.approx(
        {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}
    )
    assert shares({"a": 3.0, "b": 1.0}) == {"a": 0.75, "b": 0.25}


def test_shares_of_zero_total_are_zero() -> None:
    assert shares({"a": 0.0, "b": 0.0}) == {"a": 0.0, "b": 0.0}
    assert shares({}) == {}


# -- RecentLoad ---------------------------------------------------------------------------------


def test_recent_load_rejects_a_non_positive_halflife() -> None:
    with pytest.raises(ValueError, match="halflife must be > 0"):
        RecentLoad(0.0)


def test_recent_load_add_decays_then_adds() -> None:
    load = RecentLoad(halflife_s=30.0)
    assert load.value("m", 5 * S) == 0.0
    assert load.add("m", 1.0, 10 * S) == 1.0
    assert load.value("m", 40 * S) == pytest.approx(0.5)
    assert load.value("m", 70 * S) == pytest.approx(0.25)
    # 30 s later the 1.0 has halved; the new 0.2 is added on top.
    assert load.add("m", 0.2, 40 * S) == pytest.approx(0.7)
    assert load.value("m", 70 * S) == pytest.approx(0.35)


def test_recent_load_normalised() -> None:
    load = RecentLoad(halflife_s=30.0)
    for name, ema in EMAS.items():
        load.add(name, ema, 0)
    got = load.normalised(["A", "B", "C", "D"], 0)
    assert got == pytest.approx({"A": 0.7, "B": 0.2, "C": 0.1, "D": 0.0})
    # Decay is common to all models, so the normalised shares do not move.
    assert load.normalised(["A", "B", "C"], 45 * S) == pytest.approx(EMAS)


def test_recent_load_normalised_all_zero() -> None:
    load = RecentLoad(halflife_s=30.0)
    assert load.normalised(["a", "b"], 0) == {"a": 0.0, "b": 0.0}


def test_recent_load_forget() -> None:
    load = RecentLoad(halflife_s=30.0)
    load.add("a", 1.0, 0)
    load.add("b", 1.0, 0)
    load.forget("a")
    load.forget("never-seen")
    assert load.value("a", 0) == 0.0
    assert load.normalised(["a", "b"], 0) == {"a": 0.0, "b": 1.0}


# -- select_fair over real queues -------------------------------------------------------------


def _example_queues() -> dict[str, ModelQueue]:
    queues = {}
    for i, name in enumerate("ABC"):
        model = scheduled(name, sizes=(1, 2))
        queues[name] = queue_of(
            pending(model, enqueue_ns=i * 10), pending(model, enqueue_ns=i * 10 + 1)
        )
    return queues


def _plan_of(queues: dict[str, ModelQueue], name: str) -> PlannedBatch:
    queue = queues[name]
    head = queue[0]
    window = queue.window(head, math.inf)
    plan = plan_batch([r.rows for r in window], head.model.sizes[head.variant])
    return PlannedBatch(plan.batch, plan.count)


def test_select_fair_reproduces_the_worked_example() -> None:
    queues = _example_queues()
    costs = CostTable()
    for name, seconds in COSTS_S.items():
        costs.record(name, 2, seconds)
    load = RecentLoad(halflife_s=30.0)
    for name, ema in EMAS.items():
        load.add(name, ema, 0)
    names = list(queues)
    assert [_plan_of(queues, n) for n in names] == [PlannedBatch(2, 2)] * 3

    winner = select_fair(
        queues,
        lambda name: _plan_of(queues, name),
        share=shares(dict.fromkeys(names, 1.0)),
        nema=load.normalised(names, 0),
        cost=costs.get,
        cap=CAP,
        discount=DISCOUNT,
    )
    assert winner == "B"

    # B is dispatched: only B's queue shrinks.
    taken = queues["B"].window(queues["B"][0], math.inf)[: _plan_of(queues, "B").requests]
    queues["B"].remove_all(taken)
    assert {n: len(q) for n, q in queues.items()} == {"A": 2, "B": 0, "C": 2}


def test_select_fair_is_unit_free() -> None:
    queues = _example_queues()
    names = list(queues)
    winner = select_fair(
        queues,
        lambda name: _plan_of(queues, name),
        share=shares(dict.fromkeys(names, 1.0)),
        nema=EMAS,
        cost=lambda name, batch: COSTS_S[name] * 1000.0,
        cap=CAP,
        discount=DISCOUNT,
    )
    assert winner == "B"


def test_select_fair_unmeasured_costs_use_the_default() -> None:
    # With every cost at the default, the largest deficit wins: C (EMA 0.1).
    queues = _example_queues()
    names = list(queues)
    winner = select_fair(
        queues,
        lambda name: _plan_of(queues, name),
        share=shares(dict.fromkeys(names, 1.0)),
        nema=EMAS,
        cost=CostTable().get,
        cap=CAP,
        discount=DISCOUNT,
    )
    assert winner == "C"


def test_select_fair_ties_go_to_the_oldest_head_then_the_name() -> None:
    a, b, c = scheduled("a"), scheduled("b"), scheduled("c")
    queues = {
        "c": queue_of(pending(c, enqueue_ns=5)),
        "b": queue_of(pending(b, enqueue_ns=7)),
        "a": queue_of(pending(a, enqueue_ns=7)),
    }

    def select() -> str:
        return select_fair(
            queues,
            lambda name: PlannedBatch(1, 1),
            share={},
            nema={},
            cost=lambda name, batch: 0.01,
            cap=CAP,
            discount=DISCOUNT,
        )

    assert select() == "c"
    del queues["c"]
    assert select() == "a"
