"""Export the detector's bundles (``detector_backbone``, ``detector_head`` and the meta model
``detector``): ``python -m examples.detector.export --out build/models`` (needs the ``torch``
extra and torchvision)."""

from __future__ import annotations

import sys
from pathlib import Path

from examples._cli import run
from reactantserver.export import export_torch, write_bundle

__all__ = ["BACKBONE", "HEAD", "META", "REGIONS", "export", "main"]

BACKBONE = "detector_backbone"
HEAD = "detector_head"
META = "detector"
REGIONS = 150
"""The box head is compiled for this many regions, the RPN's post-NMS maximum; the worker pads
a smaller set of proposals up to it."""
META_SOURCE = Path(__file__).with_name("meta.py")
"""Copied into the meta bundle as ``model.py``."""


def export(out: Path, *, progress: bool = True) -> list[Path]:
    """Write the three bundles under ``out`` (each replaced atomically if it exists); the
    stages first, so that a watcher that sees the meta can already load its callees."""
    # torch (and torchax) load before jax, as torchax wants: import the network here.
    from examples.detector.network import SIZE, backbone, box_head

    out = Path(out)
    stage1 = export_torch(
        backbone,
        [f"image=f32[n,c=3,h={SIZE},w={SIZE}]"],
        ["features=f32[n,c=256,h=10,w=10]", "objectness=f32[n,a=3375]", "deltas=f32[n,a=3375,d=4]"],
        batch_sizes=(1,),
        out=out / BACKBONE,
        force=True,
        description="Detector stage 1: MobileNetV3-Large FPN and the RPN head",
        progress=progress,
    )
    stage2 = export_torch(
        box_head,
        ["rois=f32[n,c=256,h=7,w=7]"],
        ["class_logits=f32[n,k=91]", "box_regression=f32[n,r=364]"],
        batch_sizes=(REGIONS,),
        out=out / HEAD,
        force=True,
        description="Detector stage 2: the box head on pooled regions",
        progress=progress,
    )
    meta = write_bundle(
        out / META,
        name=META,
        kind="meta",
        meta_calls=[BACKBONE, HEAD],
        client_inputs=[f"image=f32[c=3,h={SIZE},w={SIZE}]"],
        client_outputs=["boxes=f32[m=-1,b=4]", "scores=f32[m=-1]", "labels=i64[m=-1]"],
        model_py=META_SOURCE,
        description="Faster R-CNN (MobileNetV3-Large FPN 320) as two stages and NumPy glue",
        provenance={"source_framework": "python", "entry": "examples.detector.meta:run"},
        force=True,
    )
    return [stage1, stage2, meta]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    return run(export, __doc__ or "", argv)


if __name__ == "__main__":
    sys.exit(main())
