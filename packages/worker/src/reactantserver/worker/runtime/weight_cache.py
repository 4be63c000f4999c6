"""The on-demand device weight cache: an LRU working set of model weights under a byte budget.

Threading: **only the dispatch thread** calls into a :class:`WeightCache`. That thread is also the
only one that executes, so nothing is evicted while an
execution reads the weights and no lock is needed; other threads ask the dispatch thread (a
dispatch command) instead of calling in. The loader thread may call
:meth:`WeightSource.keep_host` on a source *before* handing it over, so that admission is a
pure host->device copy.

::

    cache = WeightCache(backend, budget=policy.provisional_budget(), busy=scheduler.busy)
    cache.add_model("resnet", source, Residency.PINNED_SYSTEM)
    weights = cache.acquire("resnet")          # before every execution
    outputs = run_with_oom_retry(cache, "resnet", lambda: backend.execute(exe, [*xs, *weights]))
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

from reactantserver.core.errors import FailedPreconditionError, ModelUnavailableError
from reactantserver.worker.runtime._cache_entry import CacheEntry, WeightCacheStats, never_busy
from reactantserver.worker.runtime._oom_retry import (
    DEVICE_OOM_MARKERS,
    is_device_oom,
    run_with_oom_retry,
)
from reactantserver.worker.runtime._weight_moves import WeightMoves
from reactantserver.worker.runtime._weight_source import (
    HostArray,
    StoreWeightSource,
    WeightSource,
)
from reactantserver.worker.runtime.backend import Backend, DeviceBuffer
from reactantserver.worker.runtime.budget import BudgetPolicy, WeightBudget
from reactantserver.worker.runtime.residency import Residency

__all__ = [
    "DEVICE_OOM_MARKERS",
    "OVERSIZE_WARNING_INTERVAL_S",
    "HostArray",
    "StoreWeightSource",
    "WeightCache",
    "WeightCacheStats",
    "WeightSource",
    "is_device_oom",
    "run_with_oom_retry",
]

#: Seconds between two "larger than the budget" warnings for the same model.
OVERSIZE_WARNING_INTERVAL_S = 60.0

_log = logging.getLogger(__name__)


class WeightCache(WeightMoves):
    """Keeps model weights on the device: device-pinned ones always, the rest LRU under a budget.

    ``enabled=False`` is the cache-less mode (CPU without ``weight_cache_max_bytes``, or
    fraction 0): every model goes to the device at admission and stays. ``explicit=True`` is
    ``model_control_mode: explicit``: only :meth:`set_residency` puts weights on the device.
    ``busy(model)`` says whether a model has queued requests or is referenced by an in-flight
    meta run; busy models are evicted only after every idle one (settable later, for a
    scheduler built after the cache).

    Counters (monotonic): ``loads``, ``evictions``, ``compactions``, ``load_seconds``,
    ``load_bytes``; gauges: ``resident_bytes``, ``budget``, ``pinned_bytes``; :meth:`stats`
    snapshots them all.

    The moves themselves (loads, frees, LRU evictions) are :class:`WeightMoves`'; this class
    decides when they happen.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        budget: int = 0,
        enabled: bool = True,
        explicit: bool = False,
        busy: Callable[[str], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        oversize_warning_interval_s: float = OVERSIZE_WARNING_INTERVAL_S,
    ) -> None:
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        super().__init__(
            backend,
            budget=budget,
            busy=busy if busy is not None else never_busy,
            clock=clock,
            oversize_warning_interval_s=oversize_warning_interval_s,
        )
        self._enabled = enabled
        self._explicit = explicit
        self._policy: BudgetPolicy | None = None
        self._solved: WeightBudget | None = None
        self.compactions = 0

    # -- queries ---------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether the on-demand cache is on (else every weight stays on the device)."""
        return self._enabled

    @property
    def explicit(self) -> bool:
        """Whether residency is externally managed (``model_control_mode: explicit``)."""
        return self._explicit

    @property
    def budget(self) -> int:
        """The on-demand budget in bytes."""
        return self._budget

    @property
    def budget_solution(self) -> WeightBudget | None:
        """The last solved budget, when a :class:`BudgetPolicy` is in force."""
        return self._solved

    @property
    def pinned_bytes(self) -> int:
        """``P``: bytes of the ``PINNED_DEVICE`` models."""
        return sum(
            e.nbytes for e in self._entries.values() if e.residency is Residency.PINNED_DEVICE
        )

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def residency(self, name: str) -> Residency:
        """The residency floor of ``name``."""
        return self._entry(name).residency

    def nbytes(self, name: str) -> int:
        """Bytes of the weights of ``name``."""
        return self._entry(name).nbytes

    def is_resident(self, name: str) -> bool:
        """Whether the weights of ``name`` are on the device now."""
        return self._entry(name).buffers is not None

    def model_loads(self, name: str) -> int:
        """How many times the weights of ``name`` went to the device."""
        return self._entry(name).loads

    def model_evictions(self, name: str) -> int:
        """How many times the weights of ``name`` were evicted (counted like ``evictions``)."""
        return self._entry(name).evictions

    def host_resident(self, name: str) -> bool:
        """Whether the host floor of ``name`` is materialised."""
        return self._entry(name).source.host_resident

    def stats(self) -> WeightCacheStats:
        """Counters and gauges now."""
        return WeightCacheStats(
            loads=self.loads,
            evictions=self.evictions,
            compactions=self.compactions,
            prefetches=self.prefetches,
            prefetch_hits=self.prefetch_hits,
            load_seconds=self.load_seconds,
            load_bytes=self.load_bytes,
            loads_since_compaction=self.loads_since_compaction,
            resident_bytes=self.resident_bytes,
            budget=self._budget,
            pinned_bytes=self.pinned_bytes,
            max_scratch=0 if self._solved is None else self._solved.max_scratch,
            weight_pool=0 if self._solved is None else self._solved.weight_pool,
        )

    def memory_report(self) -> str:
        """One line on device memory and the cache, for transition and compaction logs."""
        stats = self._backend.memory_stats()
        device = (
            "device stats unavailable"
            if stats is None
            else f"device in_use={stats.bytes_in_use} limit={stats.bytes_limit} "
            f"free={stats.bytes_free} peak={stats.peak_bytes_in_use}"
        )
        return (
            f"weights resident={self.resident_bytes} budget={self._budget} "
            f"pinned={self.pinned_bytes} models_on_device="
            f"{sum(e.buffers is not None for e in self._entries.values())}; {device}"
        )

    # -- budget ----------------------------------------------------------------------------

    def set_budget(self, nbytes: int) -> None:
        """Use a fixed budget (``weight_cache_max_bytes``, provisional, tests); evicts to fit."""
        if nbytes < 0:
            raise ValueError(f"budget must be >= 0, got {nbytes}")
        self._policy = None
        self._solved = None
        self._budget = nbytes
        self._shrink_to_budget()

    def set_budget_policy(self, policy: BudgetPolicy) -> WeightBudget:
        """Solve the budget from ``policy`` now and again whenever ``P`` changes."""
        self._policy = policy
        self._refresh_budget()
        assert self._solved is not None
        return self._solved

    def _refresh_budget(self) -> None:
        if self._policy is not None:
            on_demand = sum(e.residency.evictable for e in self._entries.values())
            solved = self._policy.solve(self.pinned_bytes, on_demand_models=on_demand)
            if solved != self._solved:
                _log.info("%s", solved.summary())
                for warning in solved.warnings:
                    _log.warning("%s", warning)
            self._solved = solved
            self._budget = solved.on_demand_budget
        self._shrink_to_budget()

    def _shrink_to_budget(self) -> None:
        if not self._enabled:
            return
        for victim in self._victims(exclude=None):
            if self.resident_bytes <= self._budget:
                break
            self._evict(victim)

    # -- model set -------------------------------------------------------------------------

    def add_model(self, name: str, source: WeightSource, residency: Residency) -> None:
        """Admit a model: apply its floor; put it on the device if pinned or without the cache."""
        if name in self._entries:
            raise ValueError(f"model {name!r} is already in the weight cache")
        entry = CacheEntry(name, source, residency)
        self._entries[name] = entry
        pinned = residency is Residency.PINNED_DEVICE
        try:
            if residency.keeps_host_copy:
                source.keep_host()
            # A pinned admission raises P: the budget shrinks (evicting) before the transfer.
            self._refresh_budget()
            if pinned or not (self._enabled or self._explicit):
                self._load(entry)
            if not residency.keeps_host_copy:
                source.drop_host()
        except BaseException:
            self._discard(entry)
            raise
        _log.info("weights of %r admitted as %s; %s", name, residency.name, self.memory_report())

    def remove_model(self, name: str) -> None:
        """Forget a model: free its device buffers now and release its host floor."""
        self._discard(self._entry(name))
        _log.info("weights of %r removed; %s", name, self.memory_report())

    def rename_model(self, old: str, new: str) -> None:
        """Re-key a model (rename in place): no memory moves, LRU position kept."""
        if new in self._entries:
            raise ValueError(f"model {new!r} is already in the weight cache")
        entry = self._entries.pop(old)
        entry.name = new
        self._entries[new] = entry
        self._lru = OrderedDict((new if n == old else n, None) for n in self._lru)

    def _discard(self, entry: CacheEntry) -> None:
        self._entries.pop(entry.name, None)
        self._free(entry)
        entry.source.drop_host()
        if entry.residency is Residency.PINNED_DEVICE:
            self._refresh_budget()

    # -- residency -------------------------------------------------------------------------

    def set_residency(self, name: str, target: Residency) -> Residency:
        """Move ``name`` to the floor ``target``; returns the previous floor.

        Pinning to the device ensures the device copy (outside the budget); warming a model
        never warmed is the caller's job. Leaving ``PINNED_DEVICE`` frees the device copy in
        explicit mode and makes it evictable otherwise.
        """
        if not self._enabled:
            raise FailedPreconditionError(
                "residency control is inert without the on-demand weight cache"
            )
        entry = self._entry(name)
        previous = entry.residency
        if target is previous:
            return previous
        if target is Residency.PINNED_DEVICE:
            self._pin(entry)
        else:
            if target.keeps_host_copy:
                entry.source.keep_host()
            else:
                entry.source.drop_host()
            entry.residency = target
            if previous is Residency.PINNED_DEVICE:
                if self._explicit:
                    self._free(entry)
                elif entry.buffers is not None:
                    self._lru[name] = None
                self._refresh_budget()
        _log.info(
            "residency of %r: %s -> %s; %s", name, previous.name, target.name, self.memory_report()
        )
        return previous

    def _pin(self, entry: CacheEntry) -> None:
        previous = entry.residency
        self._lru.pop(entry.name, None)
        entry.residency = Residency.PINNED_DEVICE
        try:
            self._refresh_budget()  # P grew: evict to the smaller budget before transferring
            if entry.buffers is None:
                self._load(entry)
        except BaseException:
            entry.residency = previous
            if entry.buffers is not None:
                self._lru[entry.name] = None
            self._refresh_budget()
            raise
        entry.source.drop_host()

    # -- the hot path ----------------------------------------------------------------------

    def acquire(self, name: str) -> list[DeviceBuffer]:
        """The device weights of ``name``, loaded (evicting LRU victims) if needed.

        Raises :class:`ModelUnavailableError` in explicit mode when the model is not resident.
        A model larger than the whole budget is loaded after evicting everything evictable,
        with a rate-limited warning (it could not run otherwise).
        """
        entry = self._entry(name)
        self._settle(entry)
        if entry.buffers is not None:
            if name in self._lru:
                self._lru.move_to_end(name)
            return list(entry.buffers)
        if self._explicit and entry.residency.evictable:
            raise ModelUnavailableError(f"model {name!r} is not resident")
        if self._enabled and entry.residency.evictable:
            self._make_room(entry)
        buffers = self._load(entry)
        return list(buffers)

    @property
    def can_prefetch(self) -> bool:
        """Whether :meth:`prefetch` can ever start a load: the on-demand cache is on, residency
        is self-managed (not explicit) and the backend copies while it executes."""
        return self._enabled and not self._explicit and self._backend.async_transfers

    def prefetch(self, name: str, *, keep: str | None = None) -> bool:
        """Start loading ``name``'s weights (expected next, while ``keep`` runs) without waiting.

        Returns whether a load started: only idle models are evicted for it (never ``keep`` or
        a busy one), and not when that cannot make room, ``name`` is resident, device-pinned or
        unknown, or :attr:`can_prefetch` is false. :meth:`acquire` waits for the copy.
        """
        entry = self._entries.get(name)
        if not self.can_prefetch or entry is None or entry.buffers is not None:
            return False
        if not entry.residency.evictable or name == keep:
            return False
        return self._prefetch(entry, keep)

    def compact(self, reload: Iterable[str] = ()) -> int:
        """Free every on-demand device weight at once, then reload ``reload``; returns the count.

        Freeing everything together lets the allocator merge its free blocks. Pinned models and
        host floors are untouched. The reload list is ignored in explicit mode (the control
        plane re-pins what it needs) and names not in the cache are skipped. No-op without the
        cache.
        """
        if not self._enabled:
            return 0
        before = self.memory_report()
        freed = [self._entries[name] for name in self._lru]
        for entry in freed:
            self._free(entry)
        self.compactions += 1
        reloaded = 0
        if not self._explicit:
            for name in reload:
                target = self._entries.get(name)
                if target is None:
                    _log.warning("compaction: no model %r to reload", name)
                elif target.buffers is None:
                    try:
                        self.acquire(name)
                    except Exception as exc:
                        # Best effort: the model reloads (or fails) on its next dispatch.
                        _log.warning("compaction: cannot reload %r: %s", name, exc)
                    else:
                        reloaded += 1
        self.loads_since_compaction = 0
        _log.info(
            "compaction freed %d model(s), reloaded %d; before: %s; after: %s",
            len(freed),
            reloaded,
            before,
            self.memory_report(),
        )
        return reloaded
