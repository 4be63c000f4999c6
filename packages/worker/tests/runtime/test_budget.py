"""The weight budget formula, row by row."""

from __future__ import annotations

import attrs
import pytest

from reactantserver.worker.runtime.backend import MemoryStats
from reactantserver.worker.runtime.budget import (
    BudgetPolicy,
    arena_bytes,
    cache_enabled,
    solve_weight_budget,
)

# A, f, w, S, P -> scratch_ceiling, weight_pool, on_demand_budget, over-commit.
SPEC_TABLE = [
    (1000, 1.0, 0.1, 0, 0, 900, 900, 900, False),
    (1000, 0.5, 0.1, 0, 0, 900, 500, 500, False),
    (1000, 1.0, 0.1, 300, 0, 900, 600, 600, False),
    (1000, 1.0, 0.1, 300, 200, 900, 600, 400, False),
    (1000, 1.0, 0.1, 300, 700, 900, 600, 0, True),
    (1000, 1.0, 0.1, 950, 0, 900, 0, 0, False),
]


@pytest.mark.parametrize("row", SPEC_TABLE)
def test_spec_table(row: tuple[int, float, float, int, int, int, int, int, bool]) -> None:
    arena, f, w, s, p, ceiling, pool, budget, over = row
    result = solve_weight_budget(arena=arena, fraction=f, wiggle=w, max_scratch=s, pinned_bytes=p)
    assert result.scratch_ceiling == ceiling
    assert result.weight_pool == pool
    assert result.on_demand_budget == budget
    assert result.pinned_over_commit is over
    assert result.enabled
    assert result.auto_sized
    assert (result.arena, result.fraction, result.wiggle) == (arena, f, w)
    assert (result.max_scratch, result.pinned_bytes) == (s, p)
    assert any("pinned_over_commit" in line for line in result.warnings) is over


