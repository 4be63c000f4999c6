"""The GPU kit's model: a ResNet-50-shaped CNN with explicit weights, and its bundles.

ResNet-50's layout (stem 7x7/2 + max-pool, bottleneck stages of 3, 4, 6, 3 blocks, global
average pool, dense 2048 -> 1000) with batch norm folded into a per-channel scale and bias:
25.5 M f32 weights, ~102 MB, in 161 arrays, like the real one. The smoke size (the CPU dry
run) keeps the structure at 1/16 of the width, one block per stage, 32x32 images. Weights are
random (He-scaled; each residual branch damped so 16 blocks stay finite), never downloaded::

    bundle = export_bundle(FULL, work / "resnet", batch_sizes=(1, 8), platform="cuda")
    write_weights(FULL, bundle / "weights.safetensors", seed=3)   # distinct weights per seed
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

__all__ = ["FULL", "SMOKE", "Arch", "export_bundle", "forward", "init_params", "write_weights"]

Array = np.ndarray[Any, Any]
Params = dict[str, dict[str, Array]]

_LAYOUT = ("NCHW", "OIHW", "NCHW")
_BLOCK = re.compile(r"s\d+b\d+")
#: Scale of the last folded batch norm of each block (keeps the residual sum bounded).
_BRANCH_SCALE = 0.2


@attrs.frozen
class Arch:
    """One size of the network: blocks per stage, width divisor, classes, image side."""

    blocks: tuple[int, ...]
    width_div: int
    classes: int
    image: int

    @property
    def input_decl(self) -> str:
        """The exported image input (NCHW, f32)."""
        return f"image=f32[n,c=3,h={self.image},w={self.image}]"

    @property
    def output_decl(self) -> str:
        """The exported logits output."""
        return f"logits=f32[n,k={self.classes}]"

    def row_shape(self) -> tuple[int, ...]:
        """One request's image: ``(1, 3, image, image)``."""
        return (1, 3, self.image, self.image)

    def stages(self) -> list[tuple[int, int, int, int]]:
        """``(blocks, mid channels, out channels, stride)`` per stage."""
        mids = (64, 128, 256, 512)
        return [
            (blocks, mids[i] // self.width_div, 4 * mids[i] // self.width_div, 1 if i == 0 else 2)
            for i, blocks in enumerate(self.blocks)
        ]


#: ResNet-50's size (~102 MB of weights, 224x224 images).
FULL = Arch(blocks=(3, 4, 6, 3), width_div=1, classes=1000, image=224)
#: The CPU dry run's size (a few hundred KB, 32x32 images).
SMOKE = Arch(blocks=(1, 1, 1, 1), width_div=16, classes=10, image=32)


def _conv_shapes(arch: Arch) -> list[tuple[str, tuple[int, int, int, int]]]:
    stem = 64 // arch.width_div
    shapes = [("stem", (stem, 3, 7, 7))]
    channels = stem
    for s, (blocks, mid, out, _) in enumerate(arch.stages()):
        for b in range(blocks):
            name = f"s{s}b{b}"
            shapes += [
                (f"{name}/c1", (mid, channels, 1, 1)),
                (f"{name}/c2", (mid, mid, 3, 3)),
                (f"{name}/c3", (out, mid, 1, 1)),
            ]
            if b == 0:
                shapes.append((f"{name}/proj", (out, channels, 1, 1)))
            channels = out
    return shapes


def init_params(arch: Arch, seed: int) -> Params:
    """Random weights for ``arch`` (one seed, one distinct model)."""
    rng = np.random.default_rng(seed)
    params: Params = {}
    for name, shape in _conv_shapes(arch):
        fan_in = shape[1] * shape[2] * shape[3]
        w = rng.standard_normal(shape, dtype=np.float32) * np.float32(math.sqrt(2.0 / fan_in))
        scale = _BRANCH_SCALE if name.endswith(("/c3", "/proj")) else 1.0
        params[name] = {
            "w": w,
            "scale": np.full(shape[0], scale, np.float32),
            "bias": np.zeros(shape[0], np.float32),
        }
    features = _conv_shapes(arch)[-1][1][0]
    dense = rng.standard_normal((features, arch.classes), dtype=np.float32)
    params["dense"] = {
        "w": dense * np.float32(math.sqrt(1.0 / features)),
        "b": np.zeros(arch.classes, np.float32),
    }
    return params


def _conv(x: Any, layer: dict[str, Any], stride: int, *, relu: bool = True) -> Any:
    import jax

    kernel = layer["w"].shape[-1]
    pad = kernel // 2
    y = jax.lax.conv_general_dilated(
        x,
        layer["w"],
        window_strides=(stride, stride),
        padding=((pad, pad), (pad, pad)),
        dimension_numbers=_LAYOUT,
    )
    y = y * layer["scale"][None, :, None, None] + layer["bias"][None, :, None, None]
    return jax.nn.relu(y) if relu else y


def _blocks(params: dict[str, dict[str, Any]]) -> list[str]:
    """Block names (``s<stage>b<block>``) in network order."""
    found = {m[0] for key in params if (m := _BLOCK.match(key))}
    return sorted(found, key=lambda name: tuple(int(v) for v in name[1:].split("b")))


def forward(params: dict[str, dict[str, Any]], image: Any) -> Any:
    """Logits ``f32[n, classes]`` for ``image`` ``f32[n, 3, h, w]``."""
    import jax

    x = _conv(image, params["stem"], 2)
    x = jax.lax.reduce_window(
        x, -np.inf, jax.lax.max, (1, 1, 3, 3), (1, 1, 2, 2), ((0, 0), (0, 0), (1, 1), (1, 1))
    )
    for name in _blocks(params):
        stride = 2 if name.endswith("b0") and name != "s0b0" else 1
        shortcut = x
        if f"{name}/proj" in params:
            shortcut = _conv(x, params[f"{name}/proj"], stride, relu=False)
        y = _conv(x, params[f"{name}/c1"], 1)
        y = _conv(y, params[f"{name}/c2"], stride)
        y = _conv(y, params[f"{name}/c3"], 1, relu=False)
        x = jax.nn.relu(y + shortcut)
    pooled = x.mean(axis=(2, 3))
    return pooled @ params["dense"]["w"] + params["dense"]["b"]


def export_bundle(arch: Arch, out: Path, *, batch_sizes: Sequence[int], platform: str) -> Path:
    """Export the network (seed 0 weights) as a bundle at ``out``; returns its path."""
    from reactantserver.export import export_jax

    return export_jax(
        forward,
        init_params(arch, 0),
        [arch.input_decl],
        [arch.output_decl],
        batch_sizes=tuple(batch_sizes),
        out=out,
        platform=platform,
        force=True,
        description="ResNet-50-shaped CNN with random weights (bench.gpu)",
        progress=False,
    )


def write_weights(arch: Arch, path: Path, *, seed: int, order: Sequence[str]) -> int:
    """Write a weights file of ``arch`` with the weights of ``seed`` in ``order``; its bytes.

    ``order`` is the bundle's ``argument_order`` (the weight names as the export wrote them).
    """
    from safetensors.numpy import save_file

    params = init_params(arch, seed)
    flat = {f"{layer}/{leaf}": a for layer, leaves in params.items() for leaf, a in leaves.items()}
    if sorted(flat) != sorted(order):
        raise ValueError("the bundle's weights are not this network's")
    save_file(flat, str(path), metadata={"argument_order": json.dumps(list(order))})
    return sum(a.nbytes for a in flat.values())
