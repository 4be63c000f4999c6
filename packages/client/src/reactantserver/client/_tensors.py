"""Tensors in and out: :class:`InferInput`, :class:`RequestedOutput`, :func:`InferOutput`.

Inputs carry NumPy arrays as raw row-major bytes, or reference bytes already in shared memory
(an explicit :class:`ShmRegion`, or a staging-pool slot). Outputs come back as zero-copy
NumPy views of the response.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from reactantserver.client._region import ShmRegion
from reactantserver.client._staging import StagingPool, pool_of
from reactantserver.core import codec
from reactantserver.core.dtypes import DType
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.types import ShmRef

__all__ = ["InferInput", "InferOutput", "RequestedOutput"]


def _wire_dtype(dtype: npt.DTypeLike, what: str) -> DType:
    dt = np.dtype(dtype)
    try:
        member = DType.from_numpy(dt)
        member.kserve  # noqa: B018 - raises for dtypes without a wire form
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    return member


class InferInput:
    """One named input of a request.

    ``InferInput(name, array)`` sends the array's bytes (row-major, shape = ``array.shape``,
    batch first); :meth:`from_shm` and :meth:`from_slot` reference shared memory instead.
    """

    __slots__ = ("_array", "_name", "_pool", "_pool_offset", "_shm")

    def __init__(self, name: str, data: npt.ArrayLike) -> None:
        array = np.asarray(data)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))  # the wire is little-endian
        _wire_dtype(array.dtype, f"input {name!r}")
        self._name = name
        self._array: npt.NDArray[Any] = array
        self._shm: ShmRef | None = None
        self._pool: StagingPool | None = None
        self._pool_offset = 0

    @classmethod
    def from_shm(
        cls,
        name: str,
        region: ShmRegion,
        offset: int,
        shape: Sequence[int],
        dtype: npt.DTypeLike,
    ) -> InferInput:
        """An input whose bytes are already at ``offset`` in a registered ``region``."""
        if np.dtype(dtype).byteorder == ">":
            raise ValueError(f"input {name!r}: shared memory holds little-endian data only")
        member = _wire_dtype(dtype, f"input {name!r}")
        if member is DType.BYTES:
            raise ValueError(f"input {name!r}: BYTES inputs cannot come from a region by shape")
        dims = tuple(int(d) for d in shape)
        nbytes = math.prod(dims) * member.itemsize
        if offset < 0 or offset + nbytes > region.nbytes:
            raise ValueError(
                f"input {name!r}: {nbytes} bytes at offset {offset} do not fit region "
                f"{region.name!r} of {region.nbytes} bytes"
            )
        self = cls(name, np.broadcast_to(np.zeros((), member.numpy), dims))
        self._shm = ShmRef(region.name, offset, nbytes)
        return self

    @classmethod
    def from_slot(cls, name: str, buffer: npt.NDArray[Any]) -> InferInput:
        """An input over an array carved from a :class:`StagingPool` slot.

        Sent in place (a reference into the pool) when the server shares this machine's
        ``/dev/shm``, as bytes otherwise; the choice is made per request.
        """
        found = pool_of(buffer)
        if found is None:
            raise ValueError(f"input {name!r}: the buffer was not carved from a live StagingPool")
        if not buffer.flags.c_contiguous:
            raise ValueError(f"input {name!r}: the buffer must be C-contiguous")
        self = cls(name, buffer)
        pool, offset = found
        if pool.shm:
            self._pool, self._pool_offset = pool, offset
        return self

    @property
    def name(self) -> str:
        """The input's name."""
        return self._name

    @property
    def shape(self) -> tuple[int, ...]:
        """The wire shape."""
        return tuple(self._array.shape)

    @property
    def datatype(self) -> str:
        """The KServe datatype (``"FP32"``, ...)."""
        return DType.from_numpy(self._array.dtype).kserve

    @property
    def pool(self) -> StagingPool | None:
        """The SHM staging pool the input may be sent from in place."""
        return self._pool

    @property
    def array(self) -> npt.NDArray[Any]:
        """The data (a zero-stride placeholder for :meth:`from_shm` inputs)."""
        return self._array

    def placement(self, shm_pools: frozenset[str]) -> ShmRef | None:
        """Where the input goes on the wire: a region range, or ``None`` for inline bytes."""
        if self._shm is not None:
            return self._shm
        if self._pool is not None and self._pool.name in shm_pools:
            return ShmRef(self._pool.name, self._pool_offset, self._array.nbytes)
        return None

    def __repr__(self) -> str:
        return f"InferInput({self._name!r}, {self.datatype}{list(self.shape)})"


@attrs.frozen
class RequestedOutput:
    """An output asked for by name, optionally written by the server into shared memory.

    ``RequestedOutput("y")`` comes back inline; :meth:`to_shm` asks for it in a registered
    region (read it with :meth:`ShmRegion.read`).
    """

    name: str
    shm: ShmRef | None = None
    pool: StagingPool | None = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def to_shm(cls, name: str, region: ShmRegion, offset: int, byte_size: int) -> RequestedOutput:
        """Ask for output ``name`` in ``byte_size`` bytes at ``offset`` of ``region``."""
        if offset < 0 or byte_size < 1 or offset + byte_size > region.nbytes:
            raise ValueError(
                f"output {name!r}: {byte_size} bytes at offset {offset} do not fit region "
                f"{region.name!r} of {region.nbytes} bytes"
            )
        return cls(name, ShmRef(region.name, offset, byte_size))

    def placement(self, shm_pools: frozenset[str]) -> ShmRef | None:
        """Where the server should put it: a region range, or ``None`` for inline."""
        if self.pool is not None and self.pool.name not in shm_pools:
            return None
        return self.shm


def InferOutput(
    response: pb.ModelInferResponse, name: str, dtype: npt.DTypeLike | None = None
) -> npt.NDArray[Any]:
    """Output ``name`` of ``response`` as a zero-copy read-only array in its wire shape.

    ``dtype`` defaults to the response's datatype (BF16 needs ``ml_dtypes``, else its raw
    ``uint16`` bits); BYTES outputs are object arrays of ``bytes``. An output the server wrote
    into a hand-registered region is read with :meth:`ShmRegion.read` instead.
    """
    index = next((i for i, t in enumerate(response.outputs) if t.name == name), None)
    if index is None:
        names = [t.name for t in response.outputs]
        raise KeyError(f"response has no output {name!r} (it has {names})")
    tensor = response.outputs[index]
    array = codec.decode_output(response, index)
    if array is None:
        region = tensor.parameters[codec.SHM_REGION].string_param
        raise ValueError(
            f"output {name!r} was written to shared memory region {region!r}; "
            "read it with ShmRegion.read"
        )
    if dtype is None or np.dtype(dtype) == array.dtype:
        return array
    wanted = np.dtype(dtype)
    if array.dtype.kind == "O" or wanted.itemsize != array.dtype.itemsize:
        raise ValueError(
            f"output {name!r} is {tensor.datatype}; cannot view it as {wanted} "
            "(the element size must match)"
        )
    return array.view(wanted)
