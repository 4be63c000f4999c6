"""Where the weight cache gets a model's host weights from: the ``WeightSource`` seam."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias

import numpy.typing as npt

from reactantserver.core.weights import (
    FillFn,
    WeightHandle,
    WeightSpec,
    WeightStore,
    aligned_empty,
)

__all__ = ["HostArray", "StoreWeightSource", "WeightSource"]

HostArray: TypeAlias = npt.NDArray[Any]


class WeightSource(Protocol):
    """A model's weights on the host, in ``argument_order``, as the weight cache needs them."""

    @property
    def nbytes(self) -> int:
        """Device footprint of all the weights (from the header; no read needed)."""
        ...

    @property
    def host_resident(self) -> bool:
        """Whether the host floor is materialised."""
        ...

    def load(self) -> Sequence[HostArray]:
        """Host arrays for one device transfer: the floor if kept, else a fresh read."""
        ...

    def keep_host(self) -> None:
        """Materialise the host floor and keep it (idempotent; slow: reads the file)."""
        ...

    def drop_host(self) -> None:
        """Release the host floor (idempotent)."""
        ...


class StoreWeightSource:
    """A :class:`WeightSource` over a core weight store and a safetensors ``fill``.

    ``fill`` must work on every call: without a floor it runs again for each device load, so
    it should read through a descriptor kept open for the generation (or open the file
    itself)::

        fill = functools.partial(reader.fill, reverse_axes=is_format_2)
        source = StoreWeightSource(store, model, digest, specs, fill)
        source.keep_host()  # on the loader thread, so the dispatch thread only transfers
    """

    def __init__(
        self,
        store: WeightStore,
        key: str,
        digest: int,
        specs: Sequence[WeightSpec],
        fill: FillFn,
    ) -> None:
        self._store = store
        self._key = key
        self._digest = digest
        self._specs = tuple(specs)
        self._fill = fill
        self._handle: WeightHandle | None = None
        self._nbytes = sum(spec.nbytes for spec in self._specs)

    @property
    def nbytes(self) -> int:
        """Bytes of all the weights."""
        return self._nbytes

    @property
    def host_resident(self) -> bool:
        """Whether this source holds a live store handle."""
        return self._handle is not None

    def load(self) -> Sequence[HostArray]:
        """The floor's arrays, or freshly allocated arrays filled from the file."""
        if self._handle is not None:
            return self._handle.arrays
        arrays = [aligned_empty(spec.shape, spec.dtype.numpy) for spec in self._specs]
        self._fill(arrays)
        return arrays

    def keep_host(self) -> None:
        """Materialise the floor through the store (the store may share it across workers)."""
        if self._handle is None:
            self._handle = self._store.materialize(self._key, self._digest, self._specs, self._fill)

    def drop_host(self) -> None:
        """Give the floor back to the store."""
        handle, self._handle = self._handle, None
        if handle is not None:
            self._store.release(handle)

    def rename(self, key: str) -> None:
        """Use ``key`` for future floors (the store rekeys live handles itself)."""
        self._key = key
