"""Export the ``resnet18_flax`` bundle (Flax NNX ResNet-18, random weights from a seed):
``python -m examples.resnet18_flax.export --out build/models``."""

from __future__ import annotations

import sys
from pathlib import Path

from examples._cli import run
from examples.resnet18_flax.network import resnet18
from reactantserver.export import export_flax

__all__ = ["BATCH_SIZES", "HOOKS", "NAME", "SIZE", "export", "main"]

NAME = "resnet18_flax"
BATCH_SIZES = (1, 8)
"""Kept small so that ``make serve`` starts quickly; the model zoo tests run 1, 8 and 32."""
SIZE = 224
HOOKS = Path(__file__).with_name("hooks.py")
"""Copied into the bundle as ``model.py``."""


def export(out: Path, *, progress: bool = True) -> list[Path]:
    """Write ``out/resnet18_flax`` (replacing it atomically if it exists)."""
    bundle = export_flax(
        resnet18(),
        [f"image=f32[n,h={SIZE},w={SIZE},c=3]"],
        ["logits=f32[n,k=1000]"],
        batch_sizes=BATCH_SIZES,
        out=Path(out) / NAME,
        force=True,
        description="Flax NNX ResNet-18 (seeded weights): uint8 HWC image in, top-5 out",
        progress=progress,
        client_inputs=[f"image=u8[n,h={SIZE},w={SIZE},c=3]"],
        client_outputs=["indices=i64[n,k=5]", "scores=f32[n,k=5]"],
        model_py=HOOKS,
    )
    return [bundle]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    return run(export, __doc__ or "", argv)


if __name__ == "__main__":
    sys.exit(main())
