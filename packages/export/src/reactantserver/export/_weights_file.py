"""Writing ``weights.safetensors``: tensors in ``argument_order``, the order as metadata.

Written here rather than with ``safetensors.numpy.save_file`` so the data section follows
``argument_order`` (the order the server reads them in), every dtype of the vocabulary works
(``bf16`` and FP8 from ``ml_dtypes`` included) and arrays stream to disk without a copy of
the whole file in memory.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reactantserver.core.dtypes import DType
from reactantserver.export._errors import ExportError

__all__ = ["ARGUMENT_ORDER_KEY", "as_weight", "write_weights"]

ARGUMENT_ORDER_KEY = "argument_order"
"""``__metadata__`` key holding the JSON list of weight names in entry-signature order."""

# safetensors pads the header with spaces so the data section starts 8-byte aligned.
_HEADER_ALIGN = 8


def as_weight(name: str, value: Any) -> tuple[DType, np.ndarray[Any, Any]]:
    """A weight's dtype and its C-contiguous little-endian host array."""
    array = np.asarray(value)
    try:
        dtype = DType.from_numpy(array.dtype)
    except ValueError as exc:
        raise ExportError(f"weight {name!r}: {exc}") from None
    if dtype is DType.BYTES:
        raise ExportError(f"weight {name!r}: {array.dtype} arrays cannot be weights")
    return dtype, np.ascontiguousarray(array, dtype=dtype.numpy)


def write_weights(path: Path, weights: Sequence[tuple[str, Any]]) -> int:
    """Write ``weights`` (in order) to a new safetensors file; returns ``weight_nbytes``.

    The file is fsynced. Names must be unique and non-empty.
    """
    header: dict[str, Any] = {}
    arrays: list[np.ndarray[Any, Any]] = []
    offset = 0
    for name, value in weights:
        if not name or name == "__metadata__":
            raise ExportError(f"invalid weight name {name!r}")
        if name in header:
            raise ExportError(f"weight name {name!r} is used twice")
        dtype, array = as_weight(name, value)
        nbytes = math.prod(array.shape) * dtype.itemsize
        header[name] = {
            "dtype": dtype.safetensors,
            "shape": [int(d) for d in array.shape],
            "data_offsets": [offset, offset + nbytes],
        }
        arrays.append(array)
        offset += nbytes
    names = [name for name, _ in weights]
    metadata = {ARGUMENT_ORDER_KEY: json.dumps(names)} if names else {}
    encoded = json.dumps({"__metadata__": metadata, **header}, separators=(",", ":")).encode()
    encoded += b" " * (-(8 + len(encoded)) % _HEADER_ALIGN)
    with open(path, "xb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for array in arrays:
            if array.size:
                # A byte view exports a buffer for every dtype, ml_dtypes' included.
                f.write(array.reshape(-1).view(np.uint8).data)
        f.flush()
        os.fsync(f.fileno())
    return offset
