"""Tensor-level pieces shared by the codec's directions: headers, sizes, placement, payloads."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import attrs
import numpy as np

from reactantserver.core.codec._bytes import parse_bytes, serialize_bytes
from reactantserver.core.codec._params import int_param, string_param
from reactantserver.core.dtypes import DType
from reactantserver.core.errors import InvalidArgumentError, RegionNotRegisteredError
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.shm import SharedMemoryRegistry
from reactantserver.core.types import ShmRef

#: A tensor's element count must stay below this (keeps byte counts far from int64 overflow).
MAX_ELEMENTS = 1 << 62

#: Tensor parameters that place an input or output in a registered shared-memory region.
SHM_REGION = "shared_memory_region"
SHM_OFFSET = "shared_memory_offset"
SHM_BYTE_SIZE = "shared_memory_byte_size"


@attrs.frozen
class TensorHeader:
    """A tensor header that passed the size checks, before any of its data is touched."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    elements: int
    nbytes: int | None  # None for BYTES: the size is only known from the data
    shm: ShmRef | None
    what: str


def wire_dtype(datatype: str, what: str) -> DType:
    """The dtype a KServe datatype string names; ``InvalidArgumentError`` if none."""
    try:
        return DType.from_kserve(datatype)
    except ValueError:
        raise InvalidArgumentError(f"{what}: unknown datatype {datatype!r}") from None


def checked_shape(dims: Sequence[int], what: str) -> tuple[tuple[int, ...], int]:
    """The shape and its element count, rejecting negative dims and counts ≥ 2**62."""
    shape = tuple(dims)
    for dim in shape:
        if dim < 0:
            raise InvalidArgumentError(f"{what}: negative dimension in shape {list(shape)}")
    if 0 in shape:
        return shape, 0
    elements = 1
    for dim in shape:
        # Checked at every step so the running product never leaves the allowed range.
        elements *= dim
        if elements >= MAX_ELEMENTS:
            raise InvalidArgumentError(
                f"{what}: shape {list(shape)} has too many elements (limit 2**62)"
            )
    return shape, elements


def shm_ref(params: Mapping[str, pb.InferParameter], what: str) -> ShmRef | None:
    """The shared-memory placement a tensor's parameters ask for, or ``None``."""
    region = string_param(params, SHM_REGION, what)
    if region is None:
        stray = [key for key in (SHM_OFFSET, SHM_BYTE_SIZE) if key in params]
        if stray:
            raise InvalidArgumentError(f"{what}: parameter {stray[0]!r} without {SHM_REGION!r}")
        return None
    if not region:
        raise InvalidArgumentError(f"{what}: parameter {SHM_REGION!r} is empty")
    byte_size = int_param(params, SHM_BYTE_SIZE, what)
    if byte_size is None:
        raise InvalidArgumentError(
            f"{what}: parameter {SHM_BYTE_SIZE!r} is required with {SHM_REGION!r}"
        )
    offset = int_param(params, SHM_OFFSET, what) or 0
    if offset < 0:
        raise InvalidArgumentError(f"{what}: parameter {SHM_OFFSET!r} is negative ({offset})")
    if byte_size < 0:
        raise InvalidArgumentError(f"{what}: parameter {SHM_BYTE_SIZE!r} is negative")
    return ShmRef(region, offset, byte_size)


def require_registry(
    registry: SharedMemoryRegistry | None, ref: ShmRef, what: str
) -> SharedMemoryRegistry:
    """``registry``, or ``RegionNotRegisteredError`` when there is none to hold ``ref``."""
    if registry is None:
        raise RegionNotRegisteredError(f"{what}: unregistered shared memory region {ref.region!r}")
    return registry


def set_shm_params(params: MutableMapping[str, pb.InferParameter], ref: ShmRef) -> None:
    """Write the three shared-memory tensor parameters for ``ref``."""
    params[SHM_REGION].string_param = ref.region
    params[SHM_OFFSET].int64_param = ref.offset
    params[SHM_BYTE_SIZE].int64_param = ref.byte_size


def raw_array(buf: bytes, header: TensorHeader, source: str) -> np.ndarray[Any, Any]:
    """A zero-copy read-only array over ``buf`` (BYTES: parsed into an object array)."""
    if header.nbytes is None:
        return parse_bytes(buf, header.shape, header.what)
    if len(buf) != header.nbytes:
        raise InvalidArgumentError(
            f"{header.what}: {source} has {len(buf)} bytes, shape {list(header.shape)} of "
            f"{header.dtype.kserve} needs {header.nbytes}"
        )
    return checked_bool(
        np.frombuffer(buf, dtype=header.dtype.numpy).reshape(header.shape), header.what
    )


def checked_bool(array: np.ndarray[Any, Any], what: str) -> np.ndarray[Any, Any]:
    """``array``, after making sure a BOOL array holds only 0 and 1 bytes."""
    # A BOOL byte other than 0/1 is not a NumPy bool and compares inconsistently downstream.
    if array.dtype == np.bool_ and array.size and array.view(np.uint8).max() > 1:
        raise InvalidArgumentError(f"{what}: BOOL data hold bytes other than 0 and 1")
    return array


def wire_array(data: np.ndarray[Any, Any], what: str) -> tuple[np.ndarray[Any, Any], DType]:
    """``data`` with little-endian byte order, and its wire dtype (``ValueError`` if none)."""
    array = np.asarray(data)
    if array.dtype.kind in "OSU":
        return array, DType.BYTES
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    try:
        dtype = DType.from_numpy(array.dtype)
        dtype.kserve  # noqa: B018 - raises for dtypes without a wire form (FP8)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    return array, dtype


def wire_payload(array: np.ndarray[Any, Any], dtype: DType, what: str) -> memoryview:
    """The wire bytes of ``array`` as a flat byte view (one copy at most)."""
    if dtype is DType.BYTES:
        return memoryview(serialize_bytes(array, what))
    flat: Any = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return memoryview(flat)
