"""Routing policies of the gateway: pure decision logic, no I/O (08 §Policy)."""

from __future__ import annotations

from reactantserver.gateway.routing.model_aware import (
    ModelAwareKnobs,
    ModelAwareRouter,
    ModelResidency,
    Route,
)

__all__ = ["ModelAwareKnobs", "ModelAwareRouter", "ModelResidency", "Route"]
