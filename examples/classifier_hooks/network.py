"""The executable part: normalised NCHW ``pixels`` f32[n,3,28,28] -> ``logits`` f32[n,10]."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["CLASSES", "SEED", "forward", "init_params"]

CLASSES = 10
SEED = 0
"""Default seed of the weights (nothing is downloaded)."""


def init_params(seed: int = SEED) -> dict[str, dict[str, np.ndarray[Any, Any]]]:
    """Weights from a fixed seed (He-scaled)."""
    rng = np.random.default_rng(seed)
    return {
        "conv": {
            "w": (rng.standard_normal((4, 3, 3, 3)) * np.sqrt(2.0 / 27)).astype(np.float32),
            "b": np.zeros(4, np.float32),
        },
        "dense": {
            "w": (rng.standard_normal((4, CLASSES)) * 0.5).astype(np.float32),
            "b": (rng.standard_normal(CLASSES) * 0.1).astype(np.float32),
        },
    }


def forward(params: dict[str, dict[str, Any]], pixels: Any) -> Any:
    """Logits f32[n, 10] for normalised ``pixels`` f32[n, 3, 28, 28]."""
    x = jax.lax.conv_general_dilated(
        pixels,
        params["conv"]["w"],
        window_strides=(2, 2),
        padding="SAME",
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
    )
    x = jax.nn.relu(x + params["conv"]["b"][None, :, None, None]).mean(axis=(2, 3))
    return x @ params["dense"]["w"] + params["dense"]["b"]
