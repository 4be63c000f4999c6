"""``GatewayControl`` for ``lpt_packing``: status, live knobs, per-model placement, repack.

Functions over the running policy as :class:`LptControlled` describes it
(:class:`~reactantserver.gateway.policies.lpt.policy.LptPolicy`); the policy's methods delegate
here so the control plane stays apart from the hot path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import attrs
import grpc

from reactantserver.core.protocol import control_pb2
from reactantserver.gateway.policies.knobs import (
    INFLIGHT_HAZARD,
    SchedulingKnobs,
    apply_policy_request,
    to_proto,
    validate_repack_wait,
)
from reactantserver.gateway.policies.lpt.fill import FillPlan, ReplicaRouter
from reactantserver.gateway.policies.lpt.overrides import (
    ModelOverride,
    apply_placement_request,
    fill_quantum,
)
from reactantserver.gateway.policies.lpt.packing import ModelPlacement
from reactantserver.gateway.policies.routing_meta import MetaSnapshot, RoutingMeta
from reactantserver.gateway.transport.proxy import ForwardError
from reactantserver.gateway.workers.link import WorkerLink

__all__ = [
    "LptControlled",
    "RepackRecord",
    "repack",
    "scheduling_status",
    "set_model_placement",
    "set_scheduling_policy",
]

_POLL_S = 0.05


@attrs.define
class RepackRecord:
    """What the last repack did, for ``GetSchedulingStatus`` (``RepackStatus``)."""

    unix_seconds: float = 0.0
    wall_elapsed: float = 0.0
    compute_seconds: float = 0.0
    trigger: str = "none"
    models_placed: int = 0
    models_moved: int = 0
    count: int = 0


class LptControlled(Protocol):
    """The running ``lpt_packing`` policy as operator control reads and sets it.

    ``knobs``, ``overrides`` and ``operator_requested`` are written here; the rest is read.
    ``wake`` runs the next prober round now (an operator repack).
    """

    mode: str
    knobs: SchedulingKnobs
    overrides: Mapping[str, ModelOverride]
    links: list[WorkerLink]
    labels: dict[str, str]
    meta: RoutingMeta
    router: ReplicaRouter
    placement: dict[str, ModelPlacement]
    drifted: frozenset[str]
    utilization: dict[str, float]
    arrival_rate: dict[str, float]
    cost_per_request: dict[str, float]
    compute_accum: float
    first_tick_repack_done: bool
    repacks_since_compaction: int
    operator_requested: int
    operator_completed: int
    last: RepackRecord
    last_tick_unix: float
    ready_workers: int
    assigned_bytes: dict[str, int]
    budgets: dict[str, int]
    wake: Callable[[], None]

    def fill_plans(self, snapshot: MetaSnapshot) -> dict[str, FillPlan]:
        """Every reported or overridden model's fill plan under the current knobs."""


def _configured(policy: LptControlled, name: str) -> int:
    override = policy.overrides.get(name)
    if override is None or override.replicas is None:
        return 0
    return -1 if override.replicas == "all" else int(override.replicas)


def _repack_status(policy: LptControlled) -> control_pb2.RepackStatus:
    last = policy.last
    return control_pb2.RepackStatus(
        last_repack_unix_seconds=last.unix_seconds,
        last_repack_wall_elapsed_seconds=last.wall_elapsed,
        last_repack_compute_seconds=last.compute_seconds,
        last_trigger=last.trigger,
        last_models_placed=last.models_placed,
        last_models_moved=last.models_moved,
        repack_count=last.count,
        compute_accumulated_seconds=policy.compute_accum,
        active_threshold_seconds=policy.knobs.active_threshold(policy.first_tick_repack_done),
        first_tick_repack_done=policy.first_tick_repack_done,
        last_tick_unix_seconds=policy.last_tick_unix,
        repacks_since_compaction=policy.repacks_since_compaction,
        operator_repacks_requested=policy.operator_requested,
        operator_repacks_completed=policy.operator_completed,
    )


def _warnings(policy: LptControlled) -> list[str]:
    warnings = [f"model {name} is drifted (not on every worker)" for name in sorted(policy.drifted)]
    inflight = policy.knobs.routing_fill_mode == "inflight" or any(
        o.fill_mode == "inflight" for o in policy.overrides.values()
    )
    if inflight:
        warnings.append(INFLIGHT_HAZARD)
    return warnings


