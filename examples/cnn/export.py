"""Export the ``cnn`` bundle: ``python -m examples.cnn.export --out build/models``."""

from __future__ import annotations

import sys
from pathlib import Path

from examples._cli import run
from examples.cnn.network import forward, init_params
from reactantserver.export import export_jax

__all__ = ["BATCH_SIZES", "NAME", "export", "main"]

NAME = "cnn"
BATCH_SIZES = (1, 4, 8, 32)


def export(out: Path, *, progress: bool = True) -> list[Path]:
    """Write ``out/cnn`` (replacing it atomically if it exists)."""
    bundle = export_jax(
        forward,
        init_params(),
        ["image=f32[n,c=1,h=28,w=28]"],
        ["logits=f32[n,k=10]"],
        batch_sizes=BATCH_SIZES,
        out=Path(out) / NAME,
        force=True,
        description="Small CNN on NCHW 28x28 images: two 3x3 convolutions, 10 logits",
        progress=progress,
    )
    return [bundle]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    return run(export, __doc__ or "", argv)


if __name__ == "__main__":
    sys.exit(main())
