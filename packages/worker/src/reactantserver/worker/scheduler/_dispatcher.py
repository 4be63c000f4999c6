"""Running a dequeued batch on the dispatch thread, outside the lock.

Dispatch admission (hard deadline, ``edf`` laxity), execution with failure isolation, and
recording: counters first, then each request's result, so a caller that reads the
statistics after its result sees its dispatch.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence

from reactantserver.core.config import SchedulingDiscipline
from reactantserver.core.errors import DeadlineExceededError
from reactantserver.worker.runtime.backend import Backend
from reactantserver.worker.runtime.weight_cache import WeightCache
from reactantserver.worker.scheduler._execute import Execution, execute
from reactantserver.worker.scheduler._state import SchedulerState
from reactantserver.worker.scheduler.planning import fit_batch
from reactantserver.worker.scheduler.queue import Pending, State, TraceMarks, resolve_all
from reactantserver.worker.scheduler.stats import ModelStats

__all__ = ["Dispatcher"]

_log = logging.getLogger(__name__)


def _mark(
    request: Pending, marks: TraceMarks, batch: list[Pending], done: Execution, end_ns: int
) -> None:
    """A traced request's scheduler marks, from the execution's own timings."""
    marks.enqueue_ns = request.enqueue_ns
    marks.rows = request.rows
    marks.start_ns = end_ns - (done.input_ns + done.infer_ns + done.output_ns)
    marks.end_ns = end_ns
    marks.batch = done.batch
    marks.batch_rows = sum(r.rows for r in batch)
    marks.requests = len(batch)


class Dispatcher:
    """Executes batches for the scheduler; used by the dispatch thread only."""

    def __init__(
        self,
        state: SchedulerState,
        backend: Backend,
        cache: WeightCache | None,
        clock: Callable[[], int],
    ) -> None:
        self._s = state
        self._backend = backend
        self._cache = cache
        self._clock = clock
        self._cpu_mark_ns = time.thread_time_ns()

    def reset_cpu_mark(self) -> None:
        """Start the next dispatch's CPU charge now (the dispatch thread's clock)."""
        self._cpu_mark_ns = time.thread_time_ns()

    def _charge_cpu_locked(self, stats: ModelStats) -> None:
        # Everything this thread did since the last charge (waking, selecting, assembling,
        # running, slicing; the previous delivery) is this dispatch's (worker_stage_cpu).
        now = time.thread_time_ns()
        stats.dispatch_cpu_ns += now - self._cpu_mark_ns
        self._cpu_mark_ns = now

    def dispatch(self, taken: list[Pending], batch: int, *, prefetch: str | None = None) -> None:
        """Admit, execute and record one dequeued batch (``prefetch``: weights to load while
        it executes)."""
        model = taken[0].model
        now = self._clock()
        margin_ns = 0
        if self._s.config.discipline is SchedulingDiscipline.EDF:
            measured = self._s.costs.measured(model.name, batch)
            margin_ns = int(measured * 1e9) if measured is not None else 0
        admitted: list[Pending] = []
        late: list[Pending] = []
        for request in taken:
            margin = 0 if request.committed else margin_ns
            (late if request.expired(now, margin) else admitted).append(request)
        if late:
            for request in late:
                request.completion.fail(
                    DeadlineExceededError(
                        f"deadline exceeded before dispatch for model '{model.name}'"
                    )
                )
            with self._s.cond:
                for request in late:
                    request.state = State.DONE
                if (stats := self._s.stats.get(model.name)) is not None:
                    stats.expired += len(late)
                self._s.release_locked(late)
        if not admitted:
            return
        if late and model.coalescable:
            batch = fit_batch(model.sizes[admitted[0].variant], sum(r.rows for r in admitted))
        self._run_isolated(admitted, batch, prefetch)

    def _run_isolated(self, requests: list[Pending], batch: int, prefetch: str | None) -> None:
        """Execute; if a merged dispatch fails, re-run each request alone once."""
        try:
            done = execute(
                self._backend, self._cache, requests, batch, self._clock, prefetch=prefetch
            )
        except Exception as exc:
            if len(requests) == 1:
                self.settle(requests, exc)
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
                    self.settle([request], single_exc)
                else:
                    self._finish_dispatch([request], single)
            return
        self._finish_dispatch(requests, done)

    def _finish_dispatch(self, requests: list[Pending], done: Execution) -> None:
        # Counters first, so a caller that reads them after its result sees this dispatch.
        name = requests[0].model.name
        now = self._clock()
        with self._s.cond:
            requests[0].model.arrivals.done(now, sum(r.rows for r in requests))
            for request in requests:
                request.state = State.DONE
                if request.trace is not None:
                    _mark(request, request.trace, requests, done, now)
            stats = self._s.stats.get(name)
            if stats is not None:
                self._charge_cpu_locked(stats)
                stats.record_dispatch(
                    batch=done.batch,
                    requests=len(requests),
                    rows=sum(r.rows for r in requests),
                    input_ns=done.input_ns,
                    infer_ns=done.infer_ns,
                    output_ns=done.output_ns,
                    now_ns=now,
                )
            self._s.costs.record(name, done.batch, done.seconds)
            self._s.load.add(name, done.seconds, now)
            self._s.release_locked(requests)
        resolve_all(
            [(r.completion, out) for r, out in zip(requests, done.results, strict=True)],
            functools.partial(self._s.charge_queue, name),
        )

    def settle(self, requests: Sequence[Pending], exc: BaseException) -> None:
        """Fail requests that did not get results."""
        pending = [r for r in requests if r.state is State.TAKEN]
        for request in pending:
            request.completion.fail(exc)
        with self._s.cond:
            for request in pending:
                request.state = State.DONE
            if pending and (stats := self._s.stats.get(pending[0].model.name)) is not None:
                self._charge_cpu_locked(stats)
                stats.failed += len(pending)
            self._s.release_locked(pending)

    def maybe_compact(self) -> None:
        interval = self._s.config.compaction_interval
        cache = self._cache
        if interval and cache is not None and cache.loads_since_compaction >= interval:
            cache.compact()
