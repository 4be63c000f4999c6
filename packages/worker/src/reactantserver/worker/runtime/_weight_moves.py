"""The weight cache's device moves: loads, frees and LRU evictions, with the counters they keep.

:class:`WeightMoves` holds the models, the LRU order of the resident evictable ones and the
mechanics of moving weights on and off the device: choosing victims (idle before busy), making
room under the byte budget, copying host arrays to the device and freeing device buffers.
:class:`~reactantserver.worker.runtime.weight_cache.WeightCache` builds on it and decides
*when* to move: residency floors, admission, budget solving and compaction.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from reactantserver.worker.runtime._cache_entry import CacheEntry
from reactantserver.worker.runtime._prefetch import Resident, plan_prefetch
from reactantserver.worker.runtime.backend import Backend, DeviceBuffer

__all__ = ["WeightMoves"]

# Moves log under the public module's name, where operators look for the cache's messages.
_log = logging.getLogger("reactantserver.worker.runtime.weight_cache")


class WeightMoves:
    """The models, the LRU order of the evictable resident ones, and moves to and from the device.

    Only the dispatch thread calls in (see :mod:`reactantserver.worker.runtime.weight_cache`).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        budget: int,
        busy: Callable[[str], bool],
        clock: Callable[[], float],
        oversize_warning_interval_s: float,
    ) -> None:
        self._backend = backend
        self.busy: Callable[[str], bool] = busy
        self._clock = clock
        self._oversize_interval = oversize_warning_interval_s
        self._entries: dict[str, CacheEntry] = {}
        # Resident, evictable models, least recently used first.
        self._lru: OrderedDict[str, None] = OrderedDict()
        self._budget = budget
        self.loads = 0
        self.evictions = 0
        self.load_seconds = 0.0
        self.load_bytes = 0
        self.loads_since_compaction = 0
        """On-demand loads since the last compaction (drives ``scheduler.compaction_interval``)."""
        self.largest_load_bytes = 0
        """The largest on-demand model loaded so far (the probe's bound on resident weights)."""
        self.prefetches = 0
        """Loads started ahead of their dispatch, while another model executed."""
        self.prefetch_hits = 0
        """Acquires that found their weights there thanks to a prefetch."""

    @property
    def resident_bytes(self) -> int:
        """Bytes of device-resident weights that count against the budget."""
        return sum(self._entries[name].nbytes for name in self._lru)

    def lru_order(self) -> list[str]:
        """Resident evictable models, least recently used first."""
        return list(self._lru)

    def _make_room(self, entry: CacheEntry) -> None:
        need = entry.nbytes
        oversize = need > self._budget
        if oversize:
            self._warn_oversize(entry)
        for victim in self._victims(exclude=entry.name):
            if not oversize and self.resident_bytes + need <= self._budget:
                break
            self._evict(victim)

    def _victims(self, exclude: str | None) -> list[CacheEntry]:
        # Idle models first (no queued requests, no in-flight meta run), then busy ones; each
        # group least recently used first.
        idle: list[CacheEntry] = []
        queued: list[CacheEntry] = []
        for name in self._lru:
            if name != exclude:
                (queued if self.busy(name) else idle).append(self._entries[name])
        return idle + queued

    def _warn_oversize(self, entry: CacheEntry) -> None:
        now = self._clock()
        last = entry.oversize_warned_at
        if last is None or now - last >= self._oversize_interval:
            entry.oversize_warned_at = now
            _log.warning(
                "weights of %r (%d bytes) exceed the on-demand budget (%d bytes): "
                "evicting every other on-demand model and loading anyway",
                entry.name,
                entry.nbytes,
                self._budget,
            )

    def _prefetch(self, entry: CacheEntry, keep: str | None) -> bool:
        """Start loading ``entry`` without waiting, if idle victims alone make room."""
        resident = [Resident(n, self._entries[n].nbytes, self.busy(n)) for n in self._lru]
        keep_names = () if keep is None else (keep,)
        plan = plan_prefetch(
            need=entry.nbytes, budget=self._budget, resident=resident, keep=keep_names
        )
        if plan is None:
            return False
        for victim in plan.victims:
            self._evict(self._entries[victim])
        self._load(entry, wait=False)
        entry.pending = True
        self.prefetches += 1
        return True

    def _settle(self, entry: CacheEntry) -> None:
        """Wait for a prefetched copy to finish (the wait counts as load time).

        A copy that failed is freed with a warning, so the caller loads again (and meets the
        error there, if it was not a passing one).
        """
        if not entry.pending or entry.buffers is None:
            return
        start = time.perf_counter()
        try:
            self._backend.wait(entry.buffers)
        except Exception as exc:
            _log.warning("prefetch of the weights of %r failed: %s", entry.name, exc)
            self._free(entry)
            return
        finally:
            entry.pending = False
            self.load_seconds += time.perf_counter() - start
        self.prefetch_hits += 1

    def _load(self, entry: CacheEntry, *, wait: bool = True) -> list[DeviceBuffer]:
        start = time.perf_counter()
        # One batched call, every copy queued before any wait (a weight set is many arrays).
        buffers = self._backend.to_device_many(entry.source.load(), wait=wait)
        entry.buffers = buffers
        entry.loads += 1
        self.loads += 1
        self.load_bytes += entry.nbytes
        self.load_seconds += time.perf_counter() - start
        if entry.residency.evictable:
            self._lru[entry.name] = None
            self.loads_since_compaction += 1
            self.largest_load_bytes = max(self.largest_load_bytes, entry.nbytes)
        return buffers

    def _evict(self, entry: CacheEntry) -> None:
        self._free(entry)
        entry.evictions += 1
        self.evictions += 1
        _log.debug("evicted weights of %r (%d bytes)", entry.name, entry.nbytes)

    def _free(self, entry: CacheEntry) -> None:
        # Eagerly: waiting for the garbage collector would leave the arena fragmented and full.
        # (PJRT frees a buffer whose prefetch copy is still running once the copy is done.)
        buffers, entry.buffers = entry.buffers, None
        entry.pending = False
        self._lru.pop(entry.name, None)
        for buf in buffers or ():
            self._backend.free(buf)

    def evict_unpinned(self, keep: str | None = None) -> int:
        """Evict every resident on-demand model except ``keep``; returns how many.

        For the OOM retry and the probe. Like budget evictions these count in ``evictions``
        (compaction, removal and explicit-mode unpinning do not).
        """
        victims = self._victims(exclude=keep)
        for victim in victims:
            self._evict(victim)
        return len(victims)

    def _entry(self, name: str) -> CacheEntry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"model {name!r} is not in the weight cache") from None
