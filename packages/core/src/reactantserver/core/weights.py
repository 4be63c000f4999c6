"""Model weights on the host: the safetensors reader and the private/shared weight stores.

A loader reads the header, then asks a store for the host arrays; the store calls ``fill``
only when this worker has to produce them::

    with SafetensorsReader(bundle / "weights.safetensors") as reader:
        specs = reader.specs(reverse_axes=is_format_2)
        digest = weights_digest(model, specs, reader.identity)
        handle = store.materialize(
            model, digest, specs, functools.partial(reader.fill, reverse_axes=is_format_2)
        )
    ...
    store.release(handle)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from reactantserver.core._safetensors import (
    ALIGNMENT,
    MAX_HEADER_BYTES,
    FileIdentity,
    SafetensorsReader,
    TensorInfo,
    WeightSpec,
    aligned_empty,
)
from reactantserver.core._shared_weights import (
    DEFAULT_ATTACH_TIMEOUT_S,
    DEFAULT_SHM_DIR,
    POLL_INTERVAL_S,
    REGION_HEADER_BYTES,
    REGION_MAGIC,
    FillFn,
    SharedWeightStore,
    WeightHandle,
    region_layout,
    region_name,
    weights_digest,
)

__all__ = [
    "ALIGNMENT",
    "DEFAULT_ATTACH_TIMEOUT_S",
    "DEFAULT_SHM_DIR",
    "MAX_HEADER_BYTES",
    "POLL_INTERVAL_S",
    "REGION_HEADER_BYTES",
    "REGION_MAGIC",
    "FileIdentity",
    "FillFn",
    "PrivateWeightStore",
    "SafetensorsReader",
    "SharedWeightStore",
    "TensorInfo",
    "WeightHandle",
    "WeightSpec",
    "WeightStore",
    "aligned_empty",
    "region_layout",
    "region_name",
    "weights_digest",
]


@runtime_checkable
class WeightStore(Protocol):
    """Where a worker keeps a model's host weights; the worker swaps implementations freely."""

    def materialize(
        self, key: str, digest: int, specs: Sequence[WeightSpec], fill: FillFn
    ) -> WeightHandle:
        """Host arrays for ``specs`` (read-only, 64-byte aligned), filled by ``fill`` if needed."""
        ...

    def release(self, handle: WeightHandle) -> None:
        """Give the arrays back; ``ValueError`` if ``handle`` is not live in this store."""
        ...

    def rename(self, old_key: str, new_key: str) -> None:
        """Rekey the live handles of a renamed model without touching their memory."""
        ...


class PrivateWeightStore:
    """The default store: each worker allocates and fills its own copy of every weight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[WeightHandle] = set()

    def materialize(
        self, key: str, digest: int, specs: Sequence[WeightSpec], fill: FillFn
    ) -> WeightHandle:
        """Allocate one 64-byte-aligned array per spec, ``fill`` them, then freeze them."""
        for spec in specs:
            if spec.dtype.itemsize == 0:
                raise ValueError(f"weight {spec.name!r}: {spec.dtype.token} cannot be a weight")
        arrays = [aligned_empty(spec.shape, spec.dtype.numpy) for spec in specs]
        fill(list(arrays))
        for array in arrays:
            # Shared weights are read-only mappings; private ones behave the same.
            array.flags.writeable = False
        handle = WeightHandle(
            key=key, digest=digest, arrays=arrays, nbytes=sum(s.nbytes for s in specs)
        )
        with self._lock:
            self._live.add(handle)
        return handle

    def release(self, handle: WeightHandle) -> None:
        """Drop the store's references to the arrays."""
        with self._lock:
            if handle not in self._live:
                raise ValueError(f"weight handle for {handle.key!r} is not live in this store")
            self._live.remove(handle)
        handle.arrays = []
        handle.released = True

    def rename(self, old_key: str, new_key: str) -> None:
        """Rekey live handles of a renamed model."""
        with self._lock:
            for handle in self._live:
                if handle.key == old_key:
                    handle.key = new_key
