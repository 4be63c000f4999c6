"""The MLP as a JAX function with explicit weights, and its seeded parameters."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["HIDDEN", "IN_FEATURES", "OUT_CLASSES", "SEED", "forward", "init_params"]

IN_FEATURES = 16
HIDDEN = 32
OUT_CLASSES = 4
SEED = 0
"""Default seed of the weights (nothing is downloaded)."""


def init_params(seed: int = SEED) -> dict[str, dict[str, np.ndarray[Any, Any]]]:
    """Weights from a fixed seed, scaled like a He initialisation."""
    rng = np.random.default_rng(seed)

    def dense(fan_in: int, fan_out: int) -> dict[str, np.ndarray[Any, Any]]:
        scale = np.sqrt(2.0 / fan_in)
        return {
            "w": (rng.standard_normal((fan_in, fan_out)) * scale).astype(np.float32),
            "b": (rng.standard_normal(fan_out) * 0.1).astype(np.float32),
        }

    return {"hidden": dense(IN_FEATURES, HIDDEN), "out": dense(HIDDEN, OUT_CLASSES)}


def forward(params: dict[str, dict[str, Any]], x: Any) -> Any:
    """Logits f32[n, 4] for ``x`` f32[n, 16]."""
    h = jax.nn.relu(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return h @ params["out"]["w"] + params["out"]["b"]
