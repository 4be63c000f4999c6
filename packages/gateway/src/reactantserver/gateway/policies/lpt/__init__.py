"""Placement of models on workers: the pure logic behind the ``lpt_packing`` policy (08)."""

from __future__ import annotations

from reactantserver.gateway.policies.knobs import KnobError, SchedulingKnobs
from reactantserver.gateway.policies.lpt.fill import (
    FillPlan,
    ReplicaRoute,
    ReplicaRouter,
    resolve_fill_plan,
)
from reactantserver.gateway.policies.lpt.overrides import ModelOverride, apply_placement_request
from reactantserver.gateway.policies.lpt.packing import (
    Assignment,
    ModelDemand,
    ModelPlacement,
    PlacementChange,
    WorkerBudget,
    compute_assignment,
    placement_change,
)
from reactantserver.gateway.policies.routing_meta import MetaSnapshot, RoutingMeta, request_weight

__all__ = [
    "Assignment",
    "FillPlan",
    "KnobError",
    "MetaSnapshot",
    "ModelDemand",
    "ModelOverride",
    "ModelPlacement",
    "PlacementChange",
    "ReplicaRoute",
    "ReplicaRouter",
    "RoutingMeta",
    "SchedulingKnobs",
    "WorkerBudget",
    "apply_placement_request",
    "compute_assignment",
    "placement_change",
    "request_weight",
    "resolve_fill_plan",
]
