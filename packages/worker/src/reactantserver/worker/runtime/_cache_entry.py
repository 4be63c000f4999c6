"""The weight cache's per-model record and its statistics snapshot."""

from __future__ import annotations

import attrs

from reactantserver.worker.runtime._weight_source import WeightSource
from reactantserver.worker.runtime.backend import DeviceBuffer
from reactantserver.worker.runtime.residency import Residency

__all__ = ["CacheEntry", "WeightCacheStats", "never_busy"]


@attrs.define(eq=False)
class CacheEntry:
    """One model in the weight cache: its weights' source, floor and device copy."""

    name: str
    source: WeightSource
    residency: Residency
    buffers: list[DeviceBuffer] | None = None
    oversize_warned_at: float | None = None
    loads: int = 0
    """Host-to-device loads of this model's weights (``ModelStatus.weight_loads``)."""
    evictions: int = 0
    """Evictions of this model's weights to make room (the status page's churn)."""
    pending: bool = False
    """``buffers`` come from a prefetch whose copy nobody has waited for yet."""

    @property
    def nbytes(self) -> int:
        """Bytes of the weights."""
        return self.source.nbytes


@attrs.frozen
class WeightCacheStats:
    """A snapshot of the cache's counters and gauges, for metrics."""

    loads: int
    evictions: int
    compactions: int
    prefetches: int
    prefetch_hits: int
    load_seconds: float
    load_bytes: int
    loads_since_compaction: int
    resident_bytes: int
    budget: int
    pinned_bytes: int
    max_scratch: int
    weight_pool: int


def never_busy(name: str) -> bool:
    """The default ``busy`` callback: no model has queued work."""
    return False
