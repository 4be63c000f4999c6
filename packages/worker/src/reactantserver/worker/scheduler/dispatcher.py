"""The scheduler: admission, one dispatch thread, disciplines, coalescing, shutdown (04).

One :class:`threading.Condition` guards the queues, the committed list, the control queue
and the statistics; the dispatch thread holds it only to select and dequeue, then
executes outside it (XLA releases the GIL), so requests keep arriving::

    scheduler = Scheduler(backend, cache, config.scheduler)
    scheduler.add_model(ScheduledModel.from_loaded(loaded))
    scheduler.start()
    outputs = await scheduler.infer("resnet", tensors, deadline_ns=deadline)
    ...
    scheduler.stop(grace_s=10.0)
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import numpy as np

from reactantserver.core.config import SchedulerConfig, SchedulingDiscipline
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
from reactantserver.worker.scheduler._execute import Execution, execute
from reactantserver.worker.scheduler.costs import CostTable
from reactantserver.worker.scheduler.disciplines import (
    PlannedBatch,
    select_edf,
    select_fair,
    select_fifo,
)
from reactantserver.worker.scheduler.fair import RecentLoad, shares
from reactantserver.worker.scheduler.model import ScheduledModel
from reactantserver.worker.scheduler.planning import fit_batch, plan_batch
from reactantserver.worker.scheduler.queue import (
    Completion,
    FutureCompletion,
    LoopCompletion,
    ModelQueue,
    Pending,
    State,
)
from reactantserver.worker.scheduler.stats import ModelStats, StatsSnapshot

__all__ = ["SHUTTING_DOWN", "Scheduler"]

SHUTTING_DOWN = "server is shutting down"

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
Outputs = list[np.ndarray[Any, Any]]
_Control = tuple[Callable[[], Any], "concurrent.futures.Future[Any] | None"]


@attrs.define
class _Work:
    """What one turn of the dispatch loop does outside the lock."""

    controls: list[_Control] = attrs.Factory(list)
    expired: list[Pending] = attrs.Factory(list)
    taken: list[Pending] = attrs.Factory(list)
    batch: int = 0


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
        self._backend = backend
        self._cache = cache
        self._clock = clock
        self._cond = threading.Condition()
        self._models: dict[str, ScheduledModel] = {}
        self._queues: dict[str, ModelQueue] = {}
        self._queued = 0
        self._committed: collections.deque[Pending] = collections.deque()
        self._controls: collections.deque[_Control] = collections.deque()
        self._stats: dict[str, ModelStats] = {}
        self._load = RecentLoad(self.config.ema_halflife_seconds)
        self.costs = CostTable(self.config.cost_ema_alpha)
        self._seq = 0
        self._stopping = False
        self._finished = False
        self._stop_deadline_ns = 0
        self._thread: threading.Thread | None = None
        if cache is not None:
            cache.busy = self.busy

    # -- models ----------------------------------------------------------------------------

    def add_model(self, model: ScheduledModel) -> None:
        """Install a generation; an older one of the same name stops admitting and drains."""
        with self._cond:
            old = self._models.get(model.name)
            self._models[model.name] = model
            self._queues.setdefault(model.name, ModelQueue())
            self._stats.setdefault(model.name, ModelStats())
            if old is not None and old is not model:
                self._retire_locked(old)

    def remove_model(self, name: str) -> ScheduledModel | None:
        """Stop admitting ``name``; its queued requests still run, then ``on_drained`` fires."""
        with self._cond:
            model = self._models.pop(name, None)
            if model is not None:
                self._retire_locked(model)
                self._load.forget(name)
            return model

    def model(self, name: str) -> ScheduledModel | None:
        """The admitting generation of ``name``."""
        with self._cond:
            return self._models.get(name)

    def seed_costs(self, costs: Mapping[RunKey, float]) -> None:
        """Seed the cost table from start-up measurements (probe / warmup)."""
        with self._cond:
            self.costs.seed(costs)

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
    ) -> Pending:
        """Validate against the executable specs and queue; errors are raised here.

        ``tensors`` are executable-level (after ``preprocess``). ``priority`` < 1 means the
        configured default; ``committed`` marks a meta sub-call.
        """
        model = self.model(name)
        if model is None:
            raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found")
        now = self._clock()
        if deadline_ns is not None and now >= deadline_ns:
            raise DeadlineExceededError(f"deadline exceeded before model '{name}' queued it")
        arrays, variant, rows = model.prepare(tensors)
        with self._cond:
            if self._stopping:
                raise ShuttingDownError(SHUTTING_DOWN)
            if self._models.get(name) is not model:
                # Replaced while validating: the new generation may have other specs.
                raise ShuttingDownError(f"model '{name}' was reloaded; retry the request")
            queue = self._queues[name]
            if len(queue) >= self.config.max_queue_depth:
                self._stats[name].shed += 1
                raise OverloadedError(
                    f"queue for model '{name}' is full ({self.config.max_queue_depth})"
                )
            self._seq += 1
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
                seq=self._seq,
            )
            queue.push(request)
            self._queued += 1
            model.outstanding += 1
            if committed:
                self._committed.append(request)
            self._cond.notify()
            return request

    async def infer(
        self,
        name: str,
        tensors: Sequence[NamedTensor],
        *,
        deadline_ns: int | None = None,
        priority: int = 0,
    ) -> Outputs:
        """Queue a request from the event loop and await its outputs.

        Cancelling the awaiting task removes a still-queued request (never executed).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outputs] = loop.create_future()
        request = self.submit(
            name,
            tensors,
            completion=LoopCompletion(loop, future),
            deadline_ns=deadline_ns,
            priority=priority,
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
        with self._cond:
            if request.state is not State.QUEUED:
                return False
            self._queues[request.model.name].remove(request)
            self._queued -= 1
            request.state = State.CANCELLED
            stats = self._stats.get(request.model.name)
            if stats is not None:
                stats.cancelled += 1
            self._release_locked([request])
        request.completion.fail(asyncio.CancelledError())
        return True

    # -- control ---------------------------------------------------------------------------

    def control(self, fn: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        """Run ``fn`` on the dispatch thread before the next selection; its future."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        with self._cond:
            if self._finished:
                future.set_exception(ShuttingDownError(SHUTTING_DOWN))
                return future
            self._controls.append((fn, future))
            self._cond.notify()
        return future

    # -- statistics ------------------------------------------------------------------------

    def busy(self, name: str) -> bool:
        """Whether ``name`` has queued requests (the weight cache evicts busy models last)."""
        queue = self._queues.get(name)
        return bool(queue)

    def queue_depth(self, name: str) -> int:
        """Requests of ``name`` queued now."""
        with self._cond:
            queue = self._queues.get(name)
            return len(queue) if queue is not None else 0

    def stats(self, name: str) -> StatsSnapshot | None:
        """A snapshot of ``name``'s counters (``None`` for an unknown model)."""
        with self._cond:
            stats = self._stats.get(name)
            if stats is None:
                return None
            queue = self._queues.get(name)
            return stats.snapshot(
                queue_depth=len(queue) if queue is not None else 0,
                recent_load=self._load.value(name, self._clock()),
            )

    def all_stats(self) -> dict[str, StatsSnapshot]:
        """Snapshots of every model with counters."""
        with self._cond:
            names = list(self._stats)
        return {name: s for name in names if (s := self.stats(name)) is not None}

    # -- the dispatch loop -----------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopping

    def start(self) -> None:
        """Start the dispatch thread."""
        if self._thread is not None:
            raise RuntimeError("the scheduler is already started")
        self._thread = threading.Thread(target=self._run, name="reactant-dispatch", daemon=True)
        self._thread.start()

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop admitting, serve what is queued for up to ``grace_s``, fail the rest, join.

        Every request still queued after the grace and every pending control command fails
        with ``UNAVAILABLE``; no caller is left waiting.
        """
        with self._cond:
            if not self._stopping:
                self._stopping = True
                self._stop_deadline_ns = self._clock() + int(grace_s * 1e9)
            self._cond.notify_all()
        if self._thread is not None:
            if self._thread is not threading.current_thread():
                self._thread.join()
        else:
            self._finish()

    def step(self) -> bool:
        """Run one turn of the loop on the calling thread, without waiting (tests).

        Returns whether there was anything to do.
        """
        work = self._next(wait=False)
        if work is None:
            return False
        self._do(work)
        return True

    def _run(self) -> None:
        try:
            while (work := self._next(wait=True)) is not None:
                self._do(work)
        except BaseException:
            _log.exception("the dispatch loop failed; failing every queued request")
            raise
        finally:
            self._finish()

    def _next(self, *, wait: bool) -> _Work | None:
        with self._cond:
            while True:
                if self._controls:
                    controls = list(self._controls)
                    self._controls.clear()
                    return _Work(controls=controls)
                now = self._clock()
                if self._stopping and (not self._queued or now >= self._stop_deadline_ns):
                    return None
                if self._queued:
                    work = self._take_locked(now)
                    if work.taken or work.expired:
                        return work
                    continue
                if not wait:
                    return None
                timeout = None
                if self._stopping:
                    timeout = max(0.0, (self._stop_deadline_ns - now) * 1e-9)
                self._cond.wait(timeout)

    def _do(self, work: _Work) -> None:
        for fn, future in work.controls:
            self._run_control(fn, future)
        for request in work.expired:
            request.completion.fail(DeadlineExceededError("deadline exceeded while queued"))
        if work.taken:
            try:
                self._dispatch(work.taken, work.batch)
            except BaseException as exc:  # a bug must not strand the callers
                _log.exception("dispatch of %r failed", work.taken[0].model.name)
                self._settle(work.taken, exc)
        self._maybe_compact()

    def _run_control(
        self, fn: Callable[[], Any], future: concurrent.futures.Future[Any] | None
    ) -> None:
        if future is not None and not future.set_running_or_notify_cancel():
            return
        try:
            result = fn()
        except BaseException as exc:
            if future is None:
                _log.exception("control command failed")
            else:
                future.set_exception(exc)
        else:
            if future is not None:
                future.set_result(result)

    # -- selection (under the lock) --------------------------------------------------------

    def _take_locked(self, now: int) -> _Work:
        name, front = self._select_locked(now)
        queue = self._queues[name]
        work = _Work()
        expired = queue.expired(now)
        if expired:
            queue.remove_all(expired)
            self._queued -= len(expired)
            for request in expired:
                request.state = State.DONE
            self._stats[name].expired += len(expired)
            self._release_locked(expired)
            work.expired = expired
            if front is not None and front.state is not State.QUEUED:
                front = None
        if not queue:
            return work
        taken, batch = self._plan_locked(queue, front or queue[0])
        queue.remove_all(taken)
        self._queued -= len(taken)
        for request in taken:
            request.state = State.TAKEN
        self._stats[name].record_waits([now - r.enqueue_ns for r in taken])
        work.taken, work.batch = taken, batch
        return work

    def _select_locked(self, now: int) -> tuple[str, Pending | None]:
        while self._committed:
            request = self._committed[0]
            if request.state is State.QUEUED:
                return request.model.name, request
            self._committed.popleft()
        queues = {name: q for name, q in self._queues.items() if q}
        discipline = self.config.discipline
        if discipline is SchedulingDiscipline.FIFO or len(queues) == 1:
            return select_fifo(queues), None
        if discipline is SchedulingDiscipline.EDF:
            return select_edf(queues), None
        weights = {name: m.weight for name, m in self._models.items()}
        for name, queue in queues.items():
            weights.setdefault(name, queue[0].model.weight)

        def plan(name: str) -> PlannedBatch:
            queue = queues[name]
            taken, batch = self._plan_locked(queue, queue[0])
            return PlannedBatch(batch, len(taken))

        return (
            select_fair(
                queues,
                plan,
                share=shares(weights),
                nema=self._load.normalised(weights, now),
                cost=self.costs.get,
                cap=self.config.recency_penalty_cap,
                discount=self.config.coalescing_discount,
            ),
            None,
        )

    def _plan_locked(self, queue: ModelQueue, head: Pending) -> tuple[list[Pending], int]:
        model = head.model
        sizes = model.sizes[head.variant]
        cap = model.max_batch_size
        limit = min(math.inf if cap is None else cap, sizes[-1])
        window = queue.window(head, limit)
        measured = None
        if self.config.pad_up_when_cheaper and model.coalescable:
            name = model.name
            measured = lambda s: self.costs.measured(name, s)  # noqa: E731
        plan = plan_batch(
            [r.rows for r in window],
            sizes,
            cap=cap,
            coalescable=model.coalescable,
            measured=measured,
        )
        return window[: plan.count], plan.batch

    def _retire_locked(self, model: ScheduledModel) -> None:
        model.admitting = False
        if model.outstanding == 0:
            self._drained_locked(model)

    def _release_locked(self, requests: Sequence[Pending]) -> None:
        for request in requests:
            model = request.model
            model.outstanding -= 1
            if model.outstanding == 0 and not model.admitting:
                self._drained_locked(model)

    def _drained_locked(self, model: ScheduledModel) -> None:
        if model.on_drained is not None:
            self._controls.append((model.on_drained, None))
            self._cond.notify()

    # -- dispatch (outside the lock) -------------------------------------------------------

    def _dispatch(self, taken: list[Pending], batch: int) -> None:
        model = taken[0].model
        now = self._clock()
        margin_ns = 0
        if self.config.discipline is SchedulingDiscipline.EDF:
            measured = self.costs.measured(model.name, batch)
            margin_ns = int(measured * 1e9) if measured is not None else 0
        admitted: list[Pending] = []
        late: list[Pending] = []
        for request in taken:
            margin = 0 if request.committed else margin_ns
            (late if request.expired(now, margin) else admitted).append(request)
        if late:
            for request in late:
                request.completion.fail(
                    DeadlineExceededError("deadline exceeded before the request could run")
                )
            with self._cond:
                for request in late:
                    request.state = State.DONE
                if (stats := self._stats.get(model.name)) is not None:
                    stats.expired += len(late)
                self._release_locked(late)
        if not admitted:
            return
        if late and model.coalescable:
            batch = fit_batch(model.sizes[admitted[0].variant], sum(r.rows for r in admitted))
        self._run_isolated(admitted, batch)

    def _run_isolated(self, requests: list[Pending], batch: int) -> None:
        """Execute; if a merged dispatch fails, re-run each request alone once."""
        try:
            done = execute(self._backend, self._cache, requests, batch, self._clock)
        except Exception as exc:
            if len(requests) == 1:
                self._settle(requests, exc)
                return
            _log.warning(
                "batch of %d requests for %r failed (%s); retrying each alone",
                len(requests),
                requests[0].model.name,
                exc,
            )
            for request in requests:
                alone = batch
                if request.model.coalescable:
                    alone = fit_batch(request.model.sizes[request.variant], request.rows)
                try:
                    single = execute(self._backend, self._cache, [request], alone, self._clock)
                except Exception as single_exc:
                    self._settle([request], single_exc)
                else:
                    self._finish_dispatch([request], single)
            return
        self._finish_dispatch(requests, done)

    def _finish_dispatch(self, requests: list[Pending], done: Execution) -> None:
        # Counters first, so a caller that reads them after its result sees this dispatch.
        name = requests[0].model.name
        now = self._clock()
        with self._cond:
            for request in requests:
                request.state = State.DONE
            stats = self._stats.get(name)
            if stats is not None:
                stats.record_dispatch(
                    batch=done.batch,
                    requests=len(requests),
                    rows=sum(r.rows for r in requests),
                    input_ns=done.input_ns,
                    infer_ns=done.infer_ns,
                    output_ns=done.output_ns,
                    now_ns=now,
                )
            self.costs.record(name, done.batch, done.seconds)
            self._load.add(name, done.seconds, now)
            self._release_locked(requests)
        for request, outputs in zip(requests, done.results, strict=True):
            request.completion.resolve(outputs)

    def _settle(self, requests: Sequence[Pending], exc: BaseException) -> None:
        """Fail requests that did not get results."""
        pending = [r for r in requests if r.state is State.TAKEN]
        for request in pending:
            request.completion.fail(exc)
        with self._cond:
            for request in pending:
                request.state = State.DONE
            if pending and (stats := self._stats.get(pending[0].model.name)) is not None:
                stats.failed += len(pending)
            self._release_locked(pending)

    def _maybe_compact(self) -> None:
        interval = self.config.compaction_interval
        cache = self._cache
        if interval and cache is not None and cache.loads_since_compaction >= interval:
            cache.compact()

    def _finish(self) -> None:
        """Fail everything left (after the loop ends); nothing is left hanging."""
        with self._cond:
            self._stopping = True
            self._finished = True
            left = [r for q in self._queues.values() for r in q]
            for queue in self._queues.values():
                queue.remove_all(list(queue))
            self._queued = 0
            self._committed.clear()
            controls = list(self._controls)
            self._controls.clear()
            for request in left:
                request.state = State.DONE
            self._release_locked(left)
            drained = list(self._controls)
            self._controls.clear()
        error = ShuttingDownError(SHUTTING_DOWN)
        for request in left:
            request.completion.fail(error)
        for _fn, future in controls:
            if future is not None and future.set_running_or_notify_cancel():
                future.set_exception(ShuttingDownError(SHUTTING_DOWN))
        for fn, future in drained:
            self._run_control(fn, future)
