"""The per-queue plan memo: a reused plan always equals planning afresh."""

from __future__ import annotations

import random

import pytest

from reactantserver.core.config import SchedulerConfig
from reactantserver.worker.scheduler._state import SchedulerState
from reactantserver.worker.scheduler.queue import ModelQueue, Pending

from ._builders import pending, scheduled


def _fresh(state: SchedulerState, queue: ModelQueue) -> tuple[list[Pending], int]:
    queue.plan_memo = None
    return state.plan_locked(queue, queue[0])


@pytest.mark.parametrize("seed", range(20))
def test_reused_plans_match_fresh_ones_through_random_changes(seed: int) -> None:
    rng = random.Random(seed)
    state = SchedulerState(SchedulerConfig())
    old = scheduled(sizes=(1, 4, 8), generation=1, variants=(None, 1), max_batch_size=6)
    new = scheduled(sizes=(1, 4, 8), generation=2, variants=(None, 1))
    queue = ModelQueue()
    for _ in range(300):
        action = rng.random()
        if action < 0.55 or not queue:
            request = pending(
                rng.choice((old, new)),
                rows=rng.randint(1, 5),
                variant=rng.choice((None, 1)),
                priority=rng.randint(1, 3),
            )
            queue.push(request)
        elif action < 0.75:
            queue.remove(rng.choice(list(queue)))
        else:
            taken, _ = state.plan_locked(queue, queue[0])
            queue.remove_all(taken)
        if queue:
            memo = state.plan_locked(queue, queue[0])
            again = state.plan_locked(queue, queue[0])  # from the memo
            assert again == memo
            assert again[0] is not memo[0]  # callers get their own list
            assert again == _fresh(state, queue)


def test_any_change_drops_the_memo() -> None:
    state = SchedulerState(SchedulerConfig())
    state.costs.record("m", 1, 1e-3)  # pad-up weighs costs: a plan now follows them too
    model = scheduled(sizes=(1, 4))
    queue = ModelQueue()
    first = pending(model)
    queue.push(first)
    assert state.plan_locked(queue, first) == ([first], 1)
    assert queue.plan_memo is not None
    more = [pending(model) for _ in range(3)]
    for request in more:
        queue.push(request)
    assert queue.plan_memo is None
    assert state.plan_locked(queue, first) == ([first, *more], 4)
    queue.remove(more[-1])
    assert state.plan_locked(queue, first) == ([first], 1)
    queue.remove_all([first])
    assert queue.plan_memo is None  # nothing kept alive by an emptied queue


def test_pad_up_plans_are_not_reused_once_the_costs_change() -> None:
    """They weigh learned costs, which change without the queue changing."""
    state = SchedulerState(SchedulerConfig(pad_up_when_cheaper=True))
    model = scheduled(sizes=(1, 4))
    queue = ModelQueue()
    request = pending(model)
    queue.push(request)
    queue.push(pending(model))
    assert state.plan_locked(queue, request) == ([request], 1)  # no costs yet: no pad-up
    for size, seconds in ((1, 0.01), (4, 0.011)):
        state.costs.record(model.name, size, seconds)
    taken, batch = state.plan_locked(queue, request)  # the same queue, new costs
    assert (len(taken), batch) == (2, 4)  # padded up: 2 rows for ~the cost of 1


@pytest.mark.parametrize("seed", range(10))
def test_with_pad_up_a_reused_plan_matches_a_fresh_one_as_costs_change(seed: int) -> None:
    rng = random.Random(seed)
    state = SchedulerState(SchedulerConfig(pad_up_when_cheaper=True))
    model = scheduled(sizes=(1, 4, 8))
    for size in (1, 4, 8):
        state.costs.record(model.name, size, rng.uniform(1e-4, 1e-3))
    queue = ModelQueue()
    for _ in range(200):
        action = rng.random()
        if action < 0.5 or not queue:
            queue.push(pending(model, rows=rng.randint(1, 3)))
        elif action < 0.8:
            # Another dispatch of the model taught a new cost: the plan may pad differently.
            state.costs.record(model.name, rng.choice((1, 4, 8)), rng.uniform(1e-5, 2e-3))
        else:
            taken, _ = state.plan_locked(queue, queue[0])
            queue.remove_all(taken)
        if queue:
            memo = state.plan_locked(queue, queue[0])
            assert state.plan_locked(queue, queue[0]) == memo
            assert memo == _fresh(state, queue)