def scheduling_status(policy: LptControlled) -> control_pb2.GetSchedulingStatusResponse:
    """``GetSchedulingStatus`` under ``lpt_packing``."""
    snapshot = policy.meta.snapshot
    response = control_pb2.GetSchedulingStatusResponse(
        mode=policy.mode,
        policy=to_proto(policy.knobs),
        repack=_repack_status(policy),
        warnings=_warnings(policy),
    )
    for name in sorted({*snapshot.models, *policy.placement, *policy.overrides}):
        meta = snapshot.models.get(name)
        placed = policy.placement.get(name)
        plan = policy.router.plan(name)
        status = response.models.add(
            name=name,
            configured_replicas=_configured(policy, name),
            effective_replicas=len(placed.workers) if placed else 0,
            utilization=policy.utilization.get(name, 0.0),
            arrival_rate=policy.arrival_rate.get(name, 0.0),
            cost_seconds=policy.cost_per_request.get(name, 0.0),
            max_batch=meta.max_batch if meta else 0,
            fill_mode=plan.mode,
            fill_quantum=plan.quantum,
            weight_nbytes=meta.weight_nbytes if meta else 0,
            placed=placed is not None and name not in policy.drifted,
            drifted=name in policy.drifted,
        )
        if placed is not None:
            for worker, weight in zip(placed.workers, placed.weights, strict=True):
                status.replicas.add(
                    worker=policy.labels.get(worker, worker),
                    weight=weight,
                    outstanding=policy.router.outstanding(name, worker),
                    routed_total=policy.router.routed_total(name, worker),
                )
    for link in policy.links:
        assigned = policy.assigned_bytes.get(link.url, 0)
        budget = policy.budgets.get(link.url, 0)
        response.workers.add(
            worker=link.label,
            ready=link.ready,
            models_placed=sum(1 for p in policy.placement.values() if link.url in p.workers),
            inflight_compute=policy.router.worker_load(link.url),
            assigned_weight_bytes=assigned,
            weight_budget_bytes=budget,
            oversubscribed=budget > 0 and assigned > budget,
        )
    return response


def set_scheduling_policy(
    policy: LptControlled, request: control_pb2.SetSchedulingPolicyRequest
) -> control_pb2.SetSchedulingPolicyResponse:
    """``SetSchedulingPolicy``: validate all-or-nothing, swap the knobs, republish plans."""
    knobs, warnings = apply_policy_request(
        policy.knobs,
        request,
        mode=policy.mode,
        compute_accumulated=policy.compute_accum,
        first_repack_done=policy.first_tick_repack_done,
    )
    policy.knobs = knobs
    policy.router.set_routing_policy(knobs.routing_policy)
    policy.router.set_plans(policy.fill_plans(policy.meta.snapshot))
    return control_pb2.SetSchedulingPolicyResponse(
        applied=to_proto(knobs), warnings=warnings, persisted=False
    )


def set_model_placement(
    policy: LptControlled, request: control_pb2.SetModelPlacementRequest
) -> control_pb2.SetModelPlacementResponse:
    """``SetModelPlacement``: store the override, republish fill plans (replicas: next repack)."""
    snapshot = policy.meta.snapshot
    known = {*snapshot.models, *policy.placement}
    result = apply_placement_request(
        policy.overrides,
        request,
        known_models=known,
        ready_workers=policy.ready_workers,
        knobs=policy.knobs,
    )
    policy.overrides = dict(result.overrides)
    policy.router.set_plans(policy.fill_plans(snapshot))
    meta = snapshot.models.get(result.name)
    max_batch = meta.max_batch if meta is not None else 0
    extra: list[str] = []
    if meta is not None and result.effective_replicas > 0:
        caps = sorted(
            (cap - policy.assigned_bytes.get(url, 0), url)
            for url, cap in policy.budgets.items()
            if cap > 0
        )
        chosen = caps[-result.effective_replicas :]
        if chosen and any(free < meta.weight_nbytes for free, _ in chosen):
            extra.append(
                f"model {result.name} ({meta.weight_nbytes} bytes) may oversubscribe the memory "
                f"of the least-loaded {result.effective_replicas} worker(s)"
            )
    return result.to_response(fill_quantum(result.fill_factor, max_batch), extra)


async def repack(
    policy: LptControlled, request: control_pb2.RepackRequest
) -> control_pb2.RepackResponse:
    """``Repack``: ask the prober for an operator repack and wait (bounded) until it ran."""
    wait, warnings = validate_repack_wait(request.wait_seconds)
    if wait > 0 and not any(link.ready for link in policy.links):
        raise ForwardError(grpc.StatusCode.UNAVAILABLE, "no ready worker to repack")
    policy.operator_requested += 1
    sequence = policy.operator_requested
    policy.wake()
    started = time.monotonic()
    while wait > 0 and policy.operator_completed < sequence:
        if time.monotonic() - started >= wait:
            break
        await asyncio.sleep(_POLL_S)
    return control_pb2.RepackResponse(
        sequence=sequence,
        completed_sequence=policy.operator_completed,
        completed=policy.operator_completed >= sequence,
        waited_seconds=time.monotonic() - started,
        repack=_repack_status(policy),
        warnings=warnings,
    )
