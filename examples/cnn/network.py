"""The CNN as a JAX function with explicit weights, and its seeded parameters.

image [n,1,28,28] -> conv 3x3x8 + ReLU -> avg-pool 2 -> conv 3x3x16 + ReLU -> global mean
-> dense 10 -> logits [n,10]
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["CLASSES", "SEED", "forward", "init_params"]

CLASSES = 10
SEED = 0
"""Default seed of the weights (nothing is downloaded)."""

_LAYOUT = ("NCHW", "OIHW", "NCHW")


def init_params(seed: int = SEED) -> dict[str, dict[str, np.ndarray[Any, Any]]]:
    """Weights from a fixed seed (He-scaled)."""
    rng = np.random.default_rng(seed)

    def normal(shape: tuple[int, ...], fan_in: int) -> np.ndarray[Any, Any]:
        return np.asarray(rng.standard_normal(shape) * np.sqrt(2.0 / fan_in), np.float32)

    return {
        "conv1": {"w": normal((8, 1, 3, 3), 9), "b": np.zeros(8, np.float32)},
        "conv2": {"w": normal((16, 8, 3, 3), 72), "b": np.zeros(16, np.float32)},
        "dense": {"w": normal((16, CLASSES), 16), "b": np.zeros(CLASSES, np.float32)},
    }


def _conv(x: Any, layer: dict[str, Any]) -> Any:
    y = jax.lax.conv_general_dilated(
        x, layer["w"], window_strides=(1, 1), padding="SAME", dimension_numbers=_LAYOUT
    )
    return jax.nn.relu(y + layer["b"][None, :, None, None])


def forward(params: dict[str, dict[str, Any]], image: Any) -> Any:
    """Logits f32[n, 10] for ``image`` f32[n, 1, 28, 28]."""
    x = _conv(image, params["conv1"])
    n, c, h, w = x.shape
    x = x.reshape(n, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))
    x = _conv(x, params["conv2"])
    x = x.mean(axis=(2, 3))
    return x @ params["dense"]["w"] + params["dense"]["b"]
