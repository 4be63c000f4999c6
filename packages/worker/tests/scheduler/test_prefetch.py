"""The scheduler names the next model's weights with each batch, and they load during it.

A :class:`MockBackend` that claims asynchronous transfers records the order of device work:
with A and B queued and room in the budget, B's weights are copied (``wait=False``) after A's
execution is queued and before the dispatch ends, and B's own dispatch loads nothing.
"""

from __future__ import annotations

import pytest

from packages.worker.tests._fake_source import SIZE, FakeSource
from reactantserver.core.config import SchedulerConfig, SchedulingDiscipline
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.runtime.weight_cache import WeightCache
from reactantserver.worker.scheduler import Scheduler

from ._builders import pending, queue_of, scheduled
from ._fake import Harness, row


def _harness(
    names: str = "ABC",
    *,
    budget: int = 2 * SIZE,
    async_transfers: bool = True,
    discipline: SchedulingDiscipline = SchedulingDiscipline.FIFO,
    prefetch_weights: bool = True,
) -> tuple[Harness, WeightCache]:
    h = Harness(SchedulerConfig(discipline=discipline, prefetch_weights=prefetch_weights))
    h.backend.async_transfers = async_transfers
    cache = WeightCache(h.backend, budget=budget)
    h.scheduler = Scheduler(h.backend, cache, h.config, clock=h.clock)
    for i, name in enumerate(names):
        model = h.build(name, sizes=(1, 2))
        model.weights = name
        cache.add_model(name, FakeSource(i + 1), Residency.PINNED_SYSTEM)
        h.scheduler.add_model(model)
    return h, cache


def _kinds(h: Harness) -> list[str]:
    return [
        f"{kind}:{detail.split('/')[0]}" if kind == "execute" else f"{kind}:{detail}"
        for kind, detail in h.backend.events
    ]


def test_next_models_weights_load_while_the_current_one_executes() -> None:
    h, cache = _harness()
    a = h.submit("A", row(1))
    b = h.submit("B", row(2))
    assert h.scheduler.step()  # A: its load, its input, its run, then B's weights
    assert _kinds(h) == [
        f"transfer:{SIZE}",  # A's weights (acquire)
        "transfer:8",  # A's input row
        "execute:A",
        f"transfer:{SIZE} async",  # B's weights, queued while A runs
    ]
    assert (cache.prefetches, cache.loads) == (1, 2)
    assert h.scheduler.step()  # B: nothing to load
    assert [k for k in _kinds(h)[4:] if k.startswith("transfer:1000")] == []
    assert (cache.loads, cache.prefetch_hits) == (2, 1)
    assert a.value().tolist() == [[10.0, 100.0]]
    assert b.value().tolist() == [[20.0, 200.0]]


def test_nothing_queued_next_means_no_prefetch() -> None:
    h, cache = _harness()
    h.submit("A", row(1))
    h.drain()
    assert cache.prefetches == 0
    assert h.backend.async_transfers_started == 0


def test_prefetch_never_evicts_the_running_or_a_queued_model() -> None:
    # Budget for two: A runs, B is queued and resident, C is queued next after B.
    h, cache = _harness("ABC", budget=2 * SIZE)
    cache.acquire("B")
    h.submit("A", row(1))
    h.submit("B", row(2))
    h.submit("C", row(3))
    assert h.scheduler.step()  # A runs; B (next) is resident: nothing to prefetch
    assert cache.lru_order() == ["B", "A"]
    assert h.scheduler.step()  # B runs; next is C: only A (idle now) may make room
    assert cache.lru_order() == ["B", "C"]
    assert cache.model_evictions("A") == 1
    assert cache.model_evictions("B") == 0
    assert cache.prefetches == 1
    h.drain()
    assert (cache.prefetch_hits, cache.loads) == (1, 3)


@pytest.mark.parametrize(
    ("prefetch_weights", "async_transfers"),
    [(False, True), (True, False)],
    ids=["switched-off", "synchronous-backend"],
)
def test_no_prefetch_when_off_or_pointless(prefetch_weights: bool, async_transfers: bool) -> None:
    h, cache = _harness(async_transfers=async_transfers, prefetch_weights=prefetch_weights)
    h.submit("A", row(1))
    h.submit("B", row(2))
    h.drain()
    assert cache.prefetches == 0
    assert cache.loads == 2
    assert h.ran() == [("A", 1), ("B", 1)]


def test_next_weights_follow_the_discipline() -> None:
    h, _ = _harness("ABC", discipline=SchedulingDiscipline.EDF)
    state = h.scheduler._s
    a, b, c = (state.models[n] for n in "ABC")
    with state.cond:
        state.queues["A"] = queue_of(pending(a, enqueue_ns=1))
        state.queues["B"] = queue_of(pending(b, enqueue_ns=2, deadline_ns=50))
        state.queues["C"] = queue_of(pending(c, enqueue_ns=3, deadline_ns=40))
        assert state.next_weights_locked("A") == "C"  # earliest deadline
        state.config = SchedulerConfig(discipline=SchedulingDiscipline.FIFO)
        assert state.next_weights_locked("A") == "B"  # oldest head
        committed = pending(a, committed=True, enqueue_ns=9)
        state.queues["A"].push(committed)
        state.committed.append(committed)
        assert state.next_weights_locked("B") == "A"  # a committed sub-call goes first
        assert state.next_weights_locked("A") == "B"  # but never the running model
        state.queues["B"] = queue_of()
        state.queues["C"] = queue_of()
        assert state.next_weights_locked("A") is None


def test_a_model_without_weights_is_never_named() -> None:
    h, _ = _harness("A")
    plain = scheduled("plain")
    state = h.scheduler._s
    with state.cond:
        state.queues["plain"] = queue_of(pending(plain))
        assert state.next_weights_locked("A") is None
