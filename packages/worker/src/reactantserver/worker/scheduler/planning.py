"""Batch planning: which compiled size to run and how many queued requests it takes.

Pure functions over row counts, so every rule of the planning table (docs/reference/scheduling.md)
is a one-line
test::

    plan_batch([2, 2, 2], (1, 4, 8))            # Plan(batch=4, count=2)
    plan_batch([1, 1, 1], (4, 8), cap=2)        # Plan(batch=4, count=2), padded
    plan_batch([3], (0,), coalescable=False)    # Plan(batch=0, count=1)

``rows`` is the *window*: the head request first, then the requests behind it that share
its variant and generation, in queue order.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence

import attrs

__all__ = ["Plan", "fit_batch", "plan_batch", "take_count"]


@attrs.frozen
class Plan:
    """Run the compiled size ``batch`` on the first ``count`` requests of the window."""

    batch: int
    count: int


def fit_batch(sizes: Sequence[int], rows: int) -> int:
    """The smallest compiled size holding ``rows`` (the largest when none does).

    ``sizes`` is sorted ascending; ``(0,)`` (a lone ``model.mlir``) always gives 0.
    """
    i = bisect.bisect_left(sizes, rows)
    return sizes[min(i, len(sizes) - 1)]


def take_count(rows: Sequence[int], limit: float) -> int:
    """Requests taken from the front while the running row total stays <= ``limit``.

    Stops at the first request that does not fit (no skipping); at least one is taken.
    """
    total = 0
    count = 0
    for r in rows:
        if total + r > limit:
            break
        total += r
        count += 1
    return max(count, 1)


def plan_batch(
    rows: Sequence[int],
    sizes: Sequence[int],
    *,
    cap: int | None = None,
    coalescable: bool = True,
    measured: Callable[[int], float | None] | None = None,
) -> Plan:
    """Plan one dispatch over the window ``rows`` with compiled ``sizes`` (sorted ascending).

    ``cap`` is the model's ``max_batch_size``; ``measured(s)`` returns the learned cost of
    size ``s`` (``None`` when never measured) and, when given, enables the pad-up rule
    (``scheduler.pad_up_when_cheaper``).
    """
    if not rows:
        raise ValueError("cannot plan an empty window")
    head = rows[0]
    if not coalescable:
        return Plan(fit_batch(sizes, head), 1)
    limit = math.inf if cap is None else cap
    min_b, max_b = sizes[0], sizes[-1]
    # R only matters up to min(C, maxB): stop summing there (queues may be long).
    enough = min(limit, max_b)
    total = 0
    for r in rows:
        total += r
        if total >= enough:
            break
    room = min(total, limit)
    # Fill the largest size the queued rows reach; below the smallest size, pad it.
    batch = sizes[bisect.bisect_right(sizes, min(room, max_b)) - 1] if room >= min_b else min_b
    if head > batch:
        batch = fit_batch(sizes, head)
    count = take_count(rows, min(batch, limit))
    if measured is not None:
        batch, count = _pad_up(rows, sizes, (batch, count), limit, measured)
    return Plan(batch, count)


def _pad_up(
    rows: Sequence[int],
    sizes: Sequence[int],
    planned: tuple[int, int],
    limit: float,
    measured: Callable[[int], float | None],
) -> tuple[int, int]:
    """Step 8: among sizes >= the planned one, maximise taken rows per second (ties: smaller).

    A larger size counts only if it takes more requests than the plan: padding the same rows
    into a bigger program gains nothing, and two costs within noise must not decide it.
    """
    batch, count = planned
    larger = [
        s for s in sizes if s == batch or (s > batch and take_count(rows, min(s, limit)) > count)
    ]
    costs = [measured(s) for s in larger]
    if any(c is None or c <= 0.0 for c in costs):
        return batch, count
    best: tuple[float, int, int] | None = None
    for size, cost in zip(larger, costs, strict=True):
        assert cost is not None
        n = take_count(rows, min(size, limit))
        score = sum(rows[:n]) / cost
        if best is None or score > best[0]:
            best = (score, size, n)
    assert best is not None
    return best[1], best[2]
