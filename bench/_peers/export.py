"""Our worker's bundles of the peers' MLPs: ``python -m bench._peers.export --out DIR``.

Writes ``DIR/tiny_mlp`` and ``DIR/heavy_mlp`` from :mod:`bench._peers.models` (the same
function and weights the peers jit), compiled for :data:`~bench._peers.models.OUR_BATCH_SIZES`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bench._peers.models import INPUT, MODELS, OUR_BATCH_SIZES, OUTPUT, forward, params

__all__ = ["export", "main"]


def export(out: Path, names: Sequence[str] = tuple(MODELS)) -> list[Path]:
    """Write one bundle per model in ``names`` under ``out`` (replacing any there)."""
    from reactantserver.export import export_jax

    bundles = []
    for name in names:
        mlp = MODELS[name]
        bundles.append(
            export_jax(
                forward,
                params(mlp),
                [f"{INPUT}=f32[n,f={mlp.in_features}]"],
                [f"{OUTPUT}=f32[n,k={mlp.out_features}]"],
                batch_sizes=OUR_BATCH_SIZES,
                out=out / name,
                force=True,
                description=f"bench.peers MLP {'-'.join(map(str, mlp.widths))}",
                progress=False,
            )
        )
    return bundles


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the model repository")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    args = parser.parse_args(argv)
    for path in export(args.out, args.models):
        print(f"exported {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
