"""Staging pools: large inputs written once into reusable (optionally shared) memory.

A :class:`StagingPool` is a core ``BufferPool`` whose backing is a POSIX SHM object the server
can map (``shm=True``) or plain memory. Batched IO drivers hand each chunk a
:class:`StagingSlot`; ``encode_chunk`` carves its input arrays from it and wraps them with
``InferInput.from_slot``::

    x, mask = slot.scratch([("INPUT__0", (3, 4), np.float32), ("MASK", (3,), np.int32)])
"""

from __future__ import annotations

import math
import os
import secrets
import threading
from collections.abc import Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from reactantserver.core.buffer_pool import DEFAULT_ALIGN, BufferPool, ScratchSpec, Slot

__all__ = [
    "DEFAULT_POOL_BYTES",
    "DEFAULT_POOL_SLOTS",
    "StagingPool",
    "StagingSlot",
    "default_pool",
    "live_pools",
    "pool_of",
]

DEFAULT_POOL_BYTES = 256 << 20
DEFAULT_POOL_SLOTS = 8

_LIVE: set[StagingPool] = set()
"""Open pools, held until closed so ``shutdown`` can unlink every one of them."""
_LIVE_LOCK = threading.Lock()


class StagingPool(BufferPool):
    """``slots`` equal slots over ``nbytes`` of shared (``shm=True``) or plain memory.

    Slot sizes are rounded down to whole 64-byte lines (``nbytes`` shrinks by less than 64
    bytes per slot).

    The SHM object is ``/dev/shm/reactantserver-client-<pid>-<16 hex>``, created with ``mode``
    and unlinked by :meth:`close` (or :func:`~reactantserver.client.shutdown` at exit). Its
    registration name on servers is :attr:`name`.
    """

    def __init__(
        self,
        nbytes: int = DEFAULT_POOL_BYTES,
        slots: int = DEFAULT_POOL_SLOTS,
        *,
        shm: bool = True,
        mode: int = 0o600,
    ) -> None:
        self._name = f"reactantserver-client-{os.getpid()}-{secrets.token_hex(8)}"
        if slots >= 1 and nbytes // slots >= DEFAULT_ALIGN:
            # Whole cache lines per slot, so every slot starts aligned for any element type.
            nbytes = nbytes // slots // DEFAULT_ALIGN * DEFAULT_ALIGN * slots
        super().__init__(nbytes, slots, shm_key=f"/{self._name}" if shm else None, shm_mode=mode)
        with _LIVE_LOCK:
            _LIVE.add(self)

    def close(self) -> None:
        """Unmap and unlink the pool (idempotent); see ``BufferPool.close``."""
        with _LIVE_LOCK:
            _LIVE.discard(self)
        super().close()

    @property
    def name(self) -> str:
        """The region name servers know this pool by (also the SHM object's file name)."""
        return self._name

    @property
    def shm(self) -> bool:
        """Whether the pool lives in a POSIX SHM object a server can map."""
        return self.shm_key is not None

    def view(self, offset: int, nbytes: int) -> memoryview:
        """A copy-free view of ``nbytes`` at ``offset`` (bounds-checked)."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"{offset}+{nbytes} is outside the pool's {self.nbytes} bytes")
        return self._view[offset : offset + nbytes]

    def __repr__(self) -> str:
        where = f"shm {self.shm_key!r}" if self.shm else "plain memory"
        return f"StagingPool({self.nbytes} bytes, {self.n_slots} slots, {where})"


class StagingSlot:
    """The slot a batched IO driver lends ``encode_chunk``: carve inputs from it."""

    def __init__(self, slot: Slot) -> None:
        self._slot = slot
        self._tail = slot.offset + slot.nbytes

    @property
    def slot(self) -> Slot:
        """The core slot underneath."""
        return self._slot

    @property
    def pool(self) -> StagingPool:
        """The pool the slot belongs to."""
        pool = self._slot.pool
        assert isinstance(pool, StagingPool)
        return pool

    @property
    def offset(self) -> int:
        """Byte offset of the slot in the pool."""
        return self._slot.offset

    @property
    def nbytes(self) -> int:
        """Bytes the slot spans."""
        return self._slot.nbytes

    @property
    def used(self) -> int:
        """Bytes carved so far (padding included)."""
        return self._slot.used

    def carve(self, nbytes: int, align: int = DEFAULT_ALIGN) -> tuple[int, memoryview]:
        """``nbytes`` of the slot: its pool offset and a writable view."""
        return self._slot.carve(nbytes, align)

    @overload
    def scratch(self, shape: int | Sequence[int], dtype: npt.DTypeLike) -> npt.NDArray[Any]: ...

    @overload
    def scratch(self, shape: Sequence[ScratchSpec]) -> list[npt.NDArray[Any]]: ...

    @overload
    def scratch(
        self, shape: Sequence[tuple[str, int | Sequence[int], npt.DTypeLike]]
    ) -> list[npt.NDArray[Any]]: ...

    def scratch(self, shape: Any, dtype: Any = None) -> Any:
        """C-contiguous arrays carved from the slot, packed without padding.

        ``scratch(shape, dtype)`` gives one array; a list of ``(shape, dtype)`` or of named
        ``(name, shape, dtype)`` specs gives a list of arrays in that order (the names only
        document which input each buffer is for). Buffers are laid out largest element size
        first, each at its natural alignment, so a chunk whose items fill the slot exactly
        (``chunk * item_input_bytes == slot bytes``) always fits.
        """
        if dtype is not None:
            return self._pack([(shape, dtype)])[0]
        return self._pack([spec[1:] if len(spec) == 3 else spec for spec in shape])

    def _pack(self, specs: Sequence[Sequence[Any]]) -> list[npt.NDArray[Any]]:
        shapes = [_shape(s) for s, _ in specs]
        dtypes = [np.dtype(d) for _, d in specs]
        for dt in dtypes:
            if dt.hasobject or dt.itemsize == 0:
                raise ValueError(f"scratch arrays need a fixed-size dtype, got {dt}")
        # Decreasing element sizes (powers of two) keep every buffer aligned with no gaps.
        order = sorted(range(len(specs)), key=lambda k: -dtypes[k].itemsize)
        end = self._slot.offset + self._slot.used
        for i in order:  # all or nothing: check the whole layout before carving any of it
            align = natural_align(dtypes[i].itemsize)
            end = -(-end // align) * align + math.prod(shapes[i]) * dtypes[i].itemsize
        if end > min(self._tail, self._slot.offset + self._slot.nbytes):
            raise ValueError(
                f"scratch of {end - self._slot.offset - self._slot.used} bytes overflows the "
                f"slot ({self._slot.nbytes} bytes, {self._slot.used} used)"
            )
        arrays: list[npt.NDArray[Any] | None] = [None] * len(specs)
        for i in order:
            count = math.prod(shapes[i])
            size = dtypes[i].itemsize
            _, view = self._slot.carve(count * size, align=natural_align(size))
            arrays[i] = np.frombuffer(view, dtypes[i], count=count).reshape(shapes[i])
        return [a for a in arrays if a is not None]

    def carve_tail(self, nbytes: int, align: int) -> int:
        """Reserve ``nbytes`` at the end of the slot, below earlier tail carves; the offset.

        Used for outputs the server writes into the slot: inputs grow from the start, outputs
        from the end, so both fit whenever their total does.
        """
        end = (self._tail - nbytes) // align * align
        if nbytes < 0 or end < self._slot.offset + self._slot.used:
            raise ValueError(
                f"{nbytes} more bytes do not fit the slot ({self._slot.nbytes} bytes, "
                f"{self._slot.used} used by inputs)"
            )
        self._tail = end
        return end


def natural_align(itemsize: int) -> int:
    """The alignment an element of ``itemsize`` bytes wants (largest power of two dividing it)."""
    return min(DEFAULT_ALIGN, itemsize & -itemsize)


def _shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"scratch shape must not be negative, got {dims}")
    return dims


def pool_of(array: npt.NDArray[Any]) -> tuple[StagingPool, int] | None:
    """The live pool whose memory holds ``array``, and its byte offset there."""
    with _LIVE_LOCK:
        pools = list(_LIVE)
    for pool in pools:
        offset = pool.offset_of(array)
        if offset is not None:
            return pool, offset
    return None


def live_pools() -> list[StagingPool]:
    """Every pool not yet closed (``shutdown`` closes them)."""
    with _LIVE_LOCK:
        return list(_LIVE)


_DEFAULT: list[StagingPool] = []
_DEFAULT_LOCK = threading.Lock()


def default_pool() -> StagingPool:
    """The process's shared pool (256 MiB, 8 slots, SHM), created on first use."""
    with _DEFAULT_LOCK:
        if not _DEFAULT or _DEFAULT[0].closed:
            _DEFAULT[:] = [StagingPool()]
        return _DEFAULT[0]
