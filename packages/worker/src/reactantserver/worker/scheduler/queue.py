"""Queued requests and each model's queue.

A model's queue keeps committed meta sub-calls first (arrival order), then the other
requests by effective priority (lower = more urgent), FIFO within a level. A request's
result reaches its caller through a :class:`Completion`: an asyncio future resolved with
``call_soon_threadsafe`` for event-loop callers, or a ``concurrent.futures.Future`` for
threads (meta sub-calls, benchmarks).
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import contextlib
import enum
import heapq
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import attrs
import numpy as np

from reactantserver.worker.scheduler.model import ScheduledModel

__all__ = [
    "Completion",
    "FutureCompletion",
    "LoopCompletion",
    "ModelQueue",
    "Pending",
    "State",
    "TraceMarks",
    "resolve_all",
]

Outputs = list[np.ndarray[Any, Any]]


class Completion(Protocol):
    """Where a request's outcome goes; both methods are called at most once, from any thread."""

    def resolve(self, outputs: Outputs) -> None:
        """Deliver the executable outputs of the request."""
        ...

    def fail(self, exc: BaseException) -> None:
        """Deliver an error."""
        ...


class FutureCompletion:
    """Completes a ``concurrent.futures.Future`` (ignored when the caller cancelled it)."""

    def __init__(self, future: concurrent.futures.Future[Outputs] | None = None) -> None:
        self.future: concurrent.futures.Future[Outputs] = future or concurrent.futures.Future()

    def resolve(self, outputs: Outputs) -> None:
        """Set the result unless the future is already done."""
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self.future.set_result(outputs)

    def fail(self, exc: BaseException) -> None:
        """Set the exception unless the future is already done."""
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self.future.set_exception(exc)


def _settle(
    future: asyncio.Future[Outputs], outputs: Outputs | None, exc: BaseException | None
) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(outputs if outputs is not None else [])


class LoopCompletion:
    """Completes an asyncio future on its own event loop, from the dispatch thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Outputs]) -> None:
        self.loop = loop
        self.future = future

    def resolve(self, outputs: Outputs) -> None:
        """Schedule the result on the loop (dropped if the loop is closed)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(_settle, self.future, outputs, None)

    def fail(self, exc: BaseException) -> None:
        """Schedule the exception on the loop (dropped if the loop is closed)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(_settle, self.future, None, exc)


def _settle_many(
    items: list[tuple[asyncio.Future[Outputs], Outputs]], charge: Callable[[int], None] | None
) -> None:
    started = time.thread_time_ns()
    for future, outputs in items:
        _settle(future, outputs, None)
    if charge is not None:
        charge(time.thread_time_ns() - started)


def resolve_all(
    results: Sequence[tuple[Completion, Outputs]], charge: Callable[[int], None] | None = None
) -> None:
    """Deliver several results; event-loop callers get one wake-up per loop, not one each.

    Each ``call_soon_threadsafe`` writes the loop's self-pipe; batching them keeps a 32-request
    dispatch from costing 32 system calls and 32 loop wake-ups. ``charge`` receives the thread
    CPU nanoseconds each loop spent settling its futures (the queue stage's wake-up side).
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Outputs], Outputs]]] = {}
    for completion, outputs in results:
        if isinstance(completion, LoopCompletion):
            by_loop.setdefault(completion.loop, []).append((completion.future, outputs))
        else:
            completion.resolve(outputs)
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(_settle_many, items, charge)


class State(enum.Enum):
    """Where a request is in its life."""

    QUEUED = "queued"
    TAKEN = "taken"
    """Dequeued into a batch; it will be answered by the dispatch thread."""
    DONE = "done"
    CANCELLED = "cancelled"


@attrs.define
class TraceMarks:
    """Where a traced request's time went in the scheduler (``time.monotonic_ns()`` marks).

    The caller hands one in with a traced request; the dispatch thread fills it when the
    request's batch has run (before the result is delivered), from the timings it records
    for the statistics anyway. ``end_ns`` stays 0 when the request never executed.
    """

    enqueue_ns: int = 0
    start_ns: int = 0
    """The batch's execution began (input assembly); the queue wait ends here."""
    end_ns: int = 0
    rows: int = 0
    """Rows of this request."""
    batch: int = 0
    """The compiled batch size that ran."""
    batch_rows: int = 0
    """Rows of every request in the batch (padding excluded)."""
    requests: int = 0
    """Requests coalesced into the batch."""


