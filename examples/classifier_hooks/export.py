"""Export the ``classifier_hooks`` bundle:
``python -m examples.classifier_hooks.export --out build/models``."""

from __future__ import annotations

import sys
from pathlib import Path

from examples._cli import run
from examples.classifier_hooks.network import forward, init_params
from reactantserver.export import export_jax

__all__ = ["BATCH_SIZES", "HOOKS", "NAME", "export", "main"]

NAME = "classifier_hooks"
BATCH_SIZES = (1, 8)
HOOKS = Path(__file__).with_name("hooks.py")
"""Copied into the bundle as ``model.py``."""


def export(out: Path, *, progress: bool = True) -> list[Path]:
    """Write ``out/classifier_hooks`` (replacing it atomically if it exists)."""
    bundle = export_jax(
        forward,
        init_params(),
        ["pixels=f32[n,c=3,h=28,w=28]"],
        ["logits=f32[n,k=10]"],
        batch_sizes=BATCH_SIZES,
        out=Path(out) / NAME,
        force=True,
        description="uint8 NHWC image in, top-3 classes out; the hooks live in model.py",
        progress=progress,
        client_inputs=["image=u8[n,h=28,w=28,c=3]"],
        client_outputs=["indices=i64[n,k=3]", "scores=f32[n,k=3]"],
        model_py=HOOKS,
    )
    return [bundle]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    return run(export, __doc__ or "", argv)


if __name__ == "__main__":
    sys.exit(main())
