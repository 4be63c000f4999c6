"""Explicit system shared-memory regions, usable with this client or with ``tritonclient``.

::

    region = create_region("/my_inputs", 1 << 20)
    region.write(0, batch)                              # row-major bytes at offset 0
    register_region("grpc://127.0.0.1:8001", region)    # name defaults to "my_inputs"
    ...
    unregister_region("grpc://127.0.0.1:8001", region)
    region.close(unlink=True)

Objects are opened with ``os.open`` + ``mmap`` (never ``multiprocessing.shared_memory``,
whose resource tracker would unlink them behind the server's back).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from reactantserver.core.buffer_pool import shm_path

__all__ = ["ShmRegion", "create_region"]


class ShmRegion:
    """A mapped POSIX SHM object: write inputs into it, read outputs out of it."""

    def __init__(self, key: str, nbytes: int, *, mode: int = 0o600, create: bool = True) -> None:
        if nbytes < 1:
            raise ValueError(f"a region needs at least one byte, got {nbytes}")
        self._path = shm_path(key)
        self._key = "/" + self._path.name
        self.name = self._path.name
        """The name servers know it by (``register_region`` may set another)."""
        self._nbytes = nbytes
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        fd = os.open(self._path, flags, mode)
        try:
            if os.fstat(fd).st_size < nbytes:
                if not create:
                    raise ValueError(f"{self._path} is smaller than {nbytes} bytes")
                os.posix_fallocate(fd, 0, nbytes)
            self._mmap: mmap.mmap | None = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)

    @property
    def key(self) -> str:
        """The SHM key (``/name``) servers open."""
        return self._key

    @property
    def nbytes(self) -> int:
        """Mapped size."""
        return self._nbytes

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._mmap is None

    def _mapped(self) -> mmap.mmap:
        if self._mmap is None:
            raise ValueError(f"shared memory region {self.name!r} is closed")
        return self._mmap

    def _check(self, offset: int, nbytes: int) -> None:
        if offset < 0 or offset + nbytes > self._nbytes:
            raise ValueError(
                f"{nbytes} bytes at offset {offset} do not fit region {self.name!r} "
                f"of {self._nbytes} bytes"
            )

    def write(self, offset: int, array: npt.ArrayLike) -> int:
        """Copy ``array`` (row-major) to ``offset``; the number of bytes written."""
        data = np.ascontiguousarray(array)
        nbytes = data.nbytes
        self._check(offset, nbytes)
        self._mapped()[offset : offset + nbytes] = data.reshape(-1).view(np.uint8).data
        return nbytes

    def read(
        self, offset: int, shape: Sequence[int], dtype: npt.DTypeLike, *, copy: bool = True
    ) -> npt.NDArray[Any]:
        """The ``shape`` x ``dtype`` array at ``offset`` (a copy unless ``copy=False``)."""
        dt = np.dtype(dtype)
        count = math.prod(shape)
        self._check(offset, count * dt.itemsize)
        array = np.frombuffer(self._mapped(), dt, count=count, offset=offset).reshape(shape)
        return array.copy() if copy else array

    def close(self, *, unlink: bool = False) -> None:
        """Unmap (idempotent); ``unlink`` also removes the SHM object."""
        if self._mmap is not None:
            mapping, self._mmap = self._mmap, None
            # Arrays from read(copy=False) may still view it; then it is unmapped when collected.
            with contextlib.suppress(BufferError):
                mapping.close()
        if unlink:
            self._path.unlink(missing_ok=True)

    def __enter__(self) -> ShmRegion:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(unlink=True)

    def __repr__(self) -> str:
        return f"ShmRegion({self._key!r}, {self._nbytes} bytes, name={self.name!r})"


def create_region(key: str, nbytes: int, *, mode: int = 0o600) -> ShmRegion:
    """Create (or open and grow) the SHM object ``key`` and map ``nbytes`` of it."""
    return ShmRegion(key, nbytes, mode=mode, create=True)
