"""Batch assembly and result slicing.

Inputs of the taken requests are concatenated along each input's own batch axis and
zero-padded up to the compiled size; outputs are cut back per request as views::

    batch = assemble([r.inputs for r in taken], [r.rows for r in taken], axes, batch=8)
    per_request = split(outputs, [r.rows for r in taken], output_axes)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["assemble", "split"]

Array = np.ndarray[Any, Any]


def _along(axis: int, start: int, stop: int) -> tuple[slice, ...]:
    return (slice(None),) * axis + (slice(start, stop),)


def assemble(
    inputs: Sequence[Sequence[Array]],
    rows: Sequence[int],
    axes: Sequence[int | None],
    *,
    batch: int,
) -> list[Array]:
    """One argument list for the executable from per-request argument lists.

    A lone request whose rows already equal ``batch`` (or any lone request of a program
    without a batch dimension, ``batch == 0``) passes through untouched. Otherwise each
    input with a batch axis is concatenated along it in request order and zero-padded to
    ``batch`` rows; an input without one is taken from the first request.
    """
    total = sum(rows)
    if len(inputs) == 1 and batch in {0, total}:
        return list(inputs[0])
    out: list[Array] = []
    for k, axis in enumerate(axes):
        if axis is None or batch == 0:
            out.append(inputs[0][k])
            continue
        first = inputs[0][k]
        shape = list(first.shape)
        shape[axis] = batch
        merged = np.empty(shape, dtype=first.dtype)
        if total < batch:
            merged[_along(axis, total, batch)] = 0
        np.concatenate([r[k] for r in inputs], axis=axis, out=merged[_along(axis, 0, total)])
        out.append(merged)
    return out


def split(
    outputs: Sequence[Array],
    rows: Sequence[int],
    axes: Sequence[int | None],
) -> list[list[Array]]:
    """Per-request outputs: batched ones sliced (views, padding dropped), others shared whole.

    A single request that used the whole batch gets the outputs as they are.
    """
    if len(rows) == 1 and all(
        axis is None or out.shape[axis] == rows[0] for out, axis in zip(outputs, axes, strict=True)
    ):
        return [list(outputs)]
    bounds = [0]
    for n in rows:
        bounds.append(bounds[-1] + n)
    result: list[list[Array]] = [[] for _ in rows]
    for out, axis in zip(outputs, axes, strict=True):
        for i, per_request in enumerate(result):
            per_request.append(out if axis is None else out[_along(axis, bounds[i], bounds[i + 1])])
    return result
