"""Export the ``resnet50_torch`` bundle (torchvision ResNet-50, random weights from a seed):
``python -m examples.resnet50_torch.export --out build/models`` (needs the ``torch`` extra)."""

from __future__ import annotations

import sys
from pathlib import Path

from examples._cli import run
from reactantserver.export import export_torch

__all__ = ["BATCH_SIZES", "HOOKS", "NAME", "SIZE", "export", "main"]

NAME = "resnet50_torch"
BATCH_SIZES = (1, 8)
"""Kept small so that ``make serve`` starts quickly; the model zoo tests run 1, 8 and 32."""
SIZE = 224
HOOKS = Path(__file__).with_name("hooks.py")
"""Copied into the bundle as ``model.py``."""


def export(out: Path, *, progress: bool = True) -> list[Path]:
    """Write ``out/resnet50_torch`` (replacing it atomically if it exists)."""
    # torch (and torchax) load before jax, as torchax wants: import the network here.
    from examples.resnet50_torch.network import build

    bundle = export_torch(
        build,
        [f"image=f32[n,c=3,h={SIZE},w={SIZE}]"],
        ["logits=f32[n,k=1000]"],
        batch_sizes=BATCH_SIZES,
        out=Path(out) / NAME,
        force=True,
        description="torchvision ResNet-50 (seeded weights): uint8 HWC image in, top-5 out",
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
