"""Export the pipeline bundles (``pipeline_embed``, ``pipeline_score`` and the meta model
``pipeline``): ``python -m examples.pipeline.export --out build/models``."""

from __future__ import annotations

import sys
from pathlib import Path

from examples._cli import run
from examples.pipeline.network import embed, init_embed_params, init_score_params, score
from reactantserver.export import export_jax, write_bundle

__all__ = ["BATCH_SIZES", "EMBED", "META", "SCORE", "export", "main"]

EMBED = "pipeline_embed"
SCORE = "pipeline_score"
META = "pipeline"
BATCH_SIZES = (1, 8, 32)
META_SOURCE = Path(__file__).with_name("meta.py")
"""Copied into the meta bundle as ``model.py``."""


def export(out: Path, *, progress: bool = True) -> list[Path]:
    """Write the three bundles under ``out`` (each replaced atomically if it exists).

    The sub-models go first, so a watcher that sees the meta can already load its callees.
    """
    out = Path(out)
    embed_bundle = export_jax(
        embed,
        init_embed_params(),
        ["x=f32[n,f=16]"],
        ["emb=f32[n,e=8]"],
        batch_sizes=BATCH_SIZES,
        out=out / EMBED,
        force=True,
        description="Pipeline stage 1 (backbone): x[n,16] -> emb[n,8]",
        progress=progress,
    )
    score_bundle = export_jax(
        score,
        init_score_params(),
        ["emb=f32[n,e=8]"],
        ["score=f32[n,s=1]"],
        batch_sizes=BATCH_SIZES,
        out=out / SCORE,
        force=True,
        description="Pipeline stage 2 (head): emb[n,8] -> score[n,1]",
        progress=progress,
    )
    meta_bundle = write_bundle(
        out / META,
        name=META,
        kind="meta",
        meta_calls=[EMBED, SCORE],
        client_inputs=["items=f32[k=-1,f=16]"],
        client_outputs=["scores=f32[m=-1]", "indices=i64[m=-1]"],
        model_py=META_SOURCE,
        description="Meta model: embed, keep rows above the median norm, score them",
        provenance={"source_framework": "python", "entry": "examples.pipeline.meta:run"},
        force=True,
    )
    return [embed_bundle, score_bundle, meta_bundle]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    return run(export, __doc__ or "", argv)


if __name__ == "__main__":
    sys.exit(main())