@pytest.mark.parametrize("f", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("w", [0.0, 0.5, 0.9])
@pytest.mark.parametrize(("s", "p"), [(0, 0), (300, 200), (950, 700)])
def test_spec_table_zero_arena_row(f: float, w: float, s: int, p: int) -> None:
    result = solve_weight_budget(arena=0, fraction=f, wiggle=w, max_scratch=s, pinned_bytes=p)
    assert (result.scratch_ceiling, result.weight_pool, result.on_demand_budget) == (0, 0, 0)
    assert result.pinned_over_commit is False
    assert result.enabled is False
    assert result.warnings == ()


def test_max_bytes_replaces_the_formula() -> None:
    result = solve_weight_budget(
        arena=0, fraction=1.0, wiggle=0.1, max_scratch=0, pinned_bytes=5000, max_bytes=1234
    )
    assert result.enabled
    assert not result.auto_sized
    assert result.on_demand_budget == 1234
    assert result.pinned_over_commit is False
    # On a GPU too: the override wins over whatever the formula would give.
    gpu = solve_weight_budget(
        arena=1000, fraction=1.0, wiggle=0.1, max_scratch=300, pinned_bytes=700, max_bytes=42
    )
    assert gpu.on_demand_budget == 42
    assert gpu.weight_pool == 600  # the formula terms are still reported
    assert not gpu.pinned_over_commit
    assert "weight_cache_max_bytes" in gpu.summary()


@pytest.mark.parametrize(
    ("arena", "fraction", "max_bytes", "enabled"),
    [
        (1000, 1.0, 0, True),
        (1000, 0.0, 0, False),
        (0, 1.0, 0, False),
        (0, 0.0, 0, False),
        (0, 0.0, 1, True),
        (0, 1.0, 1, True),
        (1000, 0.0, 1, True),
    ],
)
def test_enablement_rule(arena: int, fraction: float, max_bytes: int, enabled: bool) -> None:
    assert cache_enabled(arena=arena, fraction=fraction, max_bytes=max_bytes) is enabled
    result = solve_weight_budget(
        arena=arena,
        fraction=fraction,
        wiggle=0.1,
        max_scratch=0,
        pinned_bytes=0,
        max_bytes=max_bytes,
    )
    assert result.enabled is enabled
    assert BudgetPolicy(arena, fraction, 0.1, max_bytes=max_bytes).enabled is enabled


def test_zero_budget_warning_only_with_on_demand_models() -> None:
    policy = BudgetPolicy(arena=1000, fraction=1.0, wiggle=0.1, max_scratch=950)
    assert policy.solve(0, on_demand_models=0).warnings == ()
    loud = policy.solve(0, on_demand_models=2)
    assert loud.on_demand_budget == 0
    assert len(loud.warnings) == 1
    assert "every dispatch reloads" in loud.warnings[0]
    both = solve_weight_budget(
        arena=1000, fraction=1.0, wiggle=0.1, max_scratch=300, pinned_bytes=700, on_demand_models=1
    )
    assert len(both.warnings) == 2


def test_disabled_cache_has_no_warnings() -> None:
    result = solve_weight_budget(
        arena=1000, fraction=0.0, wiggle=0.1, max_scratch=0, pinned_bytes=50, on_demand_models=3
    )
    assert not result.enabled
    assert result.on_demand_budget == 0
    assert not result.pinned_over_commit
    assert result.warnings == ()
    assert "disabled" in result.summary()


def test_floors_use_the_written_decimal() -> None:
    # 0.29 * 100 is 28.999... in binary floating point; the operator meant 29.
    result = solve_weight_budget(
        arena=100, fraction=0.29, wiggle=0.0, max_scratch=0, pinned_bytes=0
    )
    assert result.weight_pool == 29
    # floor((1 - w) * A), not A - floor(w * A).
    odd = solve_weight_budget(arena=1001, fraction=1.0, wiggle=0.1, max_scratch=0, pinned_bytes=0)
    assert odd.scratch_ceiling == 900


def test_summary_lists_every_term() -> None:
    line = solve_weight_budget(
        arena=1000, fraction=1.0, wiggle=0.1, max_scratch=300, pinned_bytes=200
    ).summary()
    for term in (
        "on_demand_budget=400",
        "weight_pool=600",
        "scratch_ceiling=900",
        "arena=1000",
        "max_scratch=300",
        "pinned=200",
        "pinned_over_commit=False",
    ):
        assert term in line


def test_policy_solves_and_is_provisional_before_the_probe() -> None:
    policy = BudgetPolicy(arena=1000, fraction=0.5, wiggle=0.1)
    assert policy.auto_sized
    assert policy.provisional_budget() == 500
    assert policy.solve(100).on_demand_budget == 400
    measured = attrs.evolve(policy, max_scratch=800)
    assert measured.solve(0).weight_pool == 100
    assert BudgetPolicy(arena=0, fraction=1.0, wiggle=0.1).provisional_budget() == 0
    given = BudgetPolicy(arena=0, fraction=1.0, wiggle=0.1, max_bytes=77)
    assert not given.auto_sized
    assert given.provisional_budget() == 77


@pytest.mark.parametrize(
    ("policy", "pinned", "match"),
    [
        (BudgetPolicy(arena=-1, fraction=1.0, wiggle=0.1), 0, "arena"),
        (BudgetPolicy(arena=1000, fraction=1.0, wiggle=0.1, max_scratch=-1), 0, "max_scratch"),
        (BudgetPolicy(arena=1000, fraction=1.0, wiggle=0.1), -1, "pinned_bytes"),
        (BudgetPolicy(arena=1000, fraction=1.0, wiggle=0.1, max_bytes=-1), 0, "max_bytes"),
        (BudgetPolicy(arena=1000, fraction=1.5, wiggle=0.1), 0, "fraction"),
        (BudgetPolicy(arena=1000, fraction=1.0, wiggle=1.0), 0, "wiggle"),
    ],
)
def test_rejects_nonsense(policy: BudgetPolicy, pinned: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        policy.solve(pinned)


def test_arena_from_memory_stats() -> None:
    assert arena_bytes(None) == 0
    assert arena_bytes(MemoryStats(bytes_in_use=5, bytes_limit=4096)) == 4096
