"""The arithmetic of the ``fair`` discipline.

Each regular model has a decaying EMA of the compute it used recently; its fair priority is
how far that EMA's normalised share falls below the model's configured share, clamped, per
second of the batch it would run now::

    load = RecentLoad(halflife_s=30.0)
    load.add("resnet", 0.012, now_ns)
    p = fair_priority(share=0.5, nema=0.2, cost=0.012, requests=4, cap=0.25, discount=0.1)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

__all__ = ["DEFAULT_COST_S", "MIN_COST_S", "RecentLoad", "decay", "fair_priority", "shares"]

DEFAULT_COST_S = 0.01
"""The cost of a batch size that was never measured (seconds)."""

MIN_COST_S = 1e-9
"""Floor on an effective cost, so a measured 0 cannot divide by zero."""

_LN2 = math.log(2.0)
_NS = 1e-9


def decay(ema: float, elapsed_s: float, halflife_s: float) -> float:
    """``ema`` decayed over ``elapsed_s`` seconds: halved every ``halflife_s``."""
    if elapsed_s <= 0.0 or ema == 0.0:
        return ema
    return ema * math.exp(-elapsed_s * _LN2 / halflife_s)


def fair_priority(
    *,
    share: float,
    nema: float,
    cost: float,
    requests: int,
    cap: float,
    discount: float,
) -> float:
    """``clamp(share - nema, -cap, cap) / eff_cost``; higher runs first.

    ``eff_cost`` is ``cost * (1 - discount)`` when the plan merges ``requests >= 2``,
    else ``cost``.
    """
    effective = cost * (1.0 - discount) if requests >= 2 else cost
    deficit = min(max(share - nema, -cap), cap)
    return deficit / max(effective, MIN_COST_S)


def shares(weights: Mapping[str, float]) -> dict[str, float]:
    """Each model's configured share of compute: ``weight / sum(weights)``."""
    total = sum(weights.values())
    if total <= 0.0:
        return dict.fromkeys(weights, 0.0)
    return {name: w / total for name, w in weights.items()}


class RecentLoad:
    """Per-model EMA of recent compute seconds, decayed lazily to the time it is read."""

    def __init__(self, halflife_s: float) -> None:
        if halflife_s <= 0.0:
            raise ValueError(f"halflife must be > 0, got {halflife_s}")
        self.halflife_s = halflife_s
        self._ema: dict[str, tuple[float, int]] = {}

    def value(self, name: str, now_ns: int) -> float:
        """The EMA of ``name`` decayed to ``now_ns`` (0 for a model never dispatched)."""
        ema, since = self._ema.get(name, (0.0, now_ns))
        return decay(ema, (now_ns - since) * _NS, self.halflife_s)

    def add(self, name: str, seconds: float, now_ns: int) -> float:
        """Decay ``name`` to ``now_ns``, then add ``seconds``; returns the new EMA."""
        ema = self.value(name, now_ns) + seconds
        self._ema[name] = (ema, now_ns)
        return ema

    def normalised(self, names: Iterable[str], now_ns: int) -> dict[str, float]:
        """``ema_m / sum(ema)`` over ``names`` at ``now_ns`` (all 0 when the sum is 0)."""
        values = {name: self.value(name, now_ns) for name in names}
        total = sum(values.values())
        if total <= 0.0:
            return dict.fromkeys(values, 0.0)
        return {name: v / total for name, v in values.items()}

    def forget(self, name: str) -> None:
        """Drop a model's history (it was unloaded)."""
        self._ema.pop(name, None)

    def rename(self, old: str, new: str) -> None:
        """Move ``old``'s history to ``new`` (a rename in place)."""
        if old in self._ema:
            self._ema[new] = self._ema.pop(old)
