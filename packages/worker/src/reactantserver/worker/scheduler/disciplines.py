"""Which model runs next.

Each function gets the models with a non-empty queue and returns the winner's name; queues
are never reordered::

    name = select_fifo(queues)
    name = select_edf(queues)
    name = select_fair(plans, share=..., nema=..., cost=..., cap=0.25, discount=0.1)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from reactantserver.worker.scheduler.fair import fair_priority
from reactantserver.worker.scheduler.queue import ModelQueue

__all__ = ["PlannedBatch", "select_edf", "select_fair", "select_fifo"]


@attrs.frozen
class PlannedBatch:
    """What a model would dispatch now: compiled size and number of requests."""

    batch: int
    requests: int


def select_fifo(queues: Mapping[str, ModelQueue]) -> str:
    """The model whose head request is oldest (ties: name)."""
    return min(queues, key=lambda name: (queues[name][0].enqueue_ns, name))


def select_edf(queues: Mapping[str, ModelQueue]) -> str:
    """The model with the earliest queued deadline (none = +inf; ties: oldest head, name)."""
    return min(
        queues,
        key=lambda name: (queues[name].min_deadline(), queues[name][0].enqueue_ns, name),
    )


def select_fair(
    queues: Mapping[str, ModelQueue],
    plan: Callable[[str], PlannedBatch],
    *,
    share: Mapping[str, float],
    nema: Mapping[str, float],
    cost: Callable[[str, int], float],
    cap: float,
    discount: float,
) -> str:
    """The model with the highest fair priority (ties: oldest head, then name)."""

    def rank(name: str) -> tuple[float, int, str]:
        planned = plan(name)
        priority = fair_priority(
            share=share.get(name, 0.0),
            nema=nema.get(name, 0.0),
            cost=cost(name, planned.batch),
            requests=planned.requests,
            cap=cap,
            discount=discount,
        )
        return (-priority, queues[name][0].enqueue_ns, name)

    return min(queues, key=rank)
