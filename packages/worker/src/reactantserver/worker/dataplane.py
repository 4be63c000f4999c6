"""The worker's data plane: one decoded request in, one response out, no transport in sight.

The gRPC (and later REST) handlers decode a wire message into an
:class:`~reactantserver.core.types.InferRequest`, call :meth:`DataPlane.infer`, and encode
the :class:`~reactantserver.core.types.InferResponse`; every failure is a
:class:`~reactantserver.core.errors.ReactantError` carrying its status::

    plane = DataPlane(registry, scheduler, pool, limiter=InflightLimiter(64), metas=runner)
    response = await plane.infer(request)

Requests for a meta model go to its :class:`~reactantserver.worker.meta.MetaRunner` after
the common checks (deadline, requested outputs).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence

import attrs

from reactantserver.core.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    ModelUnavailableError,
)
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.manifest import Manifest
from reactantserver.core.types import InferRequest, InferResponse, OutputRequest
from reactantserver.worker.hooks import run_in_pool, run_postprocess, run_preprocess
from reactantserver.worker.meta import MetaRunner
from reactantserver.worker.registry import NOT_RESIDENT_REASON, ModelEntry, ModelRegistry
from reactantserver.worker.scheduler.limits import InflightLimiter
from reactantserver.worker.scheduler.queue import TraceMarks
from reactantserver.worker.scheduler.scheduler import Scheduler
from reactantserver.worker.validation import order_tensors

__all__ = ["DataPlane", "RequestStats"]


@attrs.define
class RequestStats:
    """Handler-level outcomes of one model's requests (``ModelStatistics`` success/fail).

    The data plane updates its own record in place under its lock and hands out copies.
    """

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    last_inference_ms: int = 0
    """Milliseconds since the Unix epoch of the last completed request (0: none yet)."""


class DataPlane:
    """Admission checks, hooks and the scheduler round trip of regular models."""

    def __init__(
        self,
        registry: ModelRegistry,
        scheduler: Scheduler,
        pool: concurrent.futures.Executor,
        *,
        limiter: InflightLimiter | None = None,
        metas: MetaRunner | None = None,
        unavailable: Callable[[ModelEntry], str | None] = lambda entry: None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.registry = registry
        #: Why a READY entry does not serve now (``None``: it does): the worker state's rule
        #: (explicit mode's residency, a meta's sub-models).
        self._unavailable = unavailable
        self.metas = metas
        self.scheduler = scheduler
        self.pool = pool
        self.limiter = limiter or InflightLimiter(0)
        self._clock = clock
        self._lock = threading.Lock()
        self._stats: dict[str, RequestStats] = {}

    def request_stats(self, name: str) -> RequestStats:
        """Cumulative handler outcomes of ``name``."""
        with self._lock:
            counts = self._stats.get(name)
            return attrs.evolve(counts) if counts is not None else RequestStats()

    async def infer(self, request: InferRequest, trace: TraceMarks | None = None) -> InferResponse:
        """Serve one request; raises a ``ReactantError`` subclass on any failure.

        The request's model is resolved here, once on the request path: ``NOT_FOUND`` for an
        unknown name or version, ``UNAVAILABLE`` for one that does not serve now. Then the
        in-flight cap is taken (``RESOURCE_EXHAUSTED`` at once when full; the transports check
        it before decoding too, so a full worker refuses cheaply). ``trace`` receives the
        scheduler's marks of a traced request (regular models only).
        """
        name = request.model_name
        entry = self.registry.resolve(name, request.model_version)
        reason = self._unavailable(entry)
        if reason is not None:
            raise ModelUnavailableError(f"model '{entry.name}' is {_unready(reason)}")
        with self.limiter.slot():
            started = self._clock()
            ok = False
            try:
                response = await self._infer(entry, request, trace)
                ok = True
                return response
            finally:
                self._record(name, self._clock() - started, ok=ok)

    async def _infer(
        self, entry: ModelEntry, request: InferRequest, trace: TraceMarks | None
    ) -> InferResponse:
        manifest = entry.manifest
        if manifest is None or not entry.installed:
            raise ModelUnavailableError(f"model '{entry.name}' is not servable")
        if request.deadline_ns is not None and self._clock() >= request.deadline_ns:
            raise DeadlineExceededError(f"deadline exceeded before model '{entry.name}' ran")
        _check_requested(manifest, request.outputs)
        if entry.meta is not None:
            if self.metas is None:
                raise ModelUnavailableError(f"meta model '{entry.name}' is not served here")
            return await self.metas.infer(entry.meta, request)
        hooks = entry.hooks
        tensors: list[NamedTensor] = request.inputs
        if hooks.preprocess is not None or manifest.client_inputs != manifest.executable_inputs:
            # Client tensors differ from the executable's: check them against the client
            # specs here. Otherwise the scheduler's own check at admission is the same one.
            arrays = order_tensors(manifest.client_inputs, request.inputs, model=entry.name)
            tensors = [
                NamedTensor(spec.name, array)
                for spec, array in zip(manifest.client_inputs, arrays, strict=True)
            ]
        if hooks.preprocess is not None:
            tensors = await run_in_pool(
                self.pool,
                run_preprocess,
                entry.name,
                hooks,
                tensors,
                manifest.executable_inputs,
            )
        outputs = await self.scheduler.infer(
            entry.name,
            tensors,
            deadline_ns=request.deadline_ns,
            priority=request.priority,
            trace=trace,
        )
        named = [
            NamedTensor(spec.name, array)
            for spec, array in zip(manifest.executable_outputs, outputs, strict=True)
        ]
        if hooks.postprocess is not None:
            named = await run_in_pool(
                self.pool,
                run_postprocess,
                entry.name,
                hooks,
                named,
                manifest.client_outputs,
            )
        return InferResponse(model_name=entry.name, model_version="1", id=request.id, outputs=named)

    def _record(self, name: str, elapsed_ns: int, *, ok: bool) -> None:
        with self._lock:
            counts = self._stats.get(name)
            if counts is None:
                # Only registry names get a record: clients cannot mint them.
                if self.registry.get(name) is None:
                    return
                counts = self._stats[name] = RequestStats()
            if ok:
                counts.success_count += 1
                counts.success_ns += elapsed_ns
                counts.last_inference_ms = time.time_ns() // 1_000_000
            else:
                counts.fail_count += 1
                counts.fail_ns += elapsed_ns


def _check_requested(manifest: Manifest, requested: Sequence[OutputRequest]) -> None:
    """Requested outputs must be declared client outputs, each named once (before any work)."""
    declared = {spec.name for spec in manifest.client_outputs}
    seen: set[str] = set()
    for output in requested:
        if output.name not in declared:
            raise InvalidArgumentError(
                f"unknown requested output '{output.name}' for model '{manifest.name}'"
            )
        if output.name in seen:
            raise InvalidArgumentError(
                f"output '{output.name}' of model '{manifest.name}' is requested more than once"
            )
        seen.add(output.name)


def _unready(reason: str) -> str:
    """``not resident …`` reads as is; other reasons follow "unavailable: "."""
    if reason == NOT_RESIDENT_REASON:
        return "not resident (explicit mode); pin it first"
    return reason if reason.startswith("not resident") else f"unavailable: {reason}"
