"""The density step's catalog: copies of the kit network, each with its own random weights.

One bundle is exported (``<work>/repos/density-base/resnet``) and copied as ``resnet_00``,
``resnet_01``, ... into ``<work>/repos/density``: same modules (the executable cache
compiles them once for the whole catalog), same ``argument_order``, weights drawn from a seed
of their own, generated here, so every load moves distinct bytes. A copy is written once per
kit run (a marker per copy), so a step stopped half-way can resume::

    catalog = build_catalog(step, count=30, batches=(1, 4))
    catalog.total_bytes        # ~3.1 GB for 30 ResNet-50-size models
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import attrs
import yaml

from bench.gpu._resnet import write_weights
from bench.gpu._step import Step, ensure_bundle

__all__ = ["Catalog", "build_catalog"]

_WEIGHTS = "weights.safetensors"
#: Seeds of the copies start here (seed 0 is the exported base's).
_FIRST_SEED = 100


@attrs.frozen
class Catalog:
    """The catalog: its repository, model names and bytes of weights per model."""

    root: Path
    names: tuple[str, ...]
    model_bytes: int

    @property
    def total_bytes(self) -> int:
        """Bytes of weights of the whole catalog."""
        return self.model_bytes * len(self.names)


def _argument_order(bundle: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(bundle / _WEIGHTS), "np") as f:
        order: list[str] = json.loads((f.metadata() or {})["argument_order"])
    return order


def build_catalog(step: Step, *, count: int, batches: tuple[int, ...]) -> Catalog:
    """Export the base once and write ``count`` copies with distinct weights (resumable)."""
    base = ensure_bundle(step, "density-base", batches)
    stamp = (base.parent / ".done").read_text()  # copies of another base are rewritten
    order = _argument_order(base)
    root = step.work / "repos" / "density"
    root.mkdir(parents=True, exist_ok=True)
    names = tuple(f"resnet_{i:02d}" for i in range(count))
    model_bytes = 0
    for i, name in enumerate(names):
        target = root / name
        marker = root / f".{name}.done"
        if marker.exists() and marker.read_text().split("|", 1)[1:] == [stamp]:
            model_bytes = int(marker.read_text().split("|", 1)[0])
            continue
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(base, target, ignore=shutil.ignore_patterns(_WEIGHTS))
        model_bytes = write_weights(
            step.mode.arch, target / _WEIGHTS, seed=_FIRST_SEED + i, order=order
        )
        manifest_path = target / "manifest.yaml"
        manifest = yaml.safe_load(manifest_path.read_text())
        manifest["name"] = name
        manifest_path.write_text(yaml.safe_dump(manifest, sort_keys=False))
        marker.write_text(f"{model_bytes}|{stamp}")
    return Catalog(root, names, model_bytes)
