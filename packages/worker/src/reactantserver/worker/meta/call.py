"""The ``call`` object a meta's ``run`` receives: committed sub-calls and scratch.

One :class:`MetaCallSession` exists per meta request and lives on the hook-pool thread that
runs ``run``. ``call(name, inputs)`` validates the inputs against the sub-model's client
spec, runs its ``preprocess`` on this thread, queues the request as a **committed**
sub-call (dispatched ahead of ordinary work), waits for it and runs ``postprocess``; the
arrays are passed by reference. Sub-calls of one request run one at a time, so each
in-flight meta has at most one pending sub-call::

    session = MetaCallSession(meta, registry, scheduler, scratch_pool, deadline_ns=deadline)
    try:
        outputs = meta.run(inputs, session)
    finally:
        session.close()          # returns the scratch span
    session.compute_ns           # wall time spent inside call(): the meta's compute

Boundaries: the deadline is checked before every ``call`` and ``scratch``, a cancelled
request raises at its next ``call`` or ``scratch`` (a sub-call already dispatched completes
and is discarded).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from reactantserver.core.buffer_pool import DEFAULT_ALIGN, BufferPool, Slot
from reactantserver.core.errors import DeadlineExceededError, ModelUnavailableError, ReactantError
from reactantserver.core.hooks import NamedTensor
from reactantserver.worker.hooks import HookError, run_postprocess, run_preprocess
from reactantserver.worker.registry import MetaModel, ModelEntry, ModelRegistry, ModelState
from reactantserver.worker.scheduler import FutureCompletion, Pending, Scheduler
from reactantserver.worker.validation import order_tensors

__all__ = ["MetaCallSession", "RequestCancelledError", "scratch_span"]

_log = logging.getLogger("reactantserver.worker.meta")

_Outputs = list[np.ndarray[Any, Any]]


class RequestCancelledError(ReactantError):
    """The meta request was cancelled (its client went away); raised at the next boundary."""

    status = grpc.StatusCode.CANCELLED


def _specs(shape: Any, dtype: npt.DTypeLike | None) -> tuple[list[tuple[Any, Any]], bool]:
    """``(specs, single)`` of ``scratch(shape, dtype)`` or ``scratch([(shape, dtype), ...])``."""
    if dtype is not None:
        return [(shape, dtype)], True
    try:
        specs = [(s, d) for s, d in shape]
    except (TypeError, ValueError):
        raise HookError(
            "call.scratch() takes (shape, dtype) or a list of (shape, dtype) pairs"
        ) from None
    return specs, False


def scratch_span(pool: BufferPool, specs: Sequence[tuple[Any, Any]]) -> int | None:
    """Slots to hold ``specs`` carved 64-byte aligned; ``None`` when larger than the pool."""
    total = DEFAULT_ALIGN  # the first piece may need padding to its alignment
    for shape, dtype in specs:
        dims = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
        nbytes = math.prod(int(d) for d in dims) * np.dtype(dtype).itemsize
        total += -(-nbytes // DEFAULT_ALIGN) * DEFAULT_ALIGN
    span = max(1, -(-total // pool.slot_nbytes))
    return span if span <= pool.n_slots else None


class MetaCallSession:
    """``call`` for one request of ``meta`` (implements ``reactantserver.core.hooks.MetaCall``)."""

    def __init__(
        self,
        meta: MetaModel,
        registry: ModelRegistry,
        scheduler: Scheduler,
        scratch_pool: BufferPool | None = None,
        *,
        deadline_ns: int | None = None,
        priority: int = 0,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.meta = meta
        self._registry = registry
        self._scheduler = scheduler
        self._pool = scratch_pool
        self._deadline_ns = deadline_ns
        self._priority = priority
        self._clock = clock
        self._one_at_a_time = threading.Lock()
        self._lock = threading.Lock()
        self._pending: Pending | None = None
        self._cancelled = False
        self._scratched = False
        self._slot: Slot | None = None
        self.compute_ns = 0
        """Wall time spent inside :meth:`__call__` (queueing and sub-model hooks included)."""
        self.calls = 0
        """Sub-calls made."""

    @property
    def deadline_ns(self) -> int | None:
        """The meta request's absolute deadline (``None``: none), passed to every sub-call."""
        return self._deadline_ns

    # -- boundaries ------------------------------------------------------------------------

    def cancel(self) -> None:
        """The request went away: withdraw a queued sub-call; later boundaries raise."""
        with self._lock:
            self._cancelled = True
            pending = self._pending
        if pending is not None:
            self._scheduler.cancel(pending)

    def _check(self, where: str) -> None:
        if self._cancelled:
            raise RequestCancelledError(f"meta '{self.meta.name}' was cancelled {where}")
        if self._deadline_ns is not None and self._clock() >= self._deadline_ns:
            raise DeadlineExceededError(f"deadline exceeded {where} of meta '{self.meta.name}'")

    # -- call ------------------------------------------------------------------------------

    def __call__(
        self,
        name: str,
        inputs: list[NamedTensor],
        *,
        requested_outputs: Sequence[str] | None = None,
    ) -> list[NamedTensor]:
        """Run sub-model ``name`` as a committed sub-call; its client outputs."""
        with self._one_at_a_time:
            self._check(f"before sub-call '{name}'")
            started = self._clock()
            try:
                return self._call(name, inputs, requested_outputs)
            finally:
                self.compute_ns += self._clock() - started
                self.calls += 1

    def _call(
        self, name: str, inputs: list[NamedTensor], requested: Sequence[str] | None
    ) -> list[NamedTensor]:
        meta = self.meta
        if name not in meta.calls:
            declared = ", ".join(meta.calls) or "none"
            raise HookError(
                f"meta '{meta.name}' called model '{name}', which is undeclared "
                f"(meta.calls: {declared})"
            )
        entry = self._sub_model(name)
        manifest, hooks = entry.manifest, entry.hooks
        assert manifest is not None
        wanted = self._requested(name, requested, [s.name for s in manifest.client_outputs])
        if not isinstance(inputs, Sequence) or not all(isinstance(t, NamedTensor) for t in inputs):
            raise HookError(
                f"meta '{meta.name}' passed {type(inputs).__name__} to sub-call '{name}'; "
                "expected a list of NamedTensor"
            )
        arrays = order_tensors(manifest.client_inputs, inputs, model=name)
        tensors = [
            NamedTensor(s.name, a) for s, a in zip(manifest.client_inputs, arrays, strict=True)
        ]
        if hooks.preprocess is not None:
            tensors = run_preprocess(name, hooks, tensors, manifest.executable_inputs)
        outputs = self._submit(name, tensors)
        named = [
            NamedTensor(spec.name, array)
            for spec, array in zip(manifest.executable_outputs, outputs, strict=True)
        ]
        named = run_postprocess(name, hooks, named, manifest.client_outputs)
        if wanted is None:
            return named
        by_name = {t.name: t for t in named}
        return [by_name[output] for output in wanted]

    def _sub_model(self, name: str) -> ModelEntry:
        entry = self._registry.get(name)
        if entry is None or entry.state is not ModelState.READY or entry.scheduled is None:
            state = "a meta model" if entry is not None and entry.is_meta else "not loaded"
            raise ModelUnavailableError(f"sub-model '{name}' of meta '{self.meta.name}' is {state}")
        return entry

    def _requested(
        self, name: str, requested: Sequence[str] | None, declared: list[str]
    ) -> list[str] | None:
        if requested is None:
            return None
        wanted = list(requested)
        for output in wanted:
            if output not in declared:
                raise HookError(
                    f"meta '{self.meta.name}' requested unknown output '{output}' of "
                    f"sub-model '{name}' (outputs: {', '.join(declared)})"
                )
        return wanted

    def _submit(self, name: str, tensors: list[NamedTensor]) -> _Outputs:
        completion = FutureCompletion()
        with self._lock:
            if self._cancelled:
                raise RequestCancelledError(f"meta '{self.meta.name}' was cancelled")
            self._pending = self._scheduler.submit(
                name,
                tensors,
                completion=completion,
                deadline_ns=self._deadline_ns,
                priority=self._priority,
                committed=True,
            )
        pending = self._pending
        timeout = None
        if self._deadline_ns is not None:
            timeout = max(0.0, (self._deadline_ns - self._clock()) / 1e9)
        try:
            return completion.future.result(timeout)
        except concurrent.futures.TimeoutError:
            if self._scheduler.cancel(pending):
                raise DeadlineExceededError(
                    f"deadline exceeded waiting for sub-call '{name}' of meta '{self.meta.name}'"
                ) from None
            return completion.future.result()  # already dispatched: it completes
        except (asyncio.CancelledError, concurrent.futures.CancelledError):
            # Scheduler.cancel fails a withdrawn request with asyncio.CancelledError.
            raise RequestCancelledError(
                f"meta '{self.meta.name}' was cancelled during sub-call '{name}'"
            ) from None
        finally:
            with self._lock:
                self._pending = None

    # -- scratch ---------------------------------------------------------------------------

    def scratch(self, shape: Any, dtype: npt.DTypeLike | None = None) -> Any:
        """Buffers from the worker's scratch pool (one call per request), else plain arrays."""
        self._check("before scratch")
        if self._scratched:
            raise HookError(
                f"call.scratch() may be called at most once per request of meta "
                f"'{self.meta.name}'; request every buffer in one call"
            )
        self._scratched = True
        specs, single = _specs(shape, dtype)
        try:
            arrays = self._arrays(specs)
        except (TypeError, ValueError) as exc:
            raise HookError(f"call.scratch() of meta '{self.meta.name}': {exc}") from exc
        return arrays[0] if single else arrays

    def _arrays(self, specs: list[tuple[Any, Any]]) -> list[np.ndarray[Any, Any]]:
        pool = self._pool
        span = None if pool is None else scratch_span(pool, specs)
        if pool is None or span is None:
            if pool is not None and not self.meta.warned_oversize:
                self.meta.warned_oversize = True
                _log.warning(
                    "scratch request of meta %r is larger than the whole scratch pool "
                    "(%d bytes); using plain arrays",
                    self.meta.name,
                    pool.nbytes,
                )
            return [np.empty(s, np.dtype(d)) for s, d in specs]
        slot = pool.acquire(span, self._deadline_ns)  # PoolAcquireTimeout: DEADLINE_EXCEEDED
        self._slot = slot
        return slot.scratch(specs)

    def detach(self, tensors: list[NamedTensor]) -> list[NamedTensor]:
        """``tensors`` with a private copy of any that views the scratch span (``run`` returned
        a scratch buffer, which goes back to the pool before the response is encoded)."""
        slot = self._slot
        if slot is None:
            return tensors
        span = np.frombuffer(slot.buffer, np.uint8)
        return [
            NamedTensor(t.name, t.data.copy()) if np.may_share_memory(t.data, span) else t
            for t in tensors
        ]

    def close(self) -> None:
        """Return the scratch span (``run`` has returned or raised)."""
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()
