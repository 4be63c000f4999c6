"""Bundles ``make_bundle`` cannot write: a lone ``model.mlir`` and multi-shape variants."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import yaml
from safetensors.numpy import save_file

from packages.worker.tests.conftest import Tensor, export_module

Weights = Sequence[tuple[str, np.ndarray[Any, Any]]]


def _write(bundle: Path, weights: Weights, manifest: dict[str, Any]) -> Path:
    save_file(
        {n: np.ascontiguousarray(w) for n, w in weights},
        str(bundle / "weights.safetensors"),
        metadata={"argument_order": json.dumps([n for n, _ in weights])},
    )
    (bundle / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    return bundle


def lone_bundle(
    bundle: Path,
    fn: Callable[..., Any],
    *,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    weights: Weights,
) -> Path:
    """A bundle with one unbatched ``model.mlir`` (no compiled batch sizes)."""
    bundle.mkdir()
    (bundle / "model.mlir").write_bytes(export_module(fn, inputs, weights, 0))
    return _write(
        bundle,
        weights,
        {
            "format_version": "3.0",
            "executable_inputs": [t.entry() for t in inputs],
            "executable_outputs": [t.entry() for t in outputs],
        },
    )


def variant_bundle(
    bundle: Path,
    fn: Callable[..., Any],
    *,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    weights: Weights,
    batch_sizes: Sequence[int],
    shapes: Sequence[Mapping[str, int]],
) -> Path:
    """A multi-shape bundle: ``model.v{i}.b{N}.mlir`` for every variable-letter sizing."""
    bundle.mkdir()
    for i, sizes in enumerate(shapes):
        fixed = [
            attrs.evolve(t, dims={k: sizes.get(k, v) if v == -1 else v for k, v in t.dims.items()})
            for t in inputs
        ]
        for b in batch_sizes:
            module = export_module(fn, fixed, weights, b)
            (bundle / f"model.v{i}.b{b}.mlir").write_bytes(module)
    return _write(
        bundle,
        weights,
        {
            "format_version": "3.0",
            "executable_inputs": [t.entry() for t in inputs],
            "executable_outputs": [t.entry() for t in outputs],
            "batching": {"compiled_batch_sizes": list(batch_sizes)},
            "input_shapes": [dict(s) for s in shapes],
        },
    )
