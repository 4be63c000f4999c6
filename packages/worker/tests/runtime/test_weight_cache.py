"""The weight cache's rules on the MockBackend: residency transitions, budget, OOM retry."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from packages.worker.tests._fake_source import SIZE, FakeSource
from reactantserver.core.errors import FailedPreconditionError, ModelUnavailableError
from reactantserver.worker.runtime.backend import CompileSpec
from reactantserver.worker.runtime.budget import BudgetPolicy
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.runtime.weight_cache import (
    WeightCache,
    WeightSource,
    is_device_oom,
    run_with_oom_retry,
)
from reactantserver.worker.testing import MockBackend, MockOutOfMemoryError


def _setup(
    names: str = "ABC",
    *,
    residency: Residency = Residency.PINNED_SYSTEM,
    budget: int = SIZE,
    bytes_limit: int | None = None,
    **kwargs: Any,
) -> tuple[MockBackend, WeightCache, dict[str, FakeSource]]:
    backend = MockBackend(bytes_limit=bytes_limit)
    cache = WeightCache(backend, budget=budget, **kwargs)
    sources = {name: FakeSource(i + 1) for i, name in enumerate(names)}
    for name, source in sources.items():
        cache.add_model(name, source, residency)
    return backend, cache, sources


def test_source_protocol() -> None:
    source: WeightSource = FakeSource(1)
    assert source.nbytes == SIZE


def test_acquire_returns_the_model_weights() -> None:
    backend, cache, _ = _setup()
    (buf,) = cache.acquire("B")
    assert int(backend.to_host(buf)[0]) == 2
    assert cache.acquire("B")[0] is buf  # resident: no reload
    assert cache.loads == 1


def test_victims_are_freed_before_the_transfer() -> None:
    # The arena holds exactly one model: transferring before freeing would run out of memory.
    backend, cache, _ = _setup(bytes_limit=SIZE)
    for name in "ABCA":
        cache.acquire(name)
        assert backend.bytes_in_use == SIZE
    assert backend.frees == 3
    assert (cache.loads, cache.evictions) == (4, 3)


def test_failed_loads_leave_no_trace() -> None:
    backend, cache, sources = _setup(residency=Residency.UNPINNED, budget=3 * SIZE)
    cache.acquire("A")
    sources["B"].fail_reads = True
    with pytest.raises(OSError, match="vanished"):
        cache.acquire("B")
    assert not cache.is_resident("B")
    assert cache.lru_order() == ["A"]
    assert cache.loads == 1
    # A transfer failing half-way frees what it had already transferred.
    backend.bytes_limit = backend.bytes_in_use + SIZE + 10
    sources["C"].size = 2 * SIZE
    sources["C"].parts = 2
    transfers = backend.transfers
    with pytest.raises(MockOutOfMemoryError):
        cache.acquire("C")
    assert backend.transfers == transfers + 1  # the first part made it to the device
    assert backend.live_buffers == 1
    assert not cache.is_resident("C")


def test_unknown_and_duplicate_models() -> None:
    _, cache, sources = _setup("A")
    with pytest.raises(KeyError, match="'Z'"):
        cache.acquire("Z")
    with pytest.raises(ValueError, match="already"):
        cache.add_model("A", sources["A"], Residency.UNPINNED)
    assert list(cache) == ["A"]


def test_floors_at_admission() -> None:
    _, cache, _ = _setup("U", residency=Residency.UNPINNED)
    cache.add_model("S", FakeSource(7), Residency.PINNED_SYSTEM)
    # A source handed over with a floor the residency does not want gets it dropped.
    stray = FakeSource(8)
    stray.keep_host()
    cache.add_model("D", stray, Residency.PINNED_DEVICE)
    assert [cache.host_resident(n) for n in "USD"] == [False, True, False]
    assert [cache.is_resident(n) for n in "USD"] == [False, False, True]
    assert stray.reads == 1  # the pinned load used the floor, then dropped it
    assert cache.residency("D") is Residency.PINNED_DEVICE


def test_set_residency_transitions_self_managed() -> None:
    backend, cache, sources = _setup("AB", residency=Residency.UNPINNED, budget=2 * SIZE)
    a = sources["A"]
    assert cache.set_residency("A", Residency.PINNED_SYSTEM) is Residency.UNPINNED
    assert (a.host_resident, a.reads) == (True, 1)
    assert cache.set_residency("A", Residency.PINNED_SYSTEM) is Residency.PINNED_SYSTEM  # no-op
    # Pinning a non-resident model loads it from the floor, outside the budget.
    cache.set_residency("A", Residency.PINNED_DEVICE)
    assert cache.is_resident("A")
    assert (a.host_resident, a.reads) == (False, 1)
    assert (cache.pinned_bytes, cache.resident_bytes) == (SIZE, 0)
    # Leaving PINNED_DEVICE self-managed: stays resident, becomes the most recent evictable.
    cache.acquire("B")
    (a_buf,) = cache.acquire("A")
    cache.set_residency("A", Residency.UNPINNED)
    assert cache.lru_order() == ["B", "A"]
    assert not a_buf.is_deleted()
    assert (cache.pinned_bytes, cache.resident_bytes) == (0, 2 * SIZE)
    # Pinning a resident model keeps its buffers (no reload) and takes it out of the LRU.
    loads = cache.loads
    cache.set_residency("B", Residency.PINNED_DEVICE)
    assert cache.loads == loads
    assert cache.lru_order() == ["A"]
    assert backend.live_buffers == 2


def test_set_residency_failure_restores_the_floor() -> None:
    _, cache, sources = _setup("A", residency=Residency.UNPINNED)
    sources["A"].fail_reads = True
    with pytest.raises(OSError, match="vanished"):
        cache.set_residency("A", Residency.PINNED_DEVICE)
    assert cache.residency("A") is Residency.UNPINNED
    assert cache.pinned_bytes == 0


def test_residency_control_is_inert_without_the_cache() -> None:
    backend, cache, _ = _setup(residency=Residency.UNPINNED, budget=0, enabled=False)
    # Every model went to the device at admission and stays there.
    assert [cache.is_resident(n) for n in "ABC"] == [True, True, True]
    assert backend.live_buffers == 3
    for name in "CBA":
        cache.acquire(name)
    assert (cache.loads, cache.evictions) == (3, 0)
    with pytest.raises(FailedPreconditionError, match="inert"):
        cache.set_residency("A", Residency.PINNED_DEVICE)
    assert cache.compact(reload=["A"]) == 0
    assert cache.compactions == 0
    # If memory is reclaimed after an OOM, the next acquire simply reloads.
    assert cache.evict_unpinned(keep="A") == 2
    cache.acquire("B")
    assert cache.loads == 4


def test_budget_policy_is_resolved_when_pinned_bytes_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Arena of three models, no wiggle, no scratch: weight pool = 3 models.
    backend, cache, _ = _setup("ABC", bytes_limit=3 * SIZE)
    cache.add_model("D", FakeSource(9), Residency.UNPINNED)
    solved = cache.set_budget_policy(BudgetPolicy(arena=3 * SIZE, fraction=1.0, wiggle=0.0))
    assert solved.on_demand_budget == cache.budget == 3 * SIZE
    for name in "ABC":
        cache.acquire(name)
    assert backend.bytes_in_use == 3 * SIZE
    # Pinning D raises P: the budget shrinks to 2 models and A is evicted before D transfers
    # (the arena is full, so the other order would run out of memory).
    cache.set_residency("D", Residency.PINNED_DEVICE)
    assert cache.budget == 2 * SIZE
    assert cache.lru_order() == ["B", "C"]
    assert cache.stats().weight_pool == 3 * SIZE
    # Unpinning gives the budget back; D is now evictable and most recent.
    cache.set_residency("D", Residency.PINNED_SYSTEM)
    assert cache.budget == 3 * SIZE
    assert cache.lru_order() == ["B", "C", "D"]
    # Pinning everything leaves a zero budget: warned, and logged with every term.
    with caplog.at_level(logging.INFO):
        for name in "BCD":
            cache.set_residency(name, Residency.PINNED_DEVICE)
    assert cache.budget == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("every dispatch reloads" in m for m in messages)
    assert any("on_demand_budget=0" in m for m in messages)
    assert any("residency of 'D': PINNED_SYSTEM -> PINNED_DEVICE" in m for m in messages)
    cache.remove_model("D")
    assert cache.budget == SIZE
    assert cache.budget_solution is not None
    assert cache.budget_solution.pinned_bytes == 2 * SIZE


def test_set_budget_shrinks_to_fit() -> None:
    _, cache, _ = _setup(budget=3 * SIZE)
    for name in "ABC":
        cache.acquire(name)
    cache.set_budget(SIZE)
    assert cache.lru_order() == ["C"]
    assert cache.evictions == 2
    assert cache.budget_solution is None
    with pytest.raises(ValueError, match="budget"):
        cache.set_budget(-1)
    with pytest.raises(ValueError, match="budget"):
        WeightCache(MockBackend(), budget=-1)


def test_rename_keeps_memory_and_lru_position() -> None:
    _, cache, _ = _setup(budget=3 * SIZE)
    for name in "ABC":
        cache.acquire(name)
    (buf,) = cache.acquire("A")
    cache.rename_model("B", "B2")
    assert cache.lru_order() == ["B2", "C", "A"]
    assert "B" not in cache
    assert cache.is_resident("B2")
    assert cache.acquire("A")[0] is buf
    with pytest.raises(ValueError, match="already"):
        cache.rename_model("A", "C")


def test_compaction_counts_loads_between_compactions() -> None:
    _, cache, _ = _setup(budget=3 * SIZE)
    cache.add_model("P", FakeSource(9), Residency.PINNED_DEVICE)
    for name in "ABC":
        cache.acquire(name)
    assert cache.loads_since_compaction == 3  # the pinned admission is not on-demand
    assert cache.compact() == 0
    assert cache.lru_order() == []
    assert cache.is_resident("P")
    assert cache.compact(reload=["A", "A", "P"]) == 1
    assert cache.loads_since_compaction == 0
    assert cache.stats().compactions == 2


def test_compaction_reload_failures_do_not_stop_it(caplog: pytest.LogCaptureFixture) -> None:
    _, cache, sources = _setup(residency=Residency.UNPINNED, budget=3 * SIZE)
    for name in "ABC":
        cache.acquire(name)
    sources["A"].fail_reads = True
    with caplog.at_level(logging.WARNING):
        assert cache.compact(reload=["A", "B"]) == 1
    assert "cannot reload 'A'" in caplog.text
    assert cache.lru_order() == ["B"]


def test_stats_snapshot() -> None:
    _, cache, _ = _setup(budget=2 * SIZE)
    cache.acquire("A")
    stats = cache.stats()
    assert (stats.loads, stats.load_bytes, stats.resident_bytes, stats.budget) == (
        1,
        SIZE,
        SIZE,
        2 * SIZE,
    )
    assert (stats.max_scratch, stats.weight_pool, stats.pinned_bytes) == (0, 0, 0)
    assert "budget=2000" in cache.memory_report()


# -- OOM retry ------------------------------------------------------------------------------


def _oom_setup() -> tuple[MockBackend, WeightCache, Any]:
    # Arena: three models' weights. Running A needs 2 models' worth of scratch, so it only
    # fits once the other on-demand model is evicted.
    backend = MockBackend(bytes_limit=3 * SIZE)
    backend.register(b"sum", lambda w: np.array([w.sum()]), scratch_bytes=2 * SIZE - 16)
    exe = backend.compile(b"sum", CompileSpec())
    cache = WeightCache(backend, budget=2 * SIZE)
    for name, value in (("A", 1), ("B", 2)):
        cache.add_model(name, FakeSource(value), Residency.PINNED_SYSTEM)
    cache.acquire("B")
    return backend, cache, exe


def test_oom_retry_evicts_the_others_and_retries_once(caplog: pytest.LogCaptureFixture) -> None:
    backend, cache, exe = _oom_setup()
    weights = cache.acquire("A")
    with caplog.at_level(logging.WARNING):
        (out,) = run_with_oom_retry(cache, "A", lambda: backend.execute(exe, weights))
    assert int(backend.to_host(out)[0]) == SIZE
    assert cache.lru_order() == ["A"]
    assert cache.evictions == 1
    assert "retrying once" in caplog.text


def test_oom_retry_gives_up_on_the_second_failure() -> None:
    backend, cache, exe = _oom_setup()
    weights = cache.acquire("A")
    backend.fail_next_execution(times=2)
    with pytest.raises(MockOutOfMemoryError):
        run_with_oom_retry(cache, "A", lambda: backend.execute(exe, weights))
    assert cache.lru_order() == ["A"]
    assert backend.executions == 0


def test_oom_retry_needs_something_to_evict_and_an_oom() -> None:
    backend, cache, exe = _oom_setup()
    weights = cache.acquire("A")
    backend.fail_next_execution(ValueError("bad input"))
    with pytest.raises(ValueError, match="bad input"):
        run_with_oom_retry(cache, "A", lambda: backend.execute(exe, weights))
    assert cache.lru_order() == ["B", "A"]  # nothing evicted for a non-OOM error
    cache.evict_unpinned(keep="A")
    backend.fail_next_execution()
    with pytest.raises(MockOutOfMemoryError):
        run_with_oom_retry(cache, "A", lambda: backend.execute(exe, weights))


@pytest.mark.parametrize(
    ("message", "oom"),
    [
        ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2GiB", True),
        ("CUDA_ERROR_OUT_OF_MEMORY: out of memory", True),
        ("INVALID_ARGUMENT: shape mismatch", False),
    ],
)
def test_is_device_oom(message: str, oom: bool) -> None:
    assert is_device_oom(RuntimeError(message)) is oom


def test_explicit_mode_pinned_admission_only() -> None:
    backend, cache, _ = _setup("AB", explicit=True, residency=Residency.PINNED_SYSTEM)
    assert backend.live_buffers == 0
    with pytest.raises(ModelUnavailableError, match="'A' is not resident"):
        cache.acquire("A")
    cache.set_residency("A", Residency.PINNED_DEVICE)
    cache.set_residency("A", Residency.UNPINNED)
    assert backend.live_buffers == 0
    assert not cache.host_resident("A")


def test_loads_are_counted_per_model() -> None:
    cache = WeightCache(MockBackend(), budget=1 << 20)
    cache.add_model("a", FakeSource(64), Residency.UNPINNED)
    assert cache.model_loads("a") == 0
    cache.acquire("a")
    cache.acquire("a")  # already resident: no second load
    assert cache.model_loads("a") == 1
    cache.evict_unpinned()
    cache.acquire("a")
    assert cache.model_loads("a") == 2
    assert cache.loads == 2


def test_evictions_are_counted_per_model() -> None:
    _, cache, _ = _setup(budget=SIZE)
    for name in "ABA":
        cache.acquire(name)
    assert [cache.model_evictions(n) for n in "ABC"] == [1, 1, 0]
    cache.evict_unpinned()
    assert [cache.model_evictions(n) for n in "ABC"] == [2, 1, 0]
    cache.remove_model("A")  # removal is no eviction
    assert cache.evictions == 3
    with pytest.raises(KeyError):
        cache.model_evictions("A")
