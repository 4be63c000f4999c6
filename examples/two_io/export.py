"""Export the ``two_io`` bundle: ``python -m examples.two_io.export --out build/models``."""

from __future__ import annotations

import sys
from pathlib import Path

from examples._cli import run
from examples.two_io.network import forward, init_params
from reactantserver.export import export_jax

__all__ = ["BATCH_SIZES", "NAME", "export", "main"]

NAME = "two_io"
BATCH_SIZES = (1, 8)


def export(out: Path, *, progress: bool = True) -> list[Path]:
    """Write ``out/two_io`` (replacing it atomically if it exists)."""
    bundle = export_jax(
        forward,
        init_params(),
        ["a=f32[n,d=8]", "b=f32[n,d=8]"],
        ["sum=f32[n,d=8]", "dot=f32[n,k=1]"],
        batch_sizes=BATCH_SIZES,
        out=Path(out) / NAME,
        force=True,
        description="Two inputs, two outputs: sum = a + scale*b, dot = (a*b) @ proj",
        progress=progress,
    )
    return [bundle]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    return run(export, __doc__ or "", argv)


if __name__ == "__main__":
    sys.exit(main())
