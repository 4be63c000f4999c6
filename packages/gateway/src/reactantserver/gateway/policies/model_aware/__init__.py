"""The ``model_aware`` policy: the pure latency estimate (:mod:`.estimate`) and its glue."""

from __future__ import annotations

from reactantserver.gateway.policies.model_aware.estimate import (
    ModelAwareKnobs,
    ModelAwareRouter,
    ModelResidency,
    Route,
)

__all__ = ["ModelAwareKnobs", "ModelAwareRouter", "ModelResidency", "Route"]
