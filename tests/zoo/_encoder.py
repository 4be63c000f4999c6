"""A small transformer encoder in Flax NNX: the zoo's sequence model.

``tokens`` i32[n,l] -> ``logits`` f32[n,classes]: token and position embeddings, ``layers``
pre-norm blocks (multi-head self-attention, GELU MLP), a final LayerNorm, mean pooling and a
dense head.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

__all__ = ["Encoder", "encoder"]


class _Block(nnx.Module):  # type: ignore[misc]
    def __init__(self, dim: int, heads: int, rngs: nnx.Rngs) -> None:
        self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(
            num_heads=heads, in_features=dim, decode=False, rngs=rngs
        )
        self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
        self.up = nnx.Linear(dim, dim * 4, rngs=rngs)
        self.down = nnx.Linear(dim * 4, dim, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        x = x + self.attention(self.norm1(x))
        return x + self.down(nnx.gelu(self.up(self.norm2(x))))


class Encoder(nnx.Module):  # type: ignore[misc]
    """Embeddings, ``layers`` encoder blocks, mean pooling, a classifier head."""

    def __init__(
        self,
        *,
        vocab: int = 1000,
        length: int = 128,
        dim: int = 128,
        heads: int = 4,
        layers: int = 2,
        classes: int = 10,
        rngs: nnx.Rngs,
    ) -> None:
        self.tokens = nnx.Embed(vocab, dim, rngs=rngs)
        self.positions = nnx.Param(jax.random.normal(rngs.params(), (length, dim)) * 0.02)
        self.blocks = nnx.List([_Block(dim, heads, rngs) for _ in range(layers)])
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.head = nnx.Linear(dim, classes, rngs=rngs)

    def __call__(self, tokens: Any) -> Any:
        """Logits f32[n, classes] for ``tokens`` i32[n, l] (l <= length)."""
        x = self.tokens(tokens) + self.positions[...][: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(axis=1))


def encoder(seed: int = 0, length: int = 128) -> Encoder:
    """The zoo's encoder with random weights from ``seed``, in eval mode."""
    model = Encoder(length=length, rngs=nnx.Rngs(seed))
    model.eval()
    return model
