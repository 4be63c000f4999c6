"""Export the ``mlp`` bundle: ``python -m examples.mlp.export --out build/models``."""

from __future__ import annotations

import sys
from pathlib import Path

from examples._cli import run
from examples.mlp.network import forward, init_params
from reactantserver.export import export_jax

__all__ = ["BATCH_SIZES", "NAME", "export", "main"]

NAME = "mlp"
BATCH_SIZES = (1, 8, 32)


def export(out: Path, *, progress: bool = True) -> list[Path]:
    """Write ``out/mlp`` (replacing it atomically if it exists)."""
    bundle = export_jax(
        forward,
        init_params(),
        ["x=f32[n,f=16]"],
        ["logits=f32[n,k=4]"],
        batch_sizes=BATCH_SIZES,
        out=Path(out) / NAME,
        force=True,
        description="Tiny MLP classifier: x[n,16] -> dense 32 + ReLU -> dense 4 -> logits[n,4]",
        progress=progress,
    )
    return [bundle]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    return run(export, __doc__ or "", argv)


if __name__ == "__main__":
    sys.exit(main())
