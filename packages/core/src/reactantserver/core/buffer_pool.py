"""Fixed-size staging allocator: equal slots over one mapping, handed out FIFO.

Used by the client for SHM staging pools and by meta models for scratch memory::

    pool = BufferPool(64 << 20, 16)                  # 16 slots of 4 MiB, plain memory
    with pool.acquire(span=2, deadline_ns=deadline) as slot:
        x, mask = slot.scratch([((3, 4), np.float32), ((3,), np.int32)])
        offset, view = slot.carve(1024)              # offset is relative to the pool start

With ``shm_key`` the pool is one POSIX SHM object ``/dev/shm/<key>`` that a server can map,
so a carve's ``offset`` is directly a region offset on the wire.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import attrs
import numpy as np
import numpy.typing as npt

from reactantserver.core._buffer_slot import DEFAULT_ALIGN, ScratchSpec, Slot
from reactantserver.core.errors import PoolAcquireTimeout

__all__ = ["DEFAULT_ALIGN", "SHM_DIR", "BufferPool", "ScratchSpec", "Slot", "shm_path"]

_log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
"""Where SHM-backed pools live; the key ``/name`` (or ``name``) is the file ``SHM_DIR/name``."""


def shm_path(key: str) -> Path:
    """The file under ``/dev/shm`` a key (``/name`` or ``name``) names; ``ValueError`` otherwise.

    For the client side, which owns the object; the server's registry applies the same rule
    with its own status (``shm.resolve_key``).
    """
    # Same rule as the server's registry, so a pool key is a
    # region key the server resolves to this very file.
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise ValueError(f"shm key {key!r} must be a single path component, e.g. '/my_region'")
    return Path(SHM_DIR) / name


@attrs.define(eq=False)
class _Waiter:
    span: int
    wake: Callable[[], None]
    start: int | None = None


class BufferPool:
    """``n_slots`` equal slots over one mapping, acquired in runs of adjacent slots.

    Slot size is ``nbytes // n_slots``. Backing is an anonymous mapping, or the POSIX SHM
    object ``/dev/shm/<shm_key>`` created (mode ``shm_mode``) and finally unlinked by the
    pool. Waiters are served strictly first come, first served, so a large span is never
    starved by small ones. Thread-safe.
    """

    def __init__(
        self, nbytes: int, n_slots: int, *, shm_key: str | None = None, shm_mode: int = 0o600
    ) -> None:
        if n_slots < 1:
            raise ValueError(f"n_slots must be >= 1, got {n_slots}")
        if nbytes < n_slots:
            raise ValueError(f"nbytes ({nbytes}) must give every one of {n_slots} slots a byte")
        self._nbytes = nbytes
        self._n_slots = n_slots
        self._slot_nbytes = nbytes // n_slots
        self._shm_key = shm_key
        self._shm_path = None if shm_key is None else shm_path(shm_key)
        self._mmap = self._map(nbytes, shm_mode)
        self._view = memoryview(self._mmap)
        probe = np.frombuffer(self._view, np.uint8, count=1)
        self._base = int(probe.ctypes.data)
        del probe  # the export must end, or close() could not unmap
        self._lock = threading.Lock()
        self._free = [True] * n_slots
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._closed = False

    def _map(self, nbytes: int, mode: int) -> mmap.mmap:
        if self._shm_path is None:
            return mmap.mmap(-1, nbytes)
        fd = os.open(self._shm_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)
            # Reserve the pages: a full /dev/shm fails here, not with SIGBUS on first write.
            os.posix_fallocate(fd, 0, nbytes)
            return mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
        except BaseException:
            self._shm_path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)

    # -- geometry -----------------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Size of the mapping (``n_slots * slot_nbytes`` of it is handed out)."""
        return self._nbytes

    @property
    def n_slots(self) -> int:
        """Number of slots."""
        return self._n_slots

    @property
    def slot_nbytes(self) -> int:
        """Bytes per slot: ``nbytes // n_slots``."""
        return self._slot_nbytes

    @property
    def shm_key(self) -> str | None:
        """The SHM key as given (``None`` for plain memory)."""
        return self._shm_key

    @property
    def shm_path(self) -> Path | None:
        """The SHM object's file (``None`` for plain memory)."""
        return self._shm_path

    def offset_of(self, data: npt.NDArray[Any]) -> int | None:
        """Byte offset of ``data``'s memory within the mapping, or ``None`` if it lies outside.

        Lets a caller turn a scratch array back into a ``(pool, offset)`` reference, e.g. a
        shared-memory region offset on the wire. Always ``None`` once the pool is closed.
        """
        if self._closed:
            return None
        start = int(data.__array_interface__["data"][0])
        offset = start - self._base
        if offset < 0 or offset + data.nbytes > self._nbytes:
            return None
        return offset

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._closed

    @property
    def free_slots(self) -> int:
        """Slots not held by anyone right now."""
        with self._lock:
            return sum(self._free)

    @property
    def waiting(self) -> int:
        """Acquirers queued right now."""
        with self._lock:
            return len(self._waiters)

    # -- acquire / release --------------------------------------------------------------------

    def acquire(self, span: int = 1, deadline_ns: int | None = None) -> Slot:
        """Block until ``span`` adjacent slots are free and this caller is first in line.

        ``deadline_ns`` is absolute ``time.monotonic_ns()``; ``None`` waits forever. Raises
        :class:`PoolAcquireTimeout` when the deadline passes first (the caller leaves the
        queue), ``ValueError`` for a span outside ``1..n_slots`` or a closed pool. A free
        run is handed out at once even if the deadline has already passed.
        """
        self._check_span(span)
        event = threading.Event()
        with self._lock:
            slot = self._take_now(span)
            if slot is not None:
                return slot
            waiter = _Waiter(span, event.set)
            self._waiters.append(waiter)
        try:
            while not event.is_set():
                if deadline_ns is None:
                    event.wait()
                    continue
                remaining = deadline_ns - time.monotonic_ns()
                if remaining <= 0:
                    break
                event.wait(remaining / 1e9)
        except BaseException:
            self._abandon(waiter)
            raise
        return self._settle(waiter, deadline_ns)

    async def acquire_async(self, span: int = 1, deadline_ns: int | None = None) -> Slot:
        """:meth:`acquire` for asyncio callers; a cancelled waiter leaves the queue."""
        self._check_span(span)
        loop = asyncio.get_running_loop()
        granted: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_resolve, granted)

        with self._lock:
            slot = self._take_now(span)
            if slot is not None:
                return slot
            waiter = _Waiter(span, wake)
            self._waiters.append(waiter)
        try:
            while not granted.done():
                if deadline_ns is None:
                    await asyncio.wait({granted})
                    continue
                remaining = deadline_ns - time.monotonic_ns()
                if remaining <= 0:
                    break
                await asyncio.wait({granted}, timeout=remaining / 1e9)
        except BaseException:
            self._abandon(waiter)
            raise
        return self._settle(waiter, deadline_ns)

    def _check_span(self, span: int) -> None:
        if not 1 <= span <= self._n_slots:
            raise ValueError(f"span must be between 1 and {self._n_slots}, got {span}")

    def _take_now(self, span: int) -> Slot | None:
        """Under the lock: a run for a caller only when nobody is waiting ahead of it."""
        if self._closed:
            raise ValueError("buffer pool is closed")
        if self._waiters:
            return None
        start = self._take_run(span)
        return None if start is None else self._slot(start, span)

    def _settle(self, waiter: _Waiter, deadline_ns: int | None) -> Slot:
        with self._lock:
            if self._closed:
                raise ValueError("buffer pool was closed while waiting")
            if waiter.start is not None:
                return self._slot(waiter.start, waiter.span)
            self._waiters.remove(waiter)
            # The timed-out waiter may have been the one holding everyone else back.
            self._grant()
        raise PoolAcquireTimeout(
            f"no run of {waiter.span} free slot(s) out of {self._n_slots} before the deadline "
            f"({deadline_ns} ns)"
        )

    def _abandon(self, waiter: _Waiter) -> None:
        with self._lock:
            if self._closed:
                return
            if waiter.start is not None:
                self._free_run(waiter.start, waiter.span)
                waiter.start = None
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            self._grant()

    def _take_run(self, span: int) -> int | None:
        run = 0
        for index, free in enumerate(self._free):
            run = run + 1 if free else 0
            if run == span:
                start = index - span + 1
                self._free[start : index + 1] = [False] * span
                return start
        return None

    def _free_run(self, start: int, span: int) -> None:
        self._free[start : start + span] = [True] * span

    def _grant(self) -> None:
        """Under the lock: serve waiters from the head of the queue while runs are free."""
        while self._waiters:
            waiter = self._waiters[0]
            start = self._take_run(waiter.span)
            if start is None:
                return
            self._waiters.popleft()
            waiter.start = start
            try:
                waiter.wake()
            except RuntimeError:
                # Its event loop is gone; nobody will ever pick the run up.
                self._free_run(start, waiter.span)
                waiter.start = None

    def _slot(self, start: int, span: int) -> Slot:
        begin = start * self._slot_nbytes
        return Slot(self, start, span, self._view[begin : begin + span * self._slot_nbytes])

    def _release(self, slot: Slot) -> None:
        with self._lock:
            if slot._released:
                raise ValueError(f"{slot!r} released twice")
            slot._released = True
            if self._closed:
                return
            self._free_run(slot.index, slot.span)
            self._grant()

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Fail pending waiters, unmap, and unlink the SHM object; idempotent.

        Memory still referenced by live slots or arrays stays mapped until they are gone.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiters = list(self._waiters)
            self._waiters.clear()
            for waiter in waiters:
                with contextlib.suppress(RuntimeError):
                    waiter.wake()
        self._view.release()
        try:
            self._mmap.close()
        except BufferError:
            _log.debug("buffer pool memory still referenced; unmapped when collected")
        if self._shm_path is not None:
            self._shm_path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        where = f"shm_key={self._shm_key!r}" if self._shm_key is not None else "anonymous"
        return (
            f"BufferPool(nbytes={self._nbytes}, n_slots={self._n_slots}, "
            f"slot_nbytes={self._slot_nbytes}, {where})"
        )


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
