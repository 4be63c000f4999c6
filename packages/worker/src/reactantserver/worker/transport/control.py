"""The ``reactantserver.control.v1.WorkerControl`` service: residency, policy, compaction.

A control plane (the gateway, an operator) reads a snapshot of every model with
``ModelControlStatus`` and steers the worker with ``SetModelResidency`` (``explicit`` mode),
``SetModelPolicy`` (the live fair weight) and ``CompactMemory``. Everything that touches the
weight cache runs on the dispatch thread (a scheduler control command), which owns it::

    server = grpc.aio.server()
    add_control_service(server, state)      # when ``endpoints.control_service``
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import NoReturn, TypeVar

import attrs
import grpc

from reactantserver.core.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    ModelNotFoundError,
    ModelUnavailableError,
    ReactantError,
    ShuttingDownError,
    status_message,
)
from reactantserver.core.protocol import control_pb2, control_pb2_grpc
from reactantserver.core.serving import RpcRegistry
from reactantserver.worker.registry import ModelEntry, ModelState
from reactantserver.worker.repository.groups import (
    WEIGHTLESS,
    ModelWeights,
    group_weights,
    model_weights,
    set_group_residency,
)
from reactantserver.worker.repository.lifecycle import apply_residency
from reactantserver.worker.runtime.probe import ModelRuns, model_runs
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.runtime.weight_cache import WeightCache
from reactantserver.worker.scheduler import SHUTTING_DOWN, Scheduler, StatsSnapshot
from reactantserver.worker.state import Runtime, WorkerState

__all__ = ["WorkerControlService", "add_control_service"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

_TO_WIRE: Mapping[Residency, control_pb2.Residency.ValueType] = {
    Residency.UNPINNED: control_pb2.UNPINNED,
    Residency.PINNED_SYSTEM: control_pb2.PINNED_SYSTEM,
    Residency.PINNED_DEVICE: control_pb2.PINNED_DEVICE,
}
_FROM_WIRE: Mapping[int, Residency] = {int(wire): floor for floor, wire in _TO_WIRE.items()}

EXTERNALLY_MANAGED = "externally_managed"
SELF_MANAGED = "self_managed"


@attrs.frozen
class _CacheView:
    """A consistent snapshot of the weight cache for ``ModelControlStatus``."""

    models: Mapping[str, ModelWeights]
    budget: int
    load_bytes: int
    load_seconds: float
    pinned_bytes: int


def _cache_view(weights: WeightCache, names: Sequence[str]) -> _CacheView:
    """Snapshot ``names`` in the cache (dispatch thread only)."""
    models = {name: w for name in names if (w := model_weights(weights, name)) is not None}
    return _CacheView(
        models=models,
        budget=weights.budget if weights.enabled else 0,
        load_bytes=weights.load_bytes,
        load_seconds=weights.load_seconds,
        pinned_bytes=weights.pinned_bytes,
    )


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, text: str) -> NoReturn:
    await context.abort(code, text)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises


async def _answer(context: grpc.aio.ServicerContext, call: Awaitable[_T]) -> _T:
    """Await ``call``; translate its errors into the RPC status (once, here)."""
    try:
        return await call
    except ReactantError as exc:
        await _abort(context, exc.status, status_message(exc))
    except Exception as exc:
        _log.exception("control RPC failed")
        await _abort(context, grpc.StatusCode.INTERNAL, status_message(exc))


async def _on_dispatch(scheduler: Scheduler, fn: Callable[[], _T]) -> _T:
    """Run ``fn`` on the dispatch thread (between executions) and await its result."""
    return await asyncio.wrap_future(scheduler.control(fn))


class WorkerControlService(control_pb2_grpc.WorkerControlServicer):
    """``reactantserver.control.v1.WorkerControl`` over one worker's :class:`WorkerState`.

    Every RPC answers ``UNAVAILABLE`` while the worker is starting (no runtime yet) or shutting
    down. A meta is reported as one group; ``SetModelResidency`` on a meta
    moves every sub-model, ``SetModelPolicy`` takes regular models only.
    """

    def __init__(self, state: WorkerState) -> None:
        self._state = state

    # -- RPCs ------------------------------------------------------------------------------

    async def ModelControlStatus(
        self,
        request: control_pb2.ModelControlStatusRequest,
        context: grpc.aio.ServicerContext,
    ) -> control_pb2.ModelControlStatusResponse:
        """A snapshot of every visible ready model, with the worker's cache and policy."""
        del request
        return await _answer(context, self._status())

    async def SetModelResidency(
        self,
        request: control_pb2.SetModelResidencyRequest,
        context: grpc.aio.ServicerContext,
    ) -> control_pb2.SetModelResidencyResponse:
        """Move a model to a residency floor (``explicit`` mode with the cache on)."""
        return await _answer(context, self._set_residency(request.name, request.target))

    async def SetModelPolicy(
        self,
        request: control_pb2.SetModelPolicyRequest,
        context: grpc.aio.ServicerContext,
    ) -> control_pb2.SetModelPolicyResponse:
        """Set a model's live fair weight (when ``has_weight``)."""
        weight = request.weight if request.has_weight else None
        return await _answer(context, self._set_policy(request.name, weight))

    async def CompactMemory(
        self,
        request: control_pb2.CompactMemoryRequest,
        context: grpc.aio.ServicerContext,
    ) -> control_pb2.CompactMemoryResponse:
        """Free every on-demand device weight at once, then reload the listed models."""
        return await _answer(context, self._compact(list(request.reload_models)))

    # -- implementations -------------------------------------------------------------------

    async def _status(self) -> control_pb2.ModelControlStatusResponse:
        runtime = self._runtime()
        entries = [
            e
            for e in self._state.registry.visible()
            if e.state is ModelState.READY and e.manifest is not None
        ]
        names = sorted(
            {e.name for e in entries if e.meta is None}
            | {sub for e in entries if e.meta is not None for sub in e.meta.calls}
        )
        weights = runtime.weights
        view = await _on_dispatch(runtime.scheduler, lambda: _cache_view(weights, names))
        config = self._state.config
        return control_pb2.ModelControlStatusResponse(
            residency_mode=EXTERNALLY_MANAGED if self._state.explicit else SELF_MANAGED,
            discipline=str(runtime.scheduler.config.discipline.value),
            models=[
                _meta_status(runtime.scheduler, entry, self._state, view)
                if entry.meta is not None
                else _model_status(runtime.scheduler, entry, view)
                for entry in entries
            ],
            weight_cache_max_bytes=view.budget,
            weight_load_bytes_total=view.load_bytes,
            weight_load_seconds_total=view.load_seconds,
            worker_name=config.worker_name or "",
            device_kind=runtime.device_kind,
            pinned_bytes=view.pinned_bytes,
        )

    async def _set_residency(
        self, name: str, target_wire: int
    ) -> control_pb2.SetModelResidencyResponse:
        runtime = self._runtime()
        if not (runtime.weights.enabled and self._state.explicit):
            raise FailedPreconditionError(
                f"cannot set the residency of model '{name}': residency control needs "
                "model_control_mode 'explicit' and the on-demand weight cache"
            )
        target = _FROM_WIRE.get(target_wire)
        if target is None:
            raise InvalidArgumentError(
                f"invalid residency target {target_wire} for model '{name}'; expected "
                "UNPINNED, PINNED_SYSTEM or PINNED_DEVICE"
            )
        entry = self._state.registry.resolve(name)
        if entry.meta is not None:
            state = self._state
            group = await _on_dispatch(
                runtime.scheduler, lambda: set_group_residency(state, runtime, name, target)
            )
            return control_pb2.SetModelResidencyResponse(residency=_TO_WIRE[group])
        runs = None
        if target is Residency.PINNED_DEVICE and entry.loaded is not None:
            runs = model_runs(entry.loaded)
        result = await _on_dispatch(
            runtime.scheduler, lambda: _residency(runtime, name, target, runs)
        )
        return control_pb2.SetModelResidencyResponse(residency=_TO_WIRE[result])

    async def _set_policy(
        self, name: str, weight: float | None
    ) -> control_pb2.SetModelPolicyResponse:
        scheduler = self._runtime().scheduler
        self._regular(name)
        if weight is None:
            return control_pb2.SetModelPolicyResponse()
        if not (math.isfinite(weight) and weight > 0):
            raise InvalidArgumentError(
                f"weight of model '{name}' must be finite and > 0, got {weight!r}"
            )
        try:
            installed = scheduler.set_weight(name, weight)
        except ValueError as exc:
            raise InvalidArgumentError(f"model '{name}': {status_message(exc)}") from exc
        if not installed:
            raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found")
        _log.info("fair weight of %r set to %g", name, weight)
        return control_pb2.SetModelPolicyResponse()

    async def _compact(self, reload: list[str]) -> control_pb2.CompactMemoryResponse:
        runtime = self._runtime()
        names: list[str] = []
        for name in reload:  # every name first: an unknown one changes nothing
            entry = self._state.registry.find(name)
            names.extend(entry.meta.calls if entry.meta is not None else [name])
        reload = list(dict.fromkeys(names))  # a meta reloads its sub-models
        weights = runtime.weights

        def compact() -> tuple[int, int]:
            reloaded = weights.compact(reload)
            return reloaded, weights.resident_bytes

        reloaded, resident = await _on_dispatch(runtime.scheduler, compact)
        return control_pb2.CompactMemoryResponse(
            reloaded_models=reloaded, resident_bytes_after=resident
        )

    # -- helpers ---------------------------------------------------------------------------

    def _runtime(self) -> Runtime:
        if self._state.stopping:
            raise ShuttingDownError(SHUTTING_DOWN)
        runtime = self._state.runtime
        # Control commands run on the dispatch thread, which starts with the last boot step.
        if runtime is None or not self._state.started:
            raise ModelUnavailableError("worker is starting")
        return runtime

    def _regular(self, name: str) -> ModelEntry:
        """The READY regular model ``name``: ``NOT_FOUND`` / ``UNAVAILABLE`` otherwise."""
        entry = self._state.registry.resolve(name)
        if entry.manifest is not None and entry.manifest.is_meta:
            raise ModelNotFoundError(f"model '{name}' is a meta model; this RPC takes models only")
        return entry


