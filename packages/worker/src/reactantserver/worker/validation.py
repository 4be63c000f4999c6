"""Checks a request's tensors against declared specs.

The same check guards both sides of ``preprocess``: the client-facing specs before it, the
executable specs after it. Every failure is an :class:`InvalidArgumentError` whose message
names the model and the tensor::

    arrays = order_tensors(manifest.executable_inputs, tensors, model="resnet")
    rows = batch_rows(manifest.executable_inputs, arrays)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from reactantserver.core.dtypes import DType
from reactantserver.core.errors import InvalidArgumentError
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.types import Fixed, TensorSpec

__all__ = ["batch_rows", "check_tensor", "checked_inputs", "order_tensors"]


def _wire(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _dtype_name(dtype: DType) -> str:
    """The KServe name where there is one (FP8 types have none: their manifest token)."""
    try:
        return dtype.kserve
    except ValueError:
        return dtype.token


def check_tensor(
    spec: TensorSpec, array: np.ndarray[Any, Any], *, model: str, kind: str = "input"
) -> None:
    """Dtype, rank and FIXED extents of one tensor (batch and variable axes accept any).

    ``kind`` names the tensor's role in messages (``"input"``, ``"output"``).
    """
    try:
        got = DType.from_numpy(array.dtype)
    except (KeyError, ValueError, TypeError):
        raise InvalidArgumentError(
            f"{kind} '{spec.name}' of model '{model}' has unsupported element type {array.dtype}"
        ) from None
    if got is not spec.dtype:
        raise InvalidArgumentError(
            f"{kind} '{spec.name}' of model '{model}' has datatype {_dtype_name(got)}, "
            f"expected {_dtype_name(spec.dtype)}"
        )
    shape = array.shape
    if len(shape) != len(spec.shape):
        raise InvalidArgumentError(
            f"{kind} '{spec.name}' of model '{model}' has shape {_wire(shape)}, "
            f"expected rank {len(spec.shape)} ({_wire(spec.wire_shape)})"
        )
    for extent, dim in zip(shape, spec.shape, strict=True):
        if isinstance(dim, Fixed) and extent != dim.size:
            raise InvalidArgumentError(
                f"{kind} '{spec.name}' of model '{model}' has shape {_wire(shape)}, "
                f"expected {_wire(spec.wire_shape)}"
            )


def order_tensors(
    specs: Sequence[TensorSpec], tensors: Sequence[NamedTensor], *, model: str
) -> list[np.ndarray[Any, Any]]:
    """The arrays of ``tensors`` in ``specs`` order, each checked; batched ones agree on rows.

    Every declared input must be present, none undeclared or repeated.
    """
    return checked_inputs(specs, tensors, model=model)[0]


def checked_inputs(
    specs: Sequence[TensorSpec], tensors: Sequence[NamedTensor], *, model: str
) -> tuple[list[np.ndarray[Any, Any]], int]:
    """:func:`order_tensors` plus the request's rows (:func:`batch_rows`), checked once."""
    # The usual request names every declared input once, in declared order: no name table.
    in_order = len(tensors) == len(specs) and all(
        t.name == spec.name for t, spec in zip(tensors, specs, strict=True)
    )
    by_name: dict[str, np.ndarray[Any, Any]] = {}
    if not in_order:
        for tensor in tensors:
            if tensor.name in by_name:
                raise InvalidArgumentError(
                    f"input '{tensor.name}' appears more than once in the request for model "
                    f"'{model}'"
                )
            by_name[tensor.name] = tensor.data
        declared = {spec.name for spec in specs}
        for name in by_name:
            if name not in declared:
                raise InvalidArgumentError(
                    f"unexpected inference input '{name}' for model '{model}'"
                )
    arrays: list[np.ndarray[Any, Any]] = []
    for i, spec in enumerate(specs):
        array = tensors[i].data if in_order else by_name.get(spec.name)
        if array is None:
            raise InvalidArgumentError(f"model '{model}' expects input '{spec.name}', missing")
        check_tensor(spec, array, model=model)
        arrays.append(array)
    return arrays, batch_rows(specs, arrays, model=model)


def batch_rows(
    specs: Sequence[TensorSpec], arrays: Sequence[np.ndarray[Any, Any]], *, model: str
) -> int:
    """Rows of a request: the batch extent its batched inputs agree on (1 with none).

    Inconsistent row counts or 0 rows → :class:`InvalidArgumentError`.
    """
    rows: int | None = None
    first = ""
    for spec, array in zip(specs, arrays, strict=True):
        axis = spec.batch_axis
        if axis is None:
            continue
        extent = int(array.shape[axis])
        if rows is None:
            rows, first = extent, spec.name
        elif extent != rows:
            raise InvalidArgumentError(
                f"batched inputs of model '{model}' disagree on the batch size: "
                f"'{first}' has {rows} rows, '{spec.name}' has {extent}"
            )
    if rows is None:
        return 1
    if rows < 1:
        raise InvalidArgumentError(
            f"input '{first}' of model '{model}' has 0 rows; a request needs at least one"
        )
    return rows