@attrs.define(eq=False)
class Pending:
    """One admitted request: executable-order arrays plus everything the scheduler needs.

    ``deadline_ns`` is absolute ``time.monotonic_ns()`` (``None`` = none); ``priority`` is
    the effective priority (>= 1).
    """

    model: ScheduledModel
    inputs: Sequence[np.ndarray[Any, Any]]
    rows: int
    variant: int | None
    priority: int
    committed: bool
    enqueue_ns: int
    deadline_ns: int | None
    completion: Completion
    seq: int
    state: State = State.QUEUED
    trace: TraceMarks | None = None
    """Filled at dispatch for a traced request (``None``: not traced)."""

    @property
    def sort_key(self) -> tuple[int, int, int]:
        """Committed first (arrival order), then priority, then arrival."""
        return (0, 0, self.seq) if self.committed else (1, self.priority, self.seq)

    @property
    def deadline(self) -> float:
        """The deadline, or +inf."""
        return math.inf if self.deadline_ns is None else self.deadline_ns

    def coalesces_with(self, other: Pending) -> bool:
        """Same generation and same variant: their inputs concatenate."""
        return self.model is other.model and self.variant == other.variant

    def expired(self, now_ns: int, margin_ns: int = 0) -> bool:
        """Whether the deadline falls at or before ``now + margin``."""
        return self.deadline_ns is not None and now_ns + margin_ns >= self.deadline_ns


class ModelQueue:
    """The queue of one model name (all generations), in dispatch order."""

    def __init__(self) -> None:
        self._items: list[Pending] = []
        self._keys: list[tuple[int, int, int]] = []
        # Min-heap of (deadline, seq, request) with lazy deletion: entries whose request is
        # no longer QUEUED are dropped when they reach the top. Keeps edf selection and the
        # expiry purge O(log n) instead of a scan of the queue.
        self._deadlines: list[tuple[int, int, Pending]] = []
        #: The scheduler's plan from the head (taken requests, batch, the model's cost-table
        #: version it was planned with), dropped by every change to the contents: the fair
        #: discipline plans every queue on every dispatch.
        self.plan_memo: tuple[list[Pending], int, int] | None = None

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Pending]:
        return iter(self._items)

    def __getitem__(self, index: int) -> Pending:
        return self._items[index]

    def push(self, request: Pending) -> None:
        """Insert ``request`` at its place in the order."""
        key = request.sort_key
        i = bisect.bisect_right(self._keys, key)
        self._keys.insert(i, key)
        self._items.insert(i, request)
        self.plan_memo = None
        if request.deadline_ns is not None:
            heapq.heappush(self._deadlines, (request.deadline_ns, request.seq, request))

    def remove(self, request: Pending) -> bool:
        """Remove one request; ``False`` when it is not queued here."""
        key = request.sort_key
        i = bisect.bisect_left(self._keys, key)
        if i < len(self._items) and self._items[i] is request:
            del self._keys[i]
            del self._items[i]
            self.plan_memo = None
            self._forget_if_empty()
            return True
        return False

    def remove_all(self, requests: Sequence[Pending]) -> None:
        """Remove several requests (each must be queued here)."""
        if len(requests) == 1:
            self.remove(requests[0])
            return
        k = len(requests)
        self.plan_memo = None
        if all(a is b for a, b in zip(self._items[:k], requests, strict=False)):
            # The usual case: a dispatch takes a prefix of the queue.
            del self._items[:k]
            del self._keys[:k]
            self._forget_if_empty()
            return
        gone = {id(r) for r in requests}
        kept = [(k, r) for k, r in zip(self._keys, self._items, strict=True) if id(r) not in gone]
        self._keys = [k for k, _ in kept]
        self._items = [r for _, r in kept]
        self._forget_if_empty()

    def _forget_if_empty(self) -> None:
        # Nothing queued: every deadline entry is dead. Drop them now, not lazily, or an idle
        # model keeps its last requests alive (their inputs may view a client's shared memory,
        # whose mapping would outlive the region's unregistration).
        if not self._items:
            self._deadlines.clear()

    def window(self, head: Pending, limit: float) -> list[Pending]:
        """``head`` then the requests behind it that coalesce with it, in order.

        Collection stops at the first request that does not coalesce, or once the rows
        collected reach ``limit`` (the planner needs no more).
        """
        window = [head]
        if not head.model.coalescable:
            return window
        total = head.rows
        for request in self._items:
            if total >= limit:
                break
            if request is head:
                continue
            if not request.coalesces_with(head):
                break
            window.append(request)
            total += request.rows
        return window

    def min_deadline(self) -> float:
        """The earliest deadline among queued requests (+inf when none has one)."""
        heap = self._deadlines
        while heap and not self._holds(heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def expired(self, now_ns: int) -> list[Pending]:
        """Queued requests whose deadline has passed, in queue order."""
        if self.min_deadline() > now_ns:
            return []
        heap = self._deadlines
        late: list[Pending] = []
        stack = [0]
        while stack:  # walk only the heap's subtrees that start at or before now
            i = stack.pop()
            if i >= len(heap) or heap[i][0] > now_ns:
                continue
            if self._holds(heap[i][2]):
                late.append(heap[i][2])
            stack.extend((2 * i + 1, 2 * i + 2))
        late.sort(key=lambda r: r.sort_key)
        return late

    def _holds(self, request: Pending) -> bool:
        i = bisect.bisect_left(self._keys, request.sort_key)
        return i < len(self._items) and self._items[i] is request
