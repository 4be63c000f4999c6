"""Host floors in page-locked memory, so an on-demand load is one DMA at full bandwidth.

From pageable memory a GPU driver first copies each transfer through a staging buffer of its
own, which roughly halves host-to-device bandwidth. :class:`PageLockedSource` keeps a model's
host floor in the backend's page-locked memory instead (``Backend.page_lock``; jax's
``pinned_host`` memory space on a GPU). Where the backend has none (the CPU backend, a plugin
without the memory space), or the floor is shared across workers, floors stay pageable::

    source = floor_source(loaded.weight_source(store), backend, page_locked=True, shared=False)
    cache.add_model("resnet", source, Residency.PINNED_SYSTEM)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from reactantserver.worker.runtime._weight_source import HostArray, WeightSource
from reactantserver.worker.runtime.backend import Backend, HostBuffer

__all__ = ["PageLockedSource", "floor_source"]

_log = logging.getLogger("reactantserver.worker.runtime.weight_cache")


class PageLockedSource:
    """A :class:`WeightSource` whose host floor is a page-locked copy of another source's arrays.

    :meth:`keep_host` reads the weights through ``inner`` (a fresh read, no floor of its own),
    copies each array into page-locked memory and drops the read: one host copy, not two.
    Should page-locking fail (the driver refuses more pinned memory), the floor falls back to
    ``inner``'s pageable one, with a warning. Without a floor, :meth:`load` reads through
    ``inner`` (``UNPINNED``). :meth:`drop_host` gives the page-locked memory back.
    """

    def __init__(self, inner: WeightSource, backend: Backend, *, name: str = "") -> None:
        self._inner = inner
        self._backend = backend
        self._name = name
        self._locked: list[HostBuffer] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of all the weights."""
        return self._inner.nbytes

    @property
    def host_resident(self) -> bool:
        """Whether a floor is kept (page-locked, or the pageable fallback)."""
        return self._locked is not None or self._inner.host_resident

    @property
    def page_locked(self) -> bool:
        """Whether the floor is in page-locked memory now."""
        return self._locked is not None

    def load(self) -> Sequence[HostArray]:
        """The page-locked floor, else whatever ``inner`` gives (its floor or a fresh read)."""
        if self._locked is not None:
            return self._locked
        return self._inner.load()

    def keep_host(self) -> None:
        """Materialise the floor in page-locked memory (idempotent; reads the file)."""
        if self._locked is not None or self._inner.host_resident:
            return
        arrays = self._inner.load()
        locked: list[HostBuffer] = []
        try:
            for array in arrays:
                locked.append(self._backend.page_lock(array))
        except Exception as exc:
            for buf in locked:
                self._backend.free(buf)
            _log.warning(
                "cannot page-lock the host weights of %r (%d bytes): %s; keeping them pageable",
                self._name,
                self.nbytes,
                exc,
            )
            self._inner.keep_host()
            return
        self._locked = locked

    def drop_host(self) -> None:
        """Release the floor (page-locked memory or the fallback's)."""
        locked, self._locked = self._locked, None
        for buf in locked or ():
            self._backend.free(buf)
        self._inner.drop_host()


def floor_source(
    source: WeightSource, backend: Backend, *, page_locked: bool, shared: bool, name: str = ""
) -> WeightSource:
    """``source`` with its floor page-locked where that is wanted and possible.

    Not when ``page_locked`` is off (``runtime.page_locked_weights``), the backend has no
    page-locked memory, or floors are shared across workers (``shared_host_weights``: one
    node-wide copy in ``/dev/shm``; a private page-locked copy per worker would undo it).
    """
    if page_locked and backend.page_locked_host and not shared:
        return PageLockedSource(source, backend, name=name)
    return source
