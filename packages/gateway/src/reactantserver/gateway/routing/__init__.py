"""Routing policies of the gateway: pure decision logic, no I/O (08 §Policy)."""

from __future__ import annotations

__all__: list[str] = []
