"""Prefetch: the pure decision (``runtime._prefetch``) and the weight cache acting on it.

The cache runs on the MockBackend claiming asynchronous transfers (a GPU's); its copies stay
synchronous, so what is checked is what gets evicted, loaded and waited for, never timing.
"""

from __future__ import annotations

import pytest

from packages.worker.tests._fake_source import SIZE, FakeSource
from reactantserver.worker.runtime._prefetch import PrefetchPlan, Resident, plan_prefetch
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.runtime.weight_cache import WeightCache
from reactantserver.worker.testing import MockBackend, MockBuffer


def _idle(name: str, nbytes: int = 100) -> Resident:
    return Resident(name, nbytes, busy=False)


def _busy(name: str, nbytes: int = 100) -> Resident:
    return Resident(name, nbytes, busy=True)


@pytest.mark.parametrize(
    ("need", "budget", "resident", "keep", "expected"),
    [
        # Room already: nothing to evict.
        (100, 300, [_idle("a"), _idle("b")], (), PrefetchPlan()),
        # Idle victims, least recently used first, only as many as needed.
        (100, 200, [_idle("a"), _idle("b")], (), PrefetchPlan(("a",))),
        (200, 200, [_idle("a"), _idle("b")], (), PrefetchPlan(("a", "b"))),
        # The running model and busy (queued) models are never victims.
        (100, 200, [_idle("run"), _idle("b")], ("run",), PrefetchPlan(("b",))),
        (100, 200, [_busy("a"), _idle("b")], (), PrefetchPlan(("b",))),
        (100, 200, [_busy("a"), _idle("run")], ("run",), None),
        (100, 100, [_busy("a")], (), None),
        # Larger than the budget, or nothing to load: no prefetch.
        (300, 200, [], (), None),
        (0, 200, [], (), None),
        # An empty budget (every dispatch reloads) never prefetches.
        (100, 0, [], (), None),
    ],
)
def test_plan(
    need: int,
    budget: int,
    resident: list[Resident],
    keep: tuple[str, ...],
    expected: PrefetchPlan | None,
) -> None:
    assert plan_prefetch(need=need, budget=budget, resident=resident, keep=keep) == expected


def _cache(
    names: str = "ABC",
    *,
    budget: int = 2 * SIZE,
    busy: str = "",
    async_transfers: bool = True,
    enabled: bool = True,
    explicit: bool = False,
) -> tuple[MockBackend, WeightCache]:
    backend = MockBackend(async_transfers=async_transfers)
    cache = WeightCache(
        backend, budget=budget, busy=lambda name: name in busy, enabled=enabled, explicit=explicit
    )
    for i, name in enumerate(names):
        cache.add_model(name, FakeSource(i + 1), Residency.PINNED_SYSTEM)
    return backend, cache


def test_prefetch_starts_an_async_load_that_acquire_waits_for() -> None:
    backend, cache = _cache()
    cache.acquire("A")
    assert cache.prefetch("B", keep="A")
    assert cache.is_resident("B")
    assert backend.async_transfers_started == 1
    assert (cache.loads, cache.prefetches, cache.prefetch_hits) == (2, 1, 0)
    (buf,) = cache.acquire("B")
    assert isinstance(buf, MockBuffer)
    assert not buf.pending
    assert backend.waits == 1
    assert (cache.loads, cache.prefetch_hits) == (2, 1)  # no second load
    cache.acquire("B")
    assert backend.waits == 1  # waited once


def test_prefetch_evicts_idle_models_only() -> None:
    _, cache = _cache("ABCD", budget=2 * SIZE, busy="B")
    cache.acquire("B")  # busy (queued)
    cache.acquire("A")  # running
    assert not cache.prefetch("C", keep="A")  # only busy B or running A could make room
    assert cache.lru_order() == ["B", "A"]
    assert cache.evictions == 0
    _, cache2 = _cache("ABCD", budget=2 * SIZE)
    cache2.acquire("D")  # idle, least recently used
    cache2.acquire("A")
    assert cache2.prefetch("C", keep="A")
    assert cache2.lru_order() == ["A", "C"]
    assert cache2.model_evictions("D") == 1


@pytest.mark.parametrize("case", ["resident", "unknown", "running", "pinned", "oversize"])
def test_prefetch_declines(case: str) -> None:
    backend, cache = _cache(budget=SIZE)
    cache.acquire("A")
    if case == "resident":
        assert not cache.prefetch("A")
    elif case == "unknown":
        assert not cache.prefetch("nope", keep="A")
    elif case == "running":
        cache.evict_unpinned()
        assert not cache.prefetch("A", keep="A")
    elif case == "pinned":
        cache.add_model("P", FakeSource(9), Residency.PINNED_DEVICE)
        cache.evict_unpinned()
        assert not cache.prefetch("P")
    else:
        cache.add_model("big", FakeSource(9, size=2 * SIZE), Residency.PINNED_SYSTEM)
        assert not cache.prefetch("big", keep="A")
    assert cache.prefetches == 0
    assert backend.async_transfers_started == 0


@pytest.mark.parametrize(
    ("kwargs", "can"),
    [
        ({}, True),
        ({"async_transfers": False}, False),  # the CPU backend: a copy would not overlap
        ({"enabled": False}, False),  # no on-demand cache: everything is resident anyway
        ({"explicit": True}, False),  # explicit mode: only residency control loads weights
    ],
)
def test_can_prefetch(kwargs: dict[str, bool], can: bool) -> None:
    _, cache = _cache("", **kwargs)  # type: ignore[arg-type]
    assert cache.can_prefetch is can
    cache.add_model("X", FakeSource(1), Residency.PINNED_SYSTEM)
    if not kwargs.get("enabled", True):
        cache.evict_unpinned()
    assert cache.prefetch("X") is (can and not kwargs.get("explicit", False))


class _FailingWait(MockBackend):
    def wait(self, buffers: object) -> None:
        raise RuntimeError("INTERNAL: copy failed")


def test_a_failed_prefetch_is_loaded_again(caplog: pytest.LogCaptureFixture) -> None:
    backend = _FailingWait(async_transfers=True)
    cache = WeightCache(backend, budget=2 * SIZE)
    cache.add_model("A", FakeSource(1), Residency.PINNED_SYSTEM)
    assert cache.prefetch("A")
    (buf,) = cache.acquire("A")
    assert "prefetch of the weights of 'A' failed" in caplog.text
    assert int(backend.to_host(buf)[0]) == 1
    assert (cache.loads, cache.prefetch_hits) == (2, 0)
    assert backend.live_buffers == 1  # the failed copy is freed, the reload stays


def test_eviction_and_compaction_of_a_pending_prefetch() -> None:
    backend, cache = _cache(budget=SIZE)
    assert cache.prefetch("A")
    assert cache.evict_unpinned() == 1
    assert backend.live_buffers == 0
    assert cache.prefetch("B")
    cache.compact()
    assert not cache.is_resident("B")
    cache.acquire("B")  # loaded normally, nothing left pending
    assert backend.waits == 0
    stats = cache.stats()
    assert (stats.prefetches, stats.prefetch_hits) == (2, 0)
