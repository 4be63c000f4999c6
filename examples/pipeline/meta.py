"""``model.py`` of the meta bundle ``pipeline``: plain Python between two sub-model calls.

``items`` f32[k,16] (1 <= k <= 32) -> ``pipeline_embed`` -> keep the rows whose embedding norm
exceeds the median (at least one: the largest) -> ``pipeline_score`` on those rows ->
``scores`` f32[m] and the kept row ``indices`` i64[m]. The number of rows kept depends on the
data, which a traced graph cannot express; that is what meta models are for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from reactantserver.core.hooks import (
    InvalidArgumentError,
    MetaCall,
    NamedTensor,
    register_meta_model,
)

MAX_ITEMS = 32
EMBED_DIM = 8


def select_rows(emb: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Indices of the rows whose L2 norm exceeds the median norm; at least the largest one."""
    norms = np.linalg.norm(emb, axis=1)
    keep = np.flatnonzero(norms > np.median(norms))
    if keep.size == 0:
        keep = np.array([int(np.argmax(norms))])
    return keep.astype(np.int64)


def run(inputs: list[NamedTensor], call: MetaCall) -> list[NamedTensor]:
    """The pipeline: embed every item, keep the strong ones, score them."""
    (items,) = inputs
    count = items.shape[0]
    if not 1 <= count <= MAX_ITEMS:
        raise InvalidArgumentError(f"items must have 1 to {MAX_ITEMS} rows, got {count}")
    (emb,) = call("pipeline_embed", [NamedTensor("x", items.data)])
    keep = select_rows(emb.data)
    # call.scratch hands out a pooled buffer (released when run returns; a plain array when
    # the worker has no scratch pool), so the selected rows need no per-request allocation.
    selected = call.scratch((keep.size, EMBED_DIM), np.float32)
    np.take(emb.data, keep, axis=0, out=selected)
    (score,) = call("pipeline_score", [NamedTensor("emb", selected)])
    return [
        NamedTensor("scores", np.ascontiguousarray(score.data[:, 0], dtype=np.float32)),
        NamedTensor("indices", keep),
    ]


register_meta_model("pipeline", run=run)
