"""Serving one meta request: gate, ``run`` in the hook pool, output checks, statistics.

The data plane hands every request for a meta here after the common admission checks::

    runner = MetaRunner(registry, scheduler, hook_pool, gate=MetaGate(2), scratch=pool)
    response = await runner.infer(entry.meta, request)

A gated meta (non-empty ``meta.calls``) takes a gate permit on the event loop first, bounded
by its deadline, and holds it until ``run`` has returned on its pool thread, even when the
client has gone (the session then raises at ``run``'s next boundary). A compute-only meta
runs like a hook, without a permit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import time
from collections.abc import Callable, Sequence

from reactantserver.core.buffer_pool import BufferPool
from reactantserver.core.errors import DeadlineExceededError, ReactantError
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.types import InferRequest, InferResponse
from reactantserver.worker.hooks import HookError, check_hook_output
from reactantserver.worker.meta.call import MetaCallSession
from reactantserver.worker.meta.gate import MetaGate
from reactantserver.worker.registry import MetaModel, ModelRegistry
from reactantserver.worker.scheduler import Scheduler
from reactantserver.worker.validation import order_tensors

__all__ = ["MetaRunner"]


def _run(
    meta: MetaModel,
    tensors: list[NamedTensor],
    session: MetaCallSession,
    scheduler: Scheduler,
) -> list[NamedTensor]:
    """Pool thread: ``run`` with its outputs checked; the scratch span is returned after.

    The scheduler is held meanwhile, so a shutdown drain still serves its later stages.
    """
    try:
        with scheduler.holding():
            result = meta.run(list(tensors), session)
        return session.detach(check_hook_output(meta.name, "run", result, meta.outputs))
    except ReactantError:
        raise  # sub-call errors keep their class (and status); InvalidArgumentError too
    except (Exception, SystemExit) as exc:
        raise HookError(f"run of meta '{meta.name}' raised {type(exc).__name__}: {exc}") from exc
    finally:
        session.close()


class MetaRunner:
    """Runs meta requests against one worker's registry, scheduler and hook pool."""

    def __init__(
        self,
        registry: ModelRegistry,
        scheduler: Scheduler,
        pool: concurrent.futures.Executor,
        *,
        gate: MetaGate,
        scratch: BufferPool | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.registry = registry
        self.scheduler = scheduler
        self.pool = pool
        self.gate = gate
        self.scratch = scratch
        self._clock = clock

    async def infer(self, meta: MetaModel, request: InferRequest) -> InferResponse:
        """Serve one request of ``meta``; raises a ``ReactantError`` subclass on failure."""
        deadline = request.deadline_ns
        if deadline is not None and self._clock() >= deadline:
            raise DeadlineExceededError(f"deadline exceeded before meta '{meta.name}' started")
        arrays = order_tensors(meta.inputs, request.inputs, model=meta.name)
        tensors = [NamedTensor(spec.name, a) for spec, a in zip(meta.inputs, arrays, strict=True)]
        session = MetaCallSession(
            meta,
            self.registry,
            self.scheduler,
            self.scratch,
            deadline_ns=deadline,
            priority=request.priority,
            clock=self._clock,
        )
        outputs = await self._execute(meta, tensors, session)
        self.scheduler.record_meta(meta.name, session.compute_ns)
        return InferResponse(
            model_name=meta.name, model_version="1", id=request.id, outputs=outputs
        )

    async def _execute(
        self, meta: MetaModel, tensors: Sequence[NamedTensor], session: MetaCallSession
    ) -> list[NamedTensor]:
        if meta.gated:
            await self.gate.acquire(session.deadline_ns, model=meta.name)
        context = contextvars.copy_context()
        try:
            future = self.pool.submit(
                context.run, _run, meta, list(tensors), session, self.scheduler
            )
        except BaseException:
            if meta.gated:
                self.gate.release()
            raise
        if meta.gated:
            # The permit is held until run has really returned, not until the client gave up.
            future.add_done_callback(lambda _: self.gate.release())
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            session.cancel()
            raise
