"""The meta gate: at most ``meta.concurrency`` gated metas run at once.

A meta with sub-models holds a permit for its whole ``run``, glue included. Waiting happens
on the event loop (never in the hook pool, whose threads the running metas and other models'
hooks need), first come first served, bounded by the request's deadline::

    gate = MetaGate(2)
    async with gate.permit(deadline_ns):     # DeadlineExceededError when it cannot get one
        ...                                  # run the meta in the hook pool
    gate.in_use, gate.waiting                # the worker_meta_gate_* gauges

The gate is not bound to one event loop: a permit released on any thread is handed to the
oldest waiter on that waiter's own loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable

from reactantserver.core.errors import DeadlineExceededError

__all__ = ["MetaGate"]


class MetaGate:
    """A counting semaphore with FIFO, deadline-bounded async acquisition."""

    def __init__(self, capacity: int, *, clock: Callable[[], int] = time.monotonic_ns) -> None:
        if capacity < 1:
            raise ValueError(f"meta gate capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._clock = clock
        self._lock = threading.Lock()
        self._in_use = 0
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = (
            collections.deque()
        )

    @property
    def capacity(self) -> int:
        """Permits in all."""
        return self._capacity

    @property
    def in_use(self) -> int:
        """Permits held now."""
        with self._lock:
            return self._in_use

    @property
    def waiting(self) -> int:
        """Metas waiting for a permit now."""
        with self._lock:
            return len(self._waiters)

    async def acquire(self, deadline_ns: int | None = None, *, model: str = "") -> None:
        """Take a permit; :class:`DeadlineExceededError` if the deadline passes first."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._in_use < self._capacity and not self._waiters:
                self._in_use += 1
                return
            if deadline_ns is not None and self._clock() >= deadline_ns:
                raise _timed_out(model)
            future: asyncio.Future[None] = loop.create_future()
            waiter = (loop, future)
            self._waiters.append(waiter)
        timeout = None if deadline_ns is None else max(0.0, (deadline_ns - self._clock()) / 1e9)
        try:
            await asyncio.wait_for(future, timeout)
        except BaseException as exc:
            with self._lock:
                queued = waiter in self._waiters
                if queued:
                    self._waiters.remove(waiter)
            if not queued and not future.cancel() and not future.cancelled():
                # Granted just before we gave up: pass the permit on. (A grant still in flight
                # finds the future cancelled and passes it on in _grant.)
                self.release()
            if isinstance(exc, TimeoutError):
                raise _timed_out(model) from None
            raise

    def release(self) -> None:
        """Give a permit back: to the oldest waiter, else to the pool."""
        with self._lock:
            if not self._waiters:
                if self._in_use <= 0:
                    raise RuntimeError("meta gate released more often than acquired")
                self._in_use -= 1
                return
            loop, future = self._waiters.popleft()
        try:
            loop.call_soon_threadsafe(self._grant, future)
        except RuntimeError:  # that waiter's loop is closed: nobody waits there any more
            self.release()

    def _grant(self, future: asyncio.Future[None]) -> None:
        if future.done():  # the waiter gave up (deadline, cancellation): pass the permit on
            self.release()
        else:
            future.set_result(None)

    @contextlib.asynccontextmanager
    async def permit(
        self, deadline_ns: int | None = None, *, model: str = ""
    ) -> AsyncIterator[None]:
        """Hold a permit for the body (released however it ends)."""
        await self.acquire(deadline_ns, model=model)
        try:
            yield
        finally:
            self.release()


def _timed_out(model: str) -> DeadlineExceededError:
    what = f"meta '{model}'" if model else "a meta"
    return DeadlineExceededError(f"deadline exceeded while {what} waited for the meta gate")
