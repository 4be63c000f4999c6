"""The two stages as JAX functions with explicit weights, and their seeded parameters.

``embed``: x f32[n,16] -> emb f32[n,8] (a backbone); ``score``: emb f32[n,8] -> score
f32[n,1] (a head).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = [
    "EMBED_DIM",
    "IN_FEATURES",
    "SEED",
    "embed",
    "init_embed_params",
    "init_score_params",
    "score",
]

IN_FEATURES = 16
EMBED_DIM = 8
SEED = 0
"""Default seed of the weights (nothing is downloaded)."""


def init_embed_params(seed: int = SEED) -> dict[str, np.ndarray[Any, Any]]:
    """Backbone weights from a fixed seed."""
    rng = np.random.default_rng(seed)
    return {
        "w": (rng.standard_normal((IN_FEATURES, EMBED_DIM)) / np.sqrt(IN_FEATURES)).astype(
            np.float32
        ),
        "b": (rng.standard_normal(EMBED_DIM) * 0.1).astype(np.float32),
    }


def init_score_params(seed: int = SEED) -> dict[str, np.ndarray[Any, Any]]:
    """Head weights from a fixed seed (a stream apart from the backbone's)."""
    rng = np.random.default_rng(seed + 1)
    return {
        "w": (rng.standard_normal((EMBED_DIM, 1)) / np.sqrt(EMBED_DIM)).astype(np.float32),
        "b": np.zeros(1, np.float32),
    }


def embed(params: dict[str, Any], x: Any) -> Any:
    """Embeddings f32[n, 8] for ``x`` f32[n, 16]."""
    return jax.numpy.tanh(x @ params["w"] + params["b"])


def score(params: dict[str, Any], emb: Any) -> Any:
    """Scores f32[n, 1] in (0, 1) for embeddings f32[n, 8]."""
    return jax.nn.sigmoid(emb @ params["w"] + params["b"])
