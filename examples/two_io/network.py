"""Two inputs, two outputs: ``sum = a + scale * b`` and ``dot = (a * b) @ proj``."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["FEATURES", "SEED", "forward", "init_params"]

FEATURES = 8
SEED = 0
"""Default seed of the weights (nothing is downloaded)."""


def init_params(seed: int = SEED) -> dict[str, np.ndarray[Any, Any]]:
    """Weights from a fixed seed: a per-feature ``scale`` and a projection ``proj``."""
    rng = np.random.default_rng(seed)
    return {
        "scale": rng.uniform(0.5, 1.5, FEATURES).astype(np.float32),
        "proj": (rng.standard_normal((FEATURES, 1)) / np.sqrt(FEATURES)).astype(np.float32),
    }


def forward(params: dict[str, Any], a: Any, b: Any) -> tuple[Any, Any]:
    """``(sum f32[n, 8], dot f32[n, 1])`` for ``a``, ``b`` f32[n, 8], in that order."""
    return a + params["scale"] * b, (a * b) @ params["proj"]
