"""The on-demand weight budget: how many device bytes the weight cache may keep resident.

Pure arithmetic over the device arena and the configured shares, so it is
testable without a device::

    policy = BudgetPolicy(arena=stats.bytes_limit, fraction=0.9, wiggle=0.1)
    budget = policy.solve(pinned_bytes=cache.pinned_bytes, on_demand_models=3)
    cache.set_budget(budget.on_demand_budget)

The arena holds, at the worst instant, the device-pinned weights ``P``, the on-demand weights,
one execution's scratch ``S`` and a wiggle share of slack::

    scratch_ceiling    = floor((1 - w) * A)
    weight_pool        = max(0, min(floor(f * A), scratch_ceiling - S))
    on_demand_budget   = clamp(weight_pool - P, 0, weight_pool)
    pinned_over_commit = P > weight_pool

``weight_cache_max_bytes > 0`` replaces the formula (no probe needed).
"""

from __future__ import annotations

import math
from fractions import Fraction

import attrs

from reactantserver.worker.runtime.backend import MemoryStats

__all__ = ["BudgetPolicy", "WeightBudget", "arena_bytes", "cache_enabled", "solve_weight_budget"]


def _exact(share: float) -> Fraction:
    # The decimal the operator wrote: 0.29 * 100 in binary floating point is 28.999..., and a
    # budget one byte short of the documented value is a surprise.
    return Fraction(repr(share))


def arena_bytes(stats: MemoryStats | None) -> int:
    """The arena ``A``: the allocator's ``bytes_limit``, 0 where there are no statistics (CPU)."""
    return 0 if stats is None else max(0, stats.bytes_limit)


def cache_enabled(*, arena: int, fraction: float, max_bytes: int) -> bool:
    """Whether the on-demand cache is on: ``(f > 0 and A > 0) or weight_cache_max_bytes > 0``."""
    return (fraction > 0 and arena > 0) or max_bytes > 0


@attrs.frozen
class WeightBudget:
    """One solution of the weight budget, with every term (for the info line and the gauges)."""

    arena: int
    fraction: float
    wiggle: float
    max_scratch: int
    pinned_bytes: int
    max_bytes: int
    enabled: bool
    """Whether the on-demand cache is on at all (otherwise every weight stays on the device)."""
    auto_sized: bool
    """Solved from the formula (True) or given by ``weight_cache_max_bytes`` (False)."""
    scratch_ceiling: int
    weight_pool: int
    on_demand_budget: int
    pinned_over_commit: bool
    warnings: tuple[str, ...] = ()
    """Problems an operator should see, as sentences; the caller logs them."""

    def summary(self) -> str:
        """One log line with every term."""
        if not self.enabled:
            return f"weight cache disabled (arena={self.arena}, fraction={self.fraction})"
        source = "formula" if self.auto_sized else "weight_cache_max_bytes"
        return (
            f"weight budget ({source}): on_demand_budget={self.on_demand_budget} "
            f"weight_pool={self.weight_pool} scratch_ceiling={self.scratch_ceiling} "
            f"arena={self.arena} fraction={self.fraction} wiggle={self.wiggle} "
            f"max_scratch={self.max_scratch} pinned={self.pinned_bytes} "
            f"pinned_over_commit={self.pinned_over_commit}"
        )


def solve_weight_budget(
    *,
    arena: int,
    fraction: float,
    wiggle: float,
    max_scratch: int,
    pinned_bytes: int,
    max_bytes: int = 0,
    on_demand_models: int = 0,
) -> WeightBudget:
    """Solve the weight budget (docs/reference/scheduling.md, the device byte budget).

    ``on_demand_models`` (how many models are not device-pinned) only decides whether a zero
    budget deserves the "every dispatch reloads" warning. With ``max_bytes > 0`` the formula
    terms are still reported, but the budget is ``max_bytes`` and there is no over-commit.
    """
    counts = {
        "arena": arena,
        "max_scratch": max_scratch,
        "pinned_bytes": pinned_bytes,
        "max_bytes": max_bytes,
    }
    for name, value in counts.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    if not 0 <= wiggle < 1:
        raise ValueError(f"wiggle must be in [0, 1), got {wiggle}")

    enabled = cache_enabled(arena=arena, fraction=fraction, max_bytes=max_bytes)
    auto_sized = enabled and max_bytes == 0
    scratch_ceiling = math.floor((1 - _exact(wiggle)) * arena)
    weight_pool = max(0, min(math.floor(_exact(fraction) * arena), scratch_ceiling - max_scratch))
    warnings: list[str] = []
    if max_bytes > 0:
        on_demand_budget = max_bytes
        over_commit = False
    elif enabled:
        on_demand_budget = min(max(weight_pool - pinned_bytes, 0), weight_pool)
        over_commit = pinned_bytes > weight_pool
    else:
        # No cache: every weight goes to the device at admission; nothing to over-commit.
        on_demand_budget = 0
        over_commit = False
    if over_commit:
        warnings.append(
            f"device-pinned weights ({pinned_bytes} bytes) exceed the weight pool "
            f"({weight_pool} bytes): pinned_over_commit, the on-demand budget is 0"
        )
    if enabled and on_demand_budget == 0 and on_demand_models > 0:
        warnings.append(
            f"on-demand weight budget is 0 with {on_demand_models} on-demand model(s): "
            "every dispatch reloads"
        )
    return WeightBudget(
        arena=arena,
        fraction=fraction,
        wiggle=wiggle,
        max_scratch=max_scratch,
        pinned_bytes=pinned_bytes,
        max_bytes=max_bytes,
        enabled=enabled,
        auto_sized=auto_sized,
        scratch_ceiling=scratch_ceiling,
        weight_pool=weight_pool,
        on_demand_budget=on_demand_budget,
        pinned_over_commit=over_commit,
        warnings=tuple(warnings),
    )


@attrs.frozen
class BudgetPolicy:
    """The inputs of the budget that do not change with the model set: arena, shares, ``S``.

    The weight cache re-solves it whenever the device-pinned footprint changes; the start-up
    probe replaces ``max_scratch`` with the measured value (``attrs.evolve``).
    """

    arena: int
    fraction: float
    wiggle: float
    max_bytes: int = 0
    max_scratch: int = 0

    @property
    def enabled(self) -> bool:
        """Whether the on-demand cache is on (see :func:`cache_enabled`)."""
        return cache_enabled(arena=self.arena, fraction=self.fraction, max_bytes=self.max_bytes)

    @property
    def auto_sized(self) -> bool:
        """Whether the budget comes from the formula, so the start-up probe must measure ``S``."""
        return self.enabled and self.max_bytes == 0

    def provisional_budget(self) -> int:
        """The budget in force while the probe runs: ``max_bytes`` if given, else ``floor(f*A)``."""
        if self.max_bytes > 0:
            return self.max_bytes
        return math.floor(_exact(self.fraction) * self.arena) if self.enabled else 0

    def solve(self, pinned_bytes: int, *, on_demand_models: int = 0) -> WeightBudget:
        """The budget for a device-pinned footprint of ``pinned_bytes``."""
        return solve_weight_budget(
            arena=self.arena,
            fraction=self.fraction,
            wiggle=self.wiggle,
            max_scratch=self.max_scratch,
            pinned_bytes=pinned_bytes,
            max_bytes=self.max_bytes,
            on_demand_models=on_demand_models,
        )
