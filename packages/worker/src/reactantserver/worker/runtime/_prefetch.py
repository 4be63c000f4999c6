"""Whether the next model's weights may be loaded while another model runs, and what makes room.

A prefetch is a load started early: while the dispatch thread executes model A, it queues the
host-to-device copy of the weights of the model expected next, so that copy overlaps A's
execution (the GPU copies on a stream of its own). It is optional work, so it must never cost
what is about to run: it only evicts idle models (nothing queued, no meta run holding them),
never the running model nor a busy one, and it does not happen at all when the weights
would not fit under the budget that way. The decision is pure, for tests::

    plan = plan_prefetch(need=100, budget=250, resident=[Resident("a", 100, busy=False)],
                         keep={"b"})
    assert plan == PrefetchPlan(victims=("a",))  # 100 + 100 + ... fits once idle "a" goes
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import attrs

__all__ = ["PrefetchPlan", "Resident", "plan_prefetch"]


@attrs.frozen
class Resident:
    """A resident on-demand model as the plan sees it (listed least recently used first)."""

    name: str
    nbytes: int
    busy: bool
    """Queued requests or an in-flight meta run: it is about to run, so never a victim."""


@attrs.frozen
class PrefetchPlan:
    """Evict ``victims`` (idle, least recently used first), then start the load."""

    victims: tuple[str, ...] = ()


def plan_prefetch(
    *, need: int, budget: int, resident: Sequence[Resident], keep: Collection[str]
) -> PrefetchPlan | None:
    """How to make room for ``need`` bytes under ``budget`` with idle victims only.

    ``resident`` lists the resident on-demand models, least recently used first; ``keep``
    names models that must stay (the one executing). ``None``: no prefetch (the weights are
    larger than the budget, or only busy or kept models could make room).
    """
    if need <= 0 or need > budget:
        return None
    used = sum(r.nbytes for r in resident)
    victims: list[str] = []
    for candidate in resident:
        if used + need <= budget:
            break
        if candidate.busy or candidate.name in keep:
            continue
        victims.append(candidate.name)
        used -= candidate.nbytes
    if used + need > budget:
        return None
    return PrefetchPlan(tuple(victims))
