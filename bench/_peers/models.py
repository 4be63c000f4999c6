"""The tiny and heavy MLPs every server in ``bench.peers`` runs: one definition, seeded weights.

Pure numpy + jax (no reactantserver import): the peers' server scripts import this module in
their own venvs. The input is ``x`` FP32 ``[b, in]``, the output ``y`` FP32 ``[b, out]``::

    model = MODELS["tiny_mlp"]
    run = compiled(model)            # jax.jit of forward, weights on the device
    y = run(np.zeros((8, 64), np.float32))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "INPUT",
    "MAX_BATCH",
    "MODELS",
    "OUR_BATCH_SIZES",
    "OUTPUT",
    "Array",
    "Mlp",
    "Params",
    "compiled",
    "forward",
    "params",
    "sample",
]

Array = np.ndarray[Any, np.dtype[np.float32]]
#: Layer name -> {"w": [fan_in, fan_out], "b": [fan_out]}, as ``forward`` reads them.
Params = dict[str, dict[str, Array]]

INPUT = "x"
OUTPUT = "y"
#: The largest batch every server takes (Triton's ``max_batch_size``, MLServer's, ours).
MAX_BATCH = 32
#: The sizes our worker's bundles are compiled for. Its planner runs the largest compiled size
#: the queued rows fill and never pads by default, so powers of two cover 1..32 with six
#: executables; the peers jit every exact size 1..32 instead (see :func:`compiled`).
OUR_BATCH_SIZES = (1, 2, 4, 8, 16, 32)


@dataclasses.dataclass(frozen=True)
class Mlp:
    """A dense ReLU network: ``widths`` from input features to output features."""

    name: str
    widths: tuple[int, ...]
    seed: int

    @property
    def in_features(self) -> int:
        """Columns of ``x``."""
        return self.widths[0]

    @property
    def out_features(self) -> int:
        """Columns of ``y``."""
        return self.widths[-1]


MODELS: dict[str, Mlp] = {
    m.name: m
    for m in (
        Mlp("tiny_mlp", (64, 64, 16), seed=1),
        Mlp("heavy_mlp", (1024, 4096, 4096, 1000), seed=2),
    )
}


def params(model: Mlp) -> Params:
    """The model's weights from its fixed seed, scaled like a He initialisation."""
    rng = np.random.default_rng(model.seed)
    layers: Params = {}
    for i, (fan_in, fan_out) in enumerate(zip(model.widths, model.widths[1:], strict=False)):
        w = rng.standard_normal((fan_in, fan_out), dtype=np.float32) * np.sqrt(2.0 / fan_in)
        b = rng.standard_normal(fan_out, dtype=np.float32) * np.float32(0.1)
        layers[f"dense{i}"] = {"w": w.astype(np.float32), "b": b.astype(np.float32)}
    return layers


def forward(weights: dict[str, dict[str, Any]], x: Any) -> Any:
    """``y`` for ``x``: dense layers in order, ReLU between them (a jax or numpy function)."""
    import jax.numpy as jnp

    h = x
    last = len(weights) - 1
    for i in range(len(weights)):
        layer = weights[f"dense{i}"]
        h = h @ layer["w"] + layer["b"]
        if i < last:
            h = jnp.maximum(h, 0.0)
    return h


def compiled(model: Mlp, warm: Sequence[int] = ()) -> Callable[[Array], Array]:
    """``x -> y`` on host arrays through ``jax.jit(forward)`` with the weights on the device.

    jit compiles each exact batch size once, on first use; ``warm`` compiles those sizes now
    (the peers warm 1..``MAX_BATCH`` before they report ready, so nothing compiles under load).
    """
    import jax

    on_device = jax.device_put(params(model))
    step = jax.jit(forward)

    def run(x: Array) -> Array:
        return np.asarray(step(on_device, x))

    for size in warm:
        run(np.zeros((size, model.in_features), np.float32))
    return run


def sample(model: Mlp, rows: int, seed: int = 0) -> Array:
    """A seeded ``x`` of ``rows`` rows."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, model.in_features), dtype=np.float32)
