"""The memory of a CPU arena: one slab, carved first-fit into 64-byte-aligned blocks.

A GPU allocator (PJRT's BFC) reserves its memory once and hands out blocks of it, so a weight
load is one DMA into pages that are already there. The arena does the same on the CPU: its slab
is reserved at start-up (faulted in on first touch, then kept), a load copies each array into a
block of it, and the backend wraps the block as a device buffer without a second copy (PJRT's
CPU client aliases 64-byte-aligned host memory). Allocating fresh memory per load instead would
make every load pay the kernel's page faults (~4x slower than the copy here), a cost no device
allocator has. Pure NumPy: the jax side lives in :mod:`reactantserver.worker.runtime.jax_backend`::

    book = ArenaBook(CpuArena(1 << 30))
    block = book.allocate(host.nbytes)          # raises a device-OOM-worded error when full
    view = book.view(block, host.shape, host.dtype)
    np.copyto(view, host)                       # the load's copy
    book.free(block)                            # when the buffer is freed or collected
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import attrs
import numpy as np

from reactantserver.worker.runtime.backend import CpuArena

__all__ = ["ALIGNMENT", "ArenaBook", "Block"]

#: Block alignment: what PJRT's CPU client needs to alias host memory instead of copying it.
ALIGNMENT = 64


@attrs.frozen
class Block:
    """A piece of the slab: its offset and its (aligned) size in bytes."""

    offset: int
    size: int


def _aligned(nbytes: int) -> int:
    return max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)


class ArenaBook:
    """The slab of a :class:`CpuArena`, its free blocks and its bytes in use (thread-safe).

    ``in_use`` and ``peak`` count aligned block sizes, as a device allocator reports them.
    """

    def __init__(self, spec: CpuArena) -> None:
        self.spec = spec
        self.in_use = 0
        self.peak = 0
        self._lock = threading.Lock()
        raw = np.empty(spec.capacity_bytes + ALIGNMENT, np.uint8)  # untouched pages: no RSS yet
        skip = -raw.ctypes.data % ALIGNMENT
        self._slab = raw[skip : skip + spec.capacity_bytes]
        self._free: list[Block] = [Block(0, spec.capacity_bytes)]  # by offset, never adjacent
        self._held: dict[int, weakref.finalize[Any, Any]] = {}

    def allocate(self, nbytes: int) -> Block:
        """The first free block that fits ``nbytes`` (aligned up); a device-OOM error if none."""
        size = _aligned(nbytes)
        with self._lock:
            for i, hole in enumerate(self._free):
                if hole.size >= size:
                    rest = Block(hole.offset + size, hole.size - size)
                    self._free[i : i + 1] = [rest] if rest.size else []
                    self.in_use += size
                    self.peak = max(self.peak, self.in_use)
                    return Block(hole.offset, size)
            largest = max((h.size for h in self._free), default=0)
        # The words a device allocator uses, so the OOM handling treats it as one.
        raise RuntimeError(
            f"RESOURCE_EXHAUSTED: Out of memory in the CPU arena allocating {nbytes} bytes "
            f"({self.in_use} of {self.spec.capacity_bytes} in use, largest free block {largest})"
        )

    def free(self, block: Block) -> None:
        """Return ``block``, merged with the free blocks beside it."""
        with self._lock:
            self.in_use -= block.size
            holes = self._free
            i = 0
            while i < len(holes) and holes[i].offset < block.offset:
                i += 1
            merged = block
            if i < len(holes) and merged.offset + merged.size == holes[i].offset:
                merged = Block(merged.offset, merged.size + holes.pop(i).size)
            if i > 0 and holes[i - 1].offset + holes[i - 1].size == merged.offset:
                i -= 1
                merged = Block(holes[i].offset, holes.pop(i).size + merged.size)
            holes.insert(i, merged)

    def view(self, block: Block, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """The block as a writable array of ``shape`` and ``dtype`` (its start is aligned)."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        start = block.offset
        return self._slab[start : start + nbytes].view(dtype).reshape(shape)

    def hold(self, owner: object, block: Block) -> None:
        """Free ``block`` when ``owner`` (the device buffer over it) is released or collected."""
        self._held[id(owner)] = weakref.finalize(owner, self._drop, id(owner), block)

    def release(self, owner: object) -> None:
        """Free the block of ``owner`` now (idempotent; nothing if it holds none)."""
        done = self._held.get(id(owner))
        if done is not None:
            done()

    def _drop(self, key: int, block: Block) -> None:
        self._held.pop(key, None)
        self.free(block)
