"""Staging pools: large inputs written once into reusable (optionally shared) memory.

A :class:`StagingPool` is a core ``BufferPool`` whose backing is a POSIX SHM object the server
can map (``shm=True``) or plain memory. Batched IO drivers hand each chunk a
:class:`StagingSlot`; ``encode_chunk`` carves its input arrays from it and wraps them with
``InferInput.from_slot``::

    x, mask = slot.scratch([("INPUT__0", (3, 4), np.float32), ("MASK", (3,), np.int32)])
"""

from __future__ import annotations

import os
import secrets
import threading
import weakref
from collections.abc import Sequence
from typing import Any, overload

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

_LIVE: weakref.WeakSet[StagingPool] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


class StagingPool(BufferPool):
    """``slots`` equal slots over ``nbytes`` of shared (``shm=True``) or plain memory.

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
        super().__init__(nbytes, slots, shm_key=f"/{self._name}" if shm else None, shm_mode=mode)
        with _LIVE_LOCK:
            _LIVE.add(self)

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
        """Contiguous arrays carved from the slot, one after the other (64-byte aligned).

        ``scratch(shape, dtype)`` gives one array; a list of ``(shape, dtype)`` or of named
        ``(name, shape, dtype)`` specs gives a list of arrays in that order (the names only
        document which input each buffer is for).
        """
        if dtype is not None:
            return self._slot.scratch(shape, dtype)
        specs = [spec[1:] if len(spec) == 3 else spec for spec in shape]
        return self._slot.scratch(specs)


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
    """Every pool not yet collected (shutdown closes them)."""
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
