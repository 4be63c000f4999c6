"""The scheduler's shared state and what the dispatch thread does under its lock.

One :class:`threading.Condition` guards everything here: per-model queues, the committed
list, the control queue, statistics, the fair EMAs and the cost table. The dispatch thread
holds it only for :meth:`SchedulerState.take_locked` (select a model, purge its expired
requests, plan and dequeue a batch); admission and cancellation hold it to insert/remove.
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from reactantserver.core.config import SchedulerConfig, SchedulingDiscipline
from reactantserver.worker.scheduler.adaptive import adaptive_end
from reactantserver.worker.scheduler.costs import CostTable
from reactantserver.worker.scheduler.disciplines import (
    PlannedBatch,
    select_edf,
    select_fair,
    select_fifo,
)
from reactantserver.worker.scheduler.fair import RecentLoad, shares
from reactantserver.worker.scheduler.model import ScheduledModel
from reactantserver.worker.scheduler.planning import plan_batch
from reactantserver.worker.scheduler.queue import ModelQueue, Pending, State
from reactantserver.worker.scheduler.stats import ModelStats

__all__ = ["Control", "SchedulerState", "Work"]

#: A closure to run on the dispatch thread and the future of its result (``None``: nobody waits).
Control = tuple[Callable[[], Any], "concurrent.futures.Future[Any] | None"]


@attrs.define
class Work:
    """What one turn of the dispatch loop does outside the lock."""

    controls: list[Control] = attrs.Factory(list)
    expired: list[Pending] = attrs.Factory(list)
    taken: list[Pending] = attrs.Factory(list)
    batch: int = 0
    prefetch: str | None = None
    """The weights to load while ``taken`` executes: the model expected next (see
    :meth:`SchedulerState.next_weights_locked`)."""


@attrs.define
class SchedulerState:
    """Everything the lock guards. Methods ending in ``_locked`` need ``cond`` held."""

    config: SchedulerConfig
    cond: threading.Condition = attrs.Factory(threading.Condition)
    models: dict[str, ScheduledModel] = attrs.Factory(dict)
    """The admitting generation of each model."""
    queues: dict[str, ModelQueue] = attrs.Factory(dict)
    queued: int = 0
    committed: collections.deque[Pending] = attrs.Factory(collections.deque)
    controls: collections.deque[Control] = attrs.Factory(collections.deque)
    stats: dict[str, ModelStats] = attrs.Factory(dict)
    load: RecentLoad = attrs.field(init=False)
    costs: CostTable = attrs.field(init=False)
    seq: int = 0
    stopping: bool = False
    holds: int = 0
    """Meta requests in flight: their committed sub-calls are still admitted while draining."""
    finished: bool = False
    stop_deadline_ns: int = 0
    holding: bool = False
    """The dispatch thread is sleeping out a queue delay; admission wakes it only for a
    queue that became ready (see :meth:`ready_at_locked`)."""
    prefetch: bool = False
    """Name the next model's weights with each batch (``scheduler.prefetch_weights`` and a
    weight cache that can prefetch)."""
    busy: bool = False
    """A turn's work is running outside the lock (on the dispatch thread, or inline on the
    thread that admitted a lone request): nobody else starts one meanwhile."""

    def __attrs_post_init__(self) -> None:
        self.load = RecentLoad(self.config.ema_halflife_seconds)
        self.costs = CostTable(self.config.cost_ema_alpha)

    def take_locked(self, now: int) -> Work:
        name, front = self.select_locked(now)
        queue = self.queues[name]
        work = Work()
        expired = queue.expired(now)
        if expired:
            queue.remove_all(expired)
            self.queued -= len(expired)
            for request in expired:
                request.state = State.DONE
            self.stats[name].expired += len(expired)
            self.release_locked(expired)
            work.expired = expired
            if front is not None and front.state is not State.QUEUED:
                front = None
        if not queue:
            return work
        taken, batch = self.plan_locked(queue, front or queue[0])
        if taken:
            taken[0].model.recent_rows.append(sum(r.rows for r in taken))
        queue.remove_all(taken)
        self.queued -= len(taken)
        for request in taken:
            request.state = State.TAKEN
        self.stats[name].record_waits([now - r.enqueue_ns for r in taken])
        work.taken, work.batch = taken, batch
        if self.prefetch and taken:
            work.prefetch = self.next_weights_locked(name)
        return work

    def next_weights_locked(self, running: str) -> str | None:
        """The weights key of the model expected to run after ``running``, if it has weights.

        The first queued committed sub-call's model, else the queue whose head has waited
        longest (``edf``: the earliest deadline). For ``fair`` this is a guess (scoring every
        queue again per dispatch would cost more than a wrong guess: one idle model's load).
        """
        for request in self.committed:
            if request.state is State.QUEUED and request.model.name != running:
                return request.model.weights
        queues = {n: q for n, q in self.queues.items() if q and n != running}
        if not queues:
            return None
        if self.config.discipline is SchedulingDiscipline.EDF:
            name = select_edf(queues)
        else:
            name = select_fifo(queues)
        return queues[name][0].model.weights

    def select_locked(self, now: int) -> tuple[str, Pending | None]:
        while self.committed:
            request = self.committed[0]
            if request.state is State.QUEUED:
                return request.model.name, request
            self.committed.popleft()
        queues = {name: q for name, q in self.queues.items() if q}
        discipline = self.config.discipline
        if discipline is SchedulingDiscipline.FIFO or len(queues) == 1:
            return select_fifo(queues), None
        if discipline is SchedulingDiscipline.EDF:
            return select_edf(queues), None
        weights = {name: m.weight for name, m in self.models.items()}
        for name, queue in queues.items():
            weights.setdefault(name, queue[0].model.weight)

        def plan(name: str) -> PlannedBatch:
            queue = queues[name]
            taken, batch = self.plan_locked(queue, queue[0])
            return PlannedBatch(batch, len(taken))

        return (
            select_fair(
                queues,
                plan,
                share=shares(weights),
                nema=self.load.normalised(weights, now),
                cost=self.costs.get,
                cap=self.config.recency_penalty_cap,
                discount=self.config.coalescing_discount,
            ),
            None,
        )

    def hold_until_locked(self, now: int) -> int | None:
        """While every queued model waits out its queue delay, the instant the first wait
        ends; ``None`` when something can be dispatched now (04, beyond: queue delay)."""
        if self.committed or self.stopping:
            return None
        until: int | None = None
        for queue in self.queues.values():
            if not queue:
                continue
            ready_at = self.ready_at_locked(queue, now)
            if ready_at <= now:
                return None
            until = ready_at if until is None else min(until, ready_at)
        return until

    def ready_at_locked(self, queue: ModelQueue, now: int) -> int:
        """When a non-empty queue should be dispatched: ``now`` unless the batch from its head
        could still grow and its model waits for rows.

        It never waits when the batch has reached the largest size it could run, when a
        request that cannot join it is queued behind it, or when a deadline in it falls
        within the wait. Otherwise a fixed queue delay (``max_queue_delay_microseconds``)
        holds the batch until its oldest request has waited that long, or until it holds as
        many rows as the largest of the model's recent batches: steady traffic then runs as
        soon as the rows that usually come together are in, and a lone caller (recent
        batches of one row) never waits. Without a fixed delay the wait is adaptive (see
        :meth:`adaptive_end_locked`).
        """
        head = queue[0]
        model = head.model
        delay = model.queue_delay_ns
        if not model.coalescable or (delay is not None and delay <= 0):
            return now
        limit = _row_limit(model, head)
        window = queue.window(head, limit)
        rows = sum(r.rows for r in window)
        if len(window) < len(queue) or rows >= limit:
            return now
        oldest = min(r.enqueue_ns for r in window)
        if delay is None:
            adaptive = self.adaptive_end_locked(model, head, rows, oldest, now)
            if adaptive is None:
                return now
            end = adaptive
        else:
            usual = model.usual_rows()
            if usual and rows >= usual:
                return now
            end = oldest + delay
        if any(r.deadline_ns is not None and r.deadline_ns <= end for r in window):
            return now
        return max(end, now)

    def adaptive_end_locked(
        self, model: ScheduledModel, head: Pending, rows: int, oldest: int, now: int
    ) -> int | None:
        """Until when a batch of ``rows`` waits without a fixed delay (None: not at all);
        the rules are :mod:`~reactantserver.worker.scheduler.adaptive`'s."""
        name = model.name
        return adaptive_end(
            model.arrivals,
            usual_rows=model.usual_rows(),
            rows=rows,
            oldest_ns=oldest,
            now_ns=now,
            sizes=model.sizes[head.variant],
            cost_of=lambda size: self.costs.measured(name, size),
        )

    def plan_locked(self, queue: ModelQueue, head: Pending) -> tuple[list[Pending], int]:
        model = head.model
        pad_up = self.config.pad_up_when_cheaper and model.coalescable
        # A plan from the queue's head depends only on the queue's contents and, with
        # pad-up, on the model's learned costs: reuse it until either changes.
        reusable = head is queue[0]
        version = self.costs.version(model.name) if pad_up else -1
        memo = queue.plan_memo
        if reusable and memo is not None and memo[2] == version:
            return list(memo[0]), memo[1]
        sizes = model.sizes[head.variant]
        cap = model.max_batch_size
        window = queue.window(head, _row_limit(model, head))
        measured = None
        if pad_up:
            name = model.name
            measured = lambda s: self.costs.measured(name, s)  # noqa: E731
        plan = plan_batch(
            [r.rows for r in window],
            sizes,
            cap=cap,
            coalescable=model.coalescable,
            measured=measured,
        )
        taken = window[: plan.count]
        if reusable:
            queue.plan_memo = (taken, plan.batch, version)
        return list(taken), plan.batch

    def retire_locked(self, model: ScheduledModel) -> None:
        model.admitting = False
        if model.outstanding == 0:
            self.drained_locked(model)

    def release_locked(self, requests: Sequence[Pending]) -> None:
        for request in requests:
            model = request.model
            model.outstanding -= 1
            if model.outstanding == 0 and not model.admitting:
                self.drained_locked(model)

    def drained_locked(self, model: ScheduledModel) -> None:
        if model.on_drained is not None:
            self.controls.append((model.on_drained, None))
            self.cond.notify()

    def charge_queue(self, name: str, ns: int) -> None:
        """Add thread CPU nanoseconds to ``name``'s queue stage (a ``resolve_all`` charge)."""
        with self.cond:
            if (stats := self.stats.get(name)) is not None:
                stats.queue_cpu_ns += ns

    # -- dispatch (outside the lock) -------------------------------------------------------


def _row_limit(model: ScheduledModel, head: Pending) -> float:
    """The most rows one execution from ``head`` can take: largest compiled size, capped."""
    cap = model.max_batch_size
    return min(math.inf if cap is None else cap, model.sizes[head.variant][-1])
