"""The scheduler: admission, one dispatch thread, disciplines, coalescing, shutdown.

One :class:`threading.Condition` guards the queues, the committed list, the control queue
and the statistics; the dispatch thread holds it only to select and dequeue, then
executes outside it (XLA releases the GIL), so requests keep arriving. This module admits
requests and manages the model table; the thread's loop is ``_loop``, a batch's execution
``_dispatcher``::

    scheduler = Scheduler(backend, cache, config.scheduler)
    scheduler.add_model(ScheduledModel.from_loaded(loaded))
    scheduler.start()
    outputs = await scheduler.infer("resnet", tensors, deadline_ns=deadline)
    ...
    scheduler.stop(grace_s=10.0)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from reactantserver.core.config import SchedulerConfig
from reactantserver.core.errors import (
    DeadlineExceededError,
    ModelNotFoundError,
    OverloadedError,
    ShuttingDownError,
)
from reactantserver.core.hooks import NamedTensor
from reactantserver.worker.runtime.backend import Backend
from reactantserver.worker.runtime.probe import RunKey
from reactantserver.worker.runtime.weight_cache import WeightCache
from reactantserver.worker.scheduler._dispatcher import Dispatcher
from reactantserver.worker.scheduler._loop import SHUTTING_DOWN, DispatchLoop
from reactantserver.worker.scheduler._state import SchedulerState
from reactantserver.worker.scheduler.costs import CostTable
from reactantserver.worker.scheduler.model import ScheduledModel
from reactantserver.worker.scheduler.queue import (
    Completion,
    FutureCompletion,
    LoopCompletion,
    ModelQueue,
    Pending,
    State,
    TraceMarks,
)
from reactantserver.worker.scheduler.stage_clock import StageClock
from reactantserver.worker.scheduler.stats import ModelStats, StatsSnapshot

__all__ = ["SHUTTING_DOWN", "Scheduler"]

_T = TypeVar("_T")
Outputs = list[np.ndarray[Any, Any]]


class Scheduler:
    """Per-model queues feeding one dispatch thread that owns execution and residency.

    ``cache`` is the weight cache (``None``: models carry no device weights, as in unit
    tests). ``clock`` is ``time.monotonic_ns`` (deadlines use the same clock); tests inject
    a fake one and drive the loop with :meth:`step` instead of :meth:`start`.
    """

    def __init__(
        self,
        backend: Backend,
        cache: WeightCache | None = None,
        config: SchedulerConfig | None = None,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.config = config or SchedulerConfig()
        self._cache = cache
        self._clock = clock
        self._s = SchedulerState(self.config)
        self._loop = DispatchLoop(self._s, Dispatcher(self._s, backend, cache, clock), clock)
        #: Which admissions time their CPU (the ``queue`` stage; see ``scheduler.stage_clock``).
        self.stage_clock = StageClock()
        if cache is not None:
            cache.busy = self.busy
            self._s.prefetch = self.config.prefetch_weights and cache.can_prefetch

    @property
    def costs(self) -> CostTable:
        """The learned cost table (read it under no lock only in tests)."""
        return self._s.costs

    # -- models ----------------------------------------------------------------------------

    def add_model(self, model: ScheduledModel) -> None:
        """Install a generation; an older one of the same name stops admitting and drains."""
        with self._s.cond:
            old = self._s.models.get(model.name)
            self._s.models[model.name] = model
            self._s.queues.setdefault(model.name, ModelQueue())
            self._s.stats.setdefault(model.name, ModelStats())
            if old is not None and old is not model:
                self._s.retire_locked(old)

    def remove_model(self, name: str) -> ScheduledModel | None:
        """Stop admitting ``name``; its queued requests still run, then ``on_drained`` fires."""
        with self._s.cond:
            model = self._s.models.pop(name, None)
            if model is not None:
                self._s.retire_locked(model)
                self._s.load.forget(name)
            return model

    def rename_model(self, old: str, new: str) -> ScheduledModel:
        """Re-key the admitting generation of ``old`` as ``new`` with its queue and counters.

        Queued requests move with it and keep their place; ``KeyError`` for an unknown
        ``old``, ``ValueError`` when ``new`` is taken (dispatch thread: no batch in flight).
        """
        with self._s.cond:
            if new in self._s.models or self._s.queues.get(new):
                raise ValueError(f"model {new!r} is already scheduled")
            model = self._s.models.pop(old)
            model.name = new
            self._s.models[new] = model
            self._s.queues[new] = self._s.queues.pop(old) if old in self._s.queues else ModelQueue()
            self._s.stats[new] = self._s.stats.pop(old) if old in self._s.stats else ModelStats()
            self._s.costs.rename(old, new)
            self._s.load.rename(old, new)
            return model

    def rename_counters(self, old: str, new: str) -> None:
        """Move the counters and learned costs of ``old`` to ``new`` (a meta renamed in place)."""
        with self._s.cond:
            if old in self._s.stats:
                self._s.stats[new] = self._s.stats.pop(old)
            self._s.costs.rename(old, new)

    def model(self, name: str) -> ScheduledModel | None:
        """The admitting generation of ``name``."""
        with self._s.cond:
            return self._s.models.get(name)

    def set_weight(self, name: str, weight: float) -> bool:
        """Set the live fair weight of ``name`` (``False`` when no such model is installed)."""
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"weight must be finite and > 0, got {weight!r}")
        with self._s.cond:
            model = self._s.models.get(name)
            if model is None:
                return False
            model.weight = weight
            return True

    def seed_costs(self, costs: Mapping[RunKey, float]) -> None:
        """Seed the cost table from start-up measurements (probe / warmup)."""
        with self._s.cond:
            self._s.costs.seed(costs)

    # -- admission -------------------------------------------------------------------------

    def submit(
        self,
        name: str,
        tensors: Sequence[NamedTensor],
        *,
        completion: Completion,
        deadline_ns: int | None = None,
        priority: int = 0,
        committed: bool = False,
        trace: TraceMarks | None = None,
    ) -> Pending:
        """Validate against the executable specs and queue; errors are raised here.

        ``tensors`` are executable-level (after ``preprocess``). ``priority`` < 1 means the
        configured default; ``committed`` marks a meta sub-call; ``trace`` is filled with the
        request's scheduler marks when its batch has run.
        """
        timed = self.stage_clock.timed()
        started = time.thread_time_ns() if timed else 0
        model = self._s.models.get(name)  # one dict read; checked again under the lock below
        if model is None:
            raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found")
        now = self._clock()
        if deadline_ns is not None and now >= deadline_ns:
            raise DeadlineExceededError(f"deadline exceeded before model '{name}' queued it")
        arrays, variant, rows = model.prepare(tensors)
        with self._s.cond:
            # A meta admitted before shutdown may finish its pipeline during the drain.
            if self._s.finished or (self._s.stopping and not committed):
                raise ShuttingDownError(SHUTTING_DOWN)
            if self._s.models.get(name) is not model:
                # Replaced while validating: the new generation may have other specs.
                raise ShuttingDownError(f"model '{name}' was reloaded; retry the request")
            queue = self._s.queues[name]
            if len(queue) >= self.config.max_queue_depth:
                self._s.stats[name].shed += 1
                raise OverloadedError(
                    f"queue for model '{name}' is full ({self.config.max_queue_depth})"
                )
            self._s.seq += 1
            request = Pending(
                model=model,
                inputs=arrays,
                rows=rows,
                variant=variant,
                priority=priority if priority >= 1 else self.config.default_priority,
                committed=committed,
                enqueue_ns=self._clock(),
                deadline_ns=deadline_ns,
                completion=completion,
                seq=self._s.seq,
                trace=trace,
            )
            queue.push(request)
            self._s.queued += 1
            model.outstanding += 1
            model.arrivals.arrived(request.enqueue_ns)
            if committed:
                self._s.committed.append(request)
            # A dispatch thread sleeping out a queue delay only needs waking for a queue
            # that is ready now (full, or a request that cannot join the waiting batch).
            if committed or not self._s.holding or self._s.ready_at_locked(queue, now) <= now:
                self._s.cond.notify()
            if timed:
                spent = time.thread_time_ns() - started
                self._s.stats[name].queue_cpu_ns += self.stage_clock.scale(spent)
            return request

    async def infer(
        self,
        name: str,
        tensors: Sequence[NamedTensor],
        *,
        deadline_ns: int | None = None,
        priority: int = 0,
        trace: TraceMarks | None = None,
    ) -> Outputs:
        """Queue a request from the event loop and await its outputs.

        Cancelling the awaiting task removes a still-queued request (never executed).
        ``trace``: see :meth:`submit`.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outputs] = loop.create_future()
        request = self.submit(
            name,
            tensors,
            completion=LoopCompletion(loop, future),
            deadline_ns=deadline_ns,
            priority=priority,
            trace=trace,
        )
        try:
            return await future
        except asyncio.CancelledError:
            self.cancel(request)
            raise

    def call(
        self,
        name: str,
        tensors: Sequence[NamedTensor],
        *,
        deadline_ns: int | None = None,
        priority: int = 0,
        committed: bool = False,
    ) -> Outputs:
        """Queue a request from a plain thread and block for its outputs (meta sub-calls).

        With a deadline, a request still queued when it passes is withdrawn and
        :class:`DeadlineExceededError` raised.
        """
        completion = FutureCompletion()
        request = self.submit(
            name,
            tensors,
            completion=completion,
            deadline_ns=deadline_ns,
            priority=priority,
            committed=committed,
        )
        timeout = None
        if deadline_ns is not None:
            timeout = max(0.0, (deadline_ns - self._clock()) * 1e-9)
        try:
            return completion.future.result(timeout)
        except concurrent.futures.TimeoutError:
            if self.cancel(request):
                raise DeadlineExceededError(f"deadline exceeded waiting for '{name}'") from None
            return completion.future.result()

    def cancel(self, request: Pending) -> bool:
        """Withdraw a queued request (the caller went away); ``False`` once it was taken."""
        with self._s.cond:
            if request.state is not State.QUEUED:
                return False
            self._s.queues[request.model.name].remove(request)
            self._s.queued -= 1
            request.state = State.CANCELLED
            stats = self._s.stats.get(request.model.name)
            if stats is not None:
                stats.cancelled += 1
            self._s.release_locked([request])
        request.completion.fail(asyncio.CancelledError())
        return True

    def record_meta(self, name: str, compute_ns: int) -> None:
        """Count one served request of meta ``name``.

        One "dispatch" of one request and one row under cost key 0; ``compute_ns`` is the
        wall time its ``run`` spent inside sub-calls (glue excluded).
        """
        now = self._clock()
        with self._s.cond:
            stats = self._s.stats.setdefault(name, ModelStats())
            stats.record_dispatch(
                batch=0,
                requests=1,
                rows=1,
                input_ns=0,
                infer_ns=compute_ns,
                output_ns=0,
                now_ns=now,
            )
            self._s.costs.record(name, 0, compute_ns * 1e-9)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Keep the drain going while a meta request runs (its later stages still queue).

        :meth:`stop` serves committed sub-calls of held requests until they finish or the
        grace ends.
        """
        with self._s.cond:
            self._s.holds += 1
        try:
            yield
        finally:
            with self._s.cond:
                self._s.holds -= 1
                self._s.cond.notify_all()

    # -- control ---------------------------------------------------------------------------

    def control(self, fn: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        """Run ``fn`` on the dispatch thread before the next selection; its future."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        with self._s.cond:
            if self._s.finished:
                future.set_exception(ShuttingDownError(SHUTTING_DOWN))
                return future
            self._s.controls.append((fn, future))
            self._s.cond.notify()
        return future

    # -- statistics ------------------------------------------------------------------------

    def busy(self, name: str) -> bool:
        """Whether ``name`` has queued requests (the weight cache evicts busy models last)."""
        queue = self._s.queues.get(name)
        return bool(queue)

    def queue_depth(self, name: str) -> int:
        """Requests of ``name`` queued now."""
        with self._s.cond:
            queue = self._s.queues.get(name)
            return len(queue) if queue is not None else 0

    def stats(self, name: str) -> StatsSnapshot | None:
        """A snapshot of ``name``'s counters (``None`` for an unknown model)."""
        with self._s.cond:
            stats = self._s.stats.get(name)
            if stats is None:
                return None
            queue = self._s.queues.get(name)
            return stats.snapshot(
                queue_depth=len(queue) if queue is not None else 0,
                recent_load=self._s.load.value(name, self._clock()),
            )

    def all_stats(self) -> dict[str, StatsSnapshot]:
        """Snapshots of every model with counters."""
        with self._s.cond:
            names = list(self._s.stats)
        return {name: s for name in names if (s := self.stats(name)) is not None}

    # -- the dispatch loop -----------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._s.stopping

    def start(self) -> None:
        """Start the dispatch thread."""
        self._loop.start()

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop admitting, serve what is queued for up to ``grace_s``, fail the rest, join.

        Every request still queued after the grace and every pending control command fails
        with ``UNAVAILABLE``; no caller is left waiting.
        """
        self._loop.stop(grace_s)

    def step(self) -> bool:
        """Run one turn of the loop on the calling thread, without waiting (tests).

        Returns whether there was anything to do.
        """
        return self._loop.step()
