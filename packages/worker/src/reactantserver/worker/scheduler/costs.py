"""Learned per-(model, batch size) execution costs.

``cost <- alpha * t + (1 - alpha) * cost``; the first measurement (or a start-up seed)
replaces the 0.01 s default. ``t`` covers input transfer, execution and output transfer of
one dispatch, never weight loading.
"""

from __future__ import annotations

from collections.abc import Mapping

from reactantserver.worker.runtime.probe import RunKey
from reactantserver.worker.scheduler.fair import DEFAULT_COST_S

__all__ = ["CostTable"]


class CostTable:
    """EMA cost estimates in seconds, keyed by ``(model, batch)`` (batch 0: unbatched/meta)."""

    def __init__(self, alpha: float = 0.2, default: float = DEFAULT_COST_S) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.default = default
        self._costs: dict[tuple[str, int], float] = {}
        self._versions: dict[str, int] = {}

    def version(self, model: str) -> int:
        """A number that changes whenever any estimate of ``model`` changes (plan memos)."""
        return self._versions.get(model, 0)

    def _touch(self, model: str) -> None:
        self._versions[model] = self._versions.get(model, 0) + 1

    def get(self, model: str, batch: int) -> float:
        """The estimate for ``(model, batch)``; the default when never measured."""
        return self._costs.get((model, batch), self.default)

    def measured(self, model: str, batch: int) -> float | None:
        """The estimate when it was measured or seeded, else ``None``."""
        return self._costs.get((model, batch))

    def record(self, model: str, batch: int, seconds: float) -> float:
        """Fold one measurement in; returns the new estimate."""
        key = (model, batch)
        old = self._costs.get(key)
        new = seconds if old is None else self.alpha * seconds + (1.0 - self.alpha) * old
        self._costs[key] = new
        self._touch(model)
        return new

    def seed(self, costs: Mapping[RunKey, float]) -> None:
        """Install start-up measurements; several variants of one size keep the largest."""
        seeds: dict[tuple[str, int], float] = {}
        for key, seconds in costs.items():
            slot = (key.model, key.batch)
            seeds[slot] = max(seconds, seeds.get(slot, 0.0))
        self._costs.update(seeds)
        for model, _batch in seeds:
            self._touch(model)

    def of_model(self, model: str) -> dict[int, float]:
        """Every known estimate of ``model``, by batch size."""
        return {b: c for (m, b), c in self._costs.items() if m == model}

    def rename(self, old: str, new: str) -> None:
        """Move every estimate of ``old`` to ``new`` (a rename in place)."""
        for model, batch in [k for k in self._costs if k[0] == old]:
            self._costs[(new, batch)] = self._costs.pop((model, batch))
        self._touch(old)
        self._touch(new)

    def forget(self, model: str) -> None:
        """Drop every estimate of ``model``."""
        for key in [k for k in self._costs if k[0] == model]:
            del self._costs[key]
        self._touch(model)
