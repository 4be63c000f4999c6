"""The BYTES tensor wire form: per element a 4-byte little-endian length, then the bytes."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from reactantserver.core.errors import InvalidArgumentError

_LENGTH = struct.Struct("<I")
_MAX_ELEMENT = (1 << 32) - 1


def parse_bytes(buf: bytes | memoryview, shape: tuple[int, ...], what: str) -> np.ndarray[Any, Any]:
    """Split ``buf`` into exactly ``prod(shape)`` elements: an ``object`` array of ``bytes``.

    Malformed framing (short prefix, element past the end, wrong count, trailing bytes) is an
    ``InvalidArgumentError`` naming ``what``.
    """
    elements = 1
    for dim in shape:
        elements *= dim
    size = len(buf)
    # Every element costs at least its 4-byte prefix; checking that first keeps a huge
    # declared shape from allocating the object array.
    if elements * _LENGTH.size > size:
        raise InvalidArgumentError(
            f"{what}: BYTES data of {size} bytes cannot hold {elements} elements"
        )
    out = np.empty(elements, dtype=object)
    pos = 0
    for i in range(elements):
        if pos + _LENGTH.size > size:
            raise InvalidArgumentError(
                f"{what}: BYTES element {i} has a truncated length prefix at byte {pos}"
            )
        (length,) = _LENGTH.unpack_from(buf, pos)
        pos += _LENGTH.size
        end = pos + length
        if end > size:
            raise InvalidArgumentError(
                f"{what}: BYTES element {i} of length {length} runs past the end of the data"
            )
        out[i] = bytes(buf[pos:end])
        pos = end
    if pos != size:
        raise InvalidArgumentError(
            f"{what}: {size - pos} trailing bytes after {elements} BYTES elements"
        )
    return out.reshape(shape)


def element_bytes(item: object, what: str) -> bytes:
    """One element of a BYTES tensor as ``bytes`` (``str`` is encoded as UTF-8)."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, bytearray | memoryview):
        return bytes(item)
    raise ValueError(f"{what}: BYTES element of type {type(item).__name__} is not bytes or str")


def serialize_bytes(array: np.ndarray[Any, Any], what: str) -> bytes:
    """The wire form of a BYTES tensor, elements in row-major order."""
    parts: list[bytes] = []
    for item in array.ravel(order="C"):
        data = element_bytes(item, what)
        if len(data) > _MAX_ELEMENT:
            raise ValueError(f"{what}: BYTES element of {len(data)} bytes exceeds 4 GiB")
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)
