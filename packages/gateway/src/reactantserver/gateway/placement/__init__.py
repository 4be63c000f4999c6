"""Placement of models on workers: the pure packing behind the ``lpt_packing`` policy (08)."""

from __future__ import annotations

__all__: list[str] = []
