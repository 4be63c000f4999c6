"""Typed ``InferTensorContents``: which field carries which dtype, and value conversion."""

from __future__ import annotations

from typing import Any

import numpy as np

from reactantserver.core.dtypes import DType
from reactantserver.core.errors import InvalidArgumentError
from reactantserver.core.protocol import grpc_service_pb2 as pb

#: The typed-contents field of each wire dtype; FP16/BF16 have none.
TYPED_FIELD: dict[DType, str] = {
    DType.BOOL: "bool_contents",
    DType.U8: "uint_contents",
    DType.U16: "uint_contents",
    DType.U32: "uint_contents",
    DType.U64: "uint64_contents",
    DType.I8: "int_contents",
    DType.I16: "int_contents",
    DType.I32: "int_contents",
    DType.I64: "int64_contents",
    DType.F32: "fp32_contents",
    DType.F64: "fp64_contents",
    DType.BYTES: "bytes_contents",
}

_FIELDS = tuple(sorted(set(TYPED_FIELD.values())))

# Narrow integer dtypes share a 32-bit field, so values must be range-checked before the cast.
_NARROW = {DType.U8, DType.U16, DType.I8, DType.I16}


def typed_fields_set(contents: pb.InferTensorContents) -> list[str]:
    """The typed-contents fields that hold at least one value."""
    return [name for name in _FIELDS if len(getattr(contents, name))]


def typed_to_array(
    contents: pb.InferTensorContents,
    dtype: DType,
    shape: tuple[int, ...],
    elements: int,
    what: str,
) -> np.ndarray[Any, Any]:
    """The array typed ``contents`` describe; exactly ``elements`` values of ``dtype``'s field.

    Wrong field, wrong count, FP16/BF16 (no typed form) and out-of-range narrow integers are
    ``InvalidArgumentError`` naming ``what``.
    """
    field = TYPED_FIELD.get(dtype)
    present = typed_fields_set(contents)
    if field is None:
        if present or elements:
            raise InvalidArgumentError(
                f"{what}: {dtype.kserve} has no typed contents; send raw_input_contents "
                "or shared memory"
            )
        return np.empty(shape, dtype=dtype.numpy)
    stray = [name for name in present if name != field]
    if stray:
        raise InvalidArgumentError(
            f"{what}: {dtype.kserve} data belong in contents.{field}, not {', '.join(stray)}"
        )
    values = getattr(contents, field)
    if len(values) != elements:
        if not values:
            raise InvalidArgumentError(f"{what}: missing data (no raw, typed or shared memory)")
        raise InvalidArgumentError(
            f"{what}: contents.{field} has {len(values)} values, shape needs {elements}"
        )
    if dtype is DType.BYTES:
        out = np.empty(elements, dtype=object)
        for i, item in enumerate(values):
            out[i] = item
        return out.reshape(shape)
    if dtype in _NARROW:
        wide = np.array(values, dtype=np.int64)
        info = np.iinfo(dtype.numpy)
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            raise InvalidArgumentError(
                f"{what}: contents.{field} holds values outside the {dtype.kserve} range"
            )
        return wide.astype(dtype.numpy).reshape(shape)
    return np.array(values, dtype=dtype.numpy).reshape(shape)
