"""One acquired run of buffer-pool slots, and the carving of aligned pieces out of it.

:class:`Slot` is what ``BufferPool.acquire`` hands out: a writeable view of ``span``
adjacent slots that its owner carves into aligned byte ranges or numpy scratch arrays, then
releases back to the pool. Offsets are relative to the pool start, so for an SHM-backed pool
they are region offsets on the wire. Import these names from ``reactantserver.core.buffer_pool``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Protocol, TypeAlias, overload

import numpy as np
import numpy.typing as npt

__all__ = ["DEFAULT_ALIGN", "ScratchSpec", "Slot", "SlotPool"]

DEFAULT_ALIGN = 64
"""Default alignment of carved buffers (cache line, and what XLA wants for host buffers)."""

ScratchSpec: TypeAlias = tuple[int | Sequence[int], npt.DTypeLike]
"""``(shape, dtype)`` of one scratch array."""


def _check_align(align: int) -> None:
    if align < 1 or align & (align - 1):
        raise ValueError(f"align must be a positive power of two, got {align}")


def _normalise_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    dims = (int(shape),) if isinstance(shape, int | np.integer) else tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in shape {dims}")
    return dims


class SlotPool(Protocol):
    """What a :class:`Slot` needs of the pool that handed it out (``BufferPool``)."""

    @property
    def slot_nbytes(self) -> int:
        """Bytes per slot."""

    def _release(self, slot: Slot) -> None:
        """Take the run of ``slot`` back; ``ValueError`` if it was already released."""


class Slot:
    """A run of ``span`` adjacent pool slots held by one owner until :meth:`release`.

    ``offset``/``nbytes`` locate it in the pool (and so in the SHM region); carving hands
    out sequential, aligned pieces of it. Use it as a context manager to release on exit.
    """

    def __init__(self, pool: SlotPool, index: int, span: int, buffer: memoryview) -> None:
        self._pool = pool
        self._index = index
        self._span = span
        self._offset = index * pool.slot_nbytes
        self._buffer = buffer
        self._cursor = 0
        self._released = False
        self._lock = threading.Lock()

    @property
    def pool(self) -> SlotPool:
        """The pool this slot belongs to."""
        return self._pool

    @property
    def index(self) -> int:
        """Index of the first pool slot of the run."""
        return self._index

    @property
    def span(self) -> int:
        """Number of adjacent pool slots held."""
        return self._span

    @property
    def offset(self) -> int:
        """Byte offset of the run from the start of the pool (the SHM region offset)."""
        return self._offset

    @property
    def nbytes(self) -> int:
        """Bytes held: ``span * pool.slot_nbytes``."""
        return len(self._buffer)

    @property
    def buffer(self) -> memoryview:
        """The whole run, writeable; valid only until :meth:`release`."""
        return self._buffer

    @property
    def used(self) -> int:
        """Bytes consumed by carving so far, alignment padding included."""
        return self._cursor

    @property
    def released(self) -> bool:
        """Whether :meth:`release` has run."""
        return self._released

    def carve(self, nbytes: int, align: int = DEFAULT_ALIGN) -> tuple[int, memoryview]:
        """The next ``nbytes`` of the run at a pool offset that is a multiple of ``align``.

        Returns ``(offset from the pool start, view)``; pieces may straddle slot boundaries
        inside the run. ``ValueError`` when the run has no room left.
        """
        ((offset, view),) = self._carve_many([nbytes], align)
        return offset, view

    @overload
    def scratch(self, shape: int | Sequence[int], dtype: npt.DTypeLike) -> npt.NDArray[Any]: ...

    @overload
    def scratch(self, shape: Sequence[ScratchSpec]) -> list[npt.NDArray[Any]]: ...

    def scratch(
        self, shape: Any, dtype: npt.DTypeLike | None = None
    ) -> npt.NDArray[Any] | list[npt.NDArray[Any]]:
        """Carve C-contiguous arrays aliasing the pool: ``scratch(shape, dtype)`` for one,
        ``scratch([(shape, dtype), ...])`` for several (disjoint, each 64-byte aligned).

        All or nothing: when the specs do not fit, ``ValueError`` and nothing is carved.
        """
        if dtype is not None:
            return self._arrays([(shape, dtype)])[0]
        return self._arrays(list(shape))

    def _arrays(self, specs: Sequence[ScratchSpec]) -> list[npt.NDArray[Any]]:
        shapes: list[tuple[int, ...]] = []
        dtypes: list[np.dtype[Any]] = []
        for spec_shape, spec_dtype in specs:
            dt = np.dtype(spec_dtype)
            if dt.hasobject or dt.itemsize == 0:
                raise ValueError(f"scratch arrays need a fixed-size dtype, got {dt}")
            shapes.append(_normalise_shape(spec_shape))
            dtypes.append(dt)
        sizes = [math.prod(s) * dt.itemsize for s, dt in zip(shapes, dtypes, strict=True)]
        pieces = self._carve_many(sizes, DEFAULT_ALIGN)
        return [
            np.frombuffer(view, dtype=dt, count=math.prod(s)).reshape(s)
            for (_, view), s, dt in zip(pieces, shapes, dtypes, strict=True)
        ]

    def _carve_many(self, sizes: Sequence[int], align: int) -> list[tuple[int, memoryview]]:
        _check_align(align)
        if any(n < 0 for n in sizes):
            raise ValueError(f"cannot carve a negative number of bytes: {list(sizes)}")
        with self._lock:
            if self._released:
                raise ValueError("slot already released")
            cursor = self._cursor
            bounds = []
            for n in sizes:
                start = -(-(self._offset + cursor) // align) * align - self._offset
                if start + n > self.nbytes:
                    raise ValueError(
                        f"carving {n} bytes (align {align}) at {cursor} overflows the "
                        f"{self.nbytes}-byte slot span"
                    )
                bounds.append((start, start + n))
                cursor = start + n
            self._cursor = cursor
        return [(self._offset + a, self._buffer[a:b]) for a, b in bounds]

    def release(self) -> None:
        """Return the run to the pool; ``ValueError`` if already released."""
        self._pool._release(self)

    def __enter__(self) -> Slot:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._released:
            self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else f"used={self._cursor}"
        return f"Slot(index={self._index}, span={self._span}, offset={self._offset}, {state})"
