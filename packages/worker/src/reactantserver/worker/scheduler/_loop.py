"""The dispatch thread's loop: take work under the lock, run it outside, fail what is left.

Each turn takes the pending control commands if there are any, else the next batch and the
requests that expired while queued; it runs them outside the lock. When every queued model is
waiting out its queue delay (``max_queue_delay_microseconds``), the turn sleeps until the first
delay ends or a queue fills. The loop ends when
stopping and drained, or when the grace is over; then every request and control command still
waiting fails with ``UNAVAILABLE``, so no caller is left waiting.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any

from reactantserver.core.errors import DeadlineExceededError, ShuttingDownError
from reactantserver.worker.scheduler._dispatcher import Dispatcher
from reactantserver.worker.scheduler._state import SchedulerState, Work
from reactantserver.worker.scheduler.queue import State

__all__ = ["SHUTTING_DOWN", "DispatchLoop"]

SHUTTING_DOWN = "server is shutting down"

_log = logging.getLogger(__name__)


class DispatchLoop:
    """Owns the dispatch thread: starts it, runs its turns, stops it and fails the rest."""

    def __init__(
        self,
        state: SchedulerState,
        dispatcher: Dispatcher,
        clock: Callable[[], int],
    ) -> None:
        self._s = state
        self._dispatcher = dispatcher
        self._clock = clock
        # ``_thread`` names only a started thread: a stop that races a start (a shutdown
        # while start-up is still under way) joins it or finds none, never one half-started.
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the dispatch thread."""
        with self._start_lock:
            if self._thread is not None:
                raise RuntimeError("the scheduler is already started")
            thread = threading.Thread(target=self._run, name="reactant-dispatch", daemon=True)
            thread.start()
            self._thread = thread

    def stop(self, grace_s: float) -> None:
        """Stop admitting, serve what is queued for up to ``grace_s``, fail the rest, join."""
        with self._s.cond:
            if not self._s.stopping:
                self._s.stopping = True
                self._s.stop_deadline_ns = self._clock() + int(grace_s * 1e9)
            self._s.cond.notify_all()
        with self._start_lock:
            thread = self._thread
        if thread is not None:
            if thread is not threading.current_thread():
                thread.join()
        else:
            self._finish()

    def step(self) -> bool:
        """Run one turn of the loop on the calling thread, without waiting (tests).

        Returns whether there was anything to do.
        """
        self._dispatcher.reset_cpu_mark()
        work = self._next(wait=False)
        if work is None:
            return False
        self._do(work)
        return True

    def _run(self) -> None:
        try:
            self._dispatcher.reset_cpu_mark()
            while (work := self._next(wait=True)) is not None:
                self._do(work)
                # Idle, the last batch must not stay alive: its inputs may view a client's
                # shared memory, whose mapping then outlives the region's unregistration.
                del work
        except BaseException:  # a bug here must still answer every caller (below)
            _log.exception("the dispatch loop failed; failing every queued request")
        finally:
            self._finish()

    def _next(self, *, wait: bool) -> Work | None:
        with self._s.cond:
            while True:
                if self._s.controls:
                    controls = list(self._s.controls)
                    self._s.controls.clear()
                    return Work(controls=controls)
                now = self._clock()
                drained = not self._s.queued and not self._s.holds
                if self._s.stopping and (drained or now >= self._s.stop_deadline_ns):
                    return None
                hold = self._s.hold_until_locked(now) if self._s.queued else None
                if self._s.queued and hold is None:
                    work = self._s.take_locked(now)
                    if work.taken or work.expired:
                        return work
                    continue
                if not wait:
                    return None
                timeout = None
                if hold is not None:
                    timeout = (hold - now) * 1e-9
                elif self._s.stopping:
                    timeout = max(0.0, (self._s.stop_deadline_ns - now) * 1e-9)
                self._s.holding = hold is not None
                try:
                    self._s.cond.wait(timeout)
                finally:
                    self._s.holding = False

    def _do(self, work: Work) -> None:
        for fn, future in work.controls:
            self._run_control(fn, future)
        if work.controls:
            self._dispatcher.reset_cpu_mark()  # loads and other commands are no request's work
        for request in work.expired:
            request.completion.fail(
                DeadlineExceededError(
                    f"deadline exceeded while queued for model '{request.model.name}'"
                )
            )
        if work.taken:
            try:
                self._dispatcher.dispatch(work.taken, work.batch, prefetch=work.prefetch)
            except BaseException as exc:  # a bug must not strand the callers
                _log.exception("dispatch of %r failed", work.taken[0].model.name)
                self._dispatcher.settle(work.taken, exc)
        self._dispatcher.maybe_compact()

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

    def _finish(self) -> None:
        """Fail everything left (after the loop ends); nothing is left hanging."""
        with self._s.cond:
            self._s.stopping = True
            self._s.finished = True
            left = [r for q in self._s.queues.values() for r in q]
            for queue in self._s.queues.values():
                queue.remove_all(list(queue))
            self._s.queued = 0
            self._s.committed.clear()
            controls = list(self._s.controls)
            self._s.controls.clear()
            for request in left:
                request.state = State.DONE
            self._s.release_locked(left)
            drained = list(self._s.controls)
            self._s.controls.clear()
        error = ShuttingDownError(SHUTTING_DOWN)
        for request in left:
            request.completion.fail(error)
        for _fn, future in controls:
            if future is not None and future.set_running_or_notify_cancel():
                future.set_exception(ShuttingDownError(SHUTTING_DOWN))
        for fn, future in drained:
            self._run_control(fn, future)