def _residency(runtime: Runtime, name: str, target: Residency, runs: ModelRuns | None) -> Residency:
    result = apply_residency(runtime, name, target, runs)
    return WEIGHTLESS.residency if result is None else result


def _model_status(
    scheduler: Scheduler, entry: ModelEntry, view: _CacheView
) -> control_pb2.ModelStatus:
    name = entry.name
    manifest = entry.manifest
    assert manifest is not None
    scheduled = scheduler.model(name) or entry.scheduled
    stats = scheduler.stats(name) or StatsSnapshot()
    weights = view.models.get(name, WEIGHTLESS)
    return control_pb2.ModelStatus(
        name=name,
        residency=_TO_WIRE[weights.residency],
        device_resident=weights.device_resident,
        host_resident=weights.host_resident,
        weight_nbytes=weights.nbytes,
        weight=scheduled.weight if scheduled is not None else 1.0,
        queue_depth=stats.queue_depth,
        total_compute_seconds=stats.compute_seconds,
        requests_served=stats.requests_served,
        dispatch_count=stats.dispatch_count,
        max_batch_size=scheduled.max_batch if scheduled is not None else 0,
        batch_input_name=manifest.wire_batch_input,
        batch_axis=manifest.wire_batch_axis,  # already 1-based (0: no batch axis)
        rows_served=stats.rows_served,
        kind="model",
        sub_models=(),
        weight_loads=weights.loads,
    )


