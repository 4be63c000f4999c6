"""Tensor extents in one compiled module, for building validation inputs and checking outputs.

Whether a module's entry signature is servable is decided by the worker
(``reactantserver.worker.runtime.signature``), the same check the server applies at load.
"""

from __future__ import annotations

from reactantserver.core.manifest import Manifest
from reactantserver.core.types import Batch, Fixed, TensorSpec, Variable

__all__ = ["expected_shape", "variant_sizes"]


def variant_sizes(manifest: Manifest, variant: int | None) -> dict[str, int]:
    """``{letter: size}`` of a variant's variable axes (empty without variants)."""
    if variant is None:
        return {}
    key = manifest.variants[variant].key
    return dict(zip(manifest.variable_letters, key, strict=True))


def expected_shape(
    spec: TensorSpec, letters: str, batch: int, sizes: dict[str, int]
) -> tuple[int | None, ...]:
    """A tensor's extents in a module; ``None`` where any extent is allowed."""
    shape: list[int | None] = []
    for letter, dim in zip(letters, spec.shape, strict=True):
        if isinstance(dim, Fixed):
            shape.append(dim.size)
        elif isinstance(dim, Batch):
            shape.append(batch or None)
        elif isinstance(dim, Variable):
            shape.append(sizes.get(letter))
    return tuple(shape)
