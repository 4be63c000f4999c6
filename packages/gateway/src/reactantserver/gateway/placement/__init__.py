"""Placement of models on workers: the pure logic behind the ``lpt_packing`` policy (08)."""

from __future__ import annotations

from reactantserver.gateway.placement.fill import (
    FillPlan,
    ReplicaRoute,
    ReplicaRouter,
    resolve_fill_plan,
)
from reactantserver.gateway.placement.knobs import KnobError, SchedulingKnobs
from reactantserver.gateway.placement.lpt import (
    Assignment,
    ModelDemand,
    ModelPlacement,
    PlacementChange,
    WorkerBudget,
    compute_assignment,
    placement_change,
)
from reactantserver.gateway.placement.meta import MetaSnapshot, RoutingMeta, request_weight
from reactantserver.gateway.placement.overrides import ModelOverride, apply_placement_request

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