def _meta_status(
    scheduler: Scheduler, entry: ModelEntry, state: WorkerState, view: _CacheView
) -> control_pb2.ModelStatus:
    """A meta as one group: Σ footprint, AND of the flags, the least-resident floor."""
    meta = entry.meta
    assert meta is not None
    group = group_weights(state, entry, view.models.get)
    stats = scheduler.stats(entry.name) or StatsSnapshot()
    return control_pb2.ModelStatus(
        name=entry.name,
        residency=_TO_WIRE[group.residency],
        device_resident=group.device_resident,
        host_resident=group.host_resident,
        weight_nbytes=group.nbytes,
        weight=1.0,
        queue_depth=0,
        total_compute_seconds=stats.compute_seconds,
        requests_served=stats.requests_served,
        dispatch_count=stats.dispatch_count,
        max_batch_size=0,
        batch_input_name="",
        batch_axis=0,
        rows_served=stats.rows_served,
        kind="meta",
        sub_models=list(meta.calls),
        weight_loads=group.loads,
    )


def add_control_service(server: RpcRegistry, state: WorkerState) -> None:
    """Register :class:`WorkerControlService` on ``server`` (``endpoints.control_service``)."""
    control_pb2_grpc.add_WorkerControlServicer_to_server(WorkerControlService(state), server)
