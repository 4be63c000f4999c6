"""Cold-start-aware routing estimate of the ``model_aware`` policy.

Every candidate worker gets ``E(w) = N(w) + Q(w) + L(m, w) + T_I(m)``, the request's expected
latency there, and the request goes to the argmin of ``E(w) + D(w)``; the rest follow as
failover order. ``D(w)`` is what a cold load on ``w`` displaces: the load times of the models
the worker's LRU would evict to make room, counting only models routed there within the
last ``displacement_horizon_seconds`` (0 when the model is resident or fits). Without it a
queue on the warm worker longer than one load sends the model to the other worker, whose
eviction of a model still in use costs a load later — with a budget far below the catalog the
fleet then loads as often as round robin does (``bench.fleet``).

Pure logic: the prober feeds polls in, the ModelInfer path asks for a route and releases its
reservation::

    router = ModelAwareRouter(ModelAwareKnobs())
    router.observe_worker("w0:8001", models, cache_max_bytes=..., load_bytes_total=...,
                          load_seconds_total=...)                 # every status poll
    route = router.route("m", ["w0:8001", "w1:8001"], units=4, weight_nbytes=2 << 30,
                         cost_per_item=0.002, fleet_cost_per_item=0.003)
    try: ...forward to route.order...
    finally: router.release(route.reservation)

Seconds are quantised to integer nanoseconds (as the lpt load counters are), so estimates that
are equal tie exactly and every release returns ``Q(w)`` to exactly 0.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

import attrs

__all__ = [
    "BANDWIDTH_EWMA_ALPHA",
    "DEFAULT_COST_PER_ITEM_SECONDS",
    "DISPLACEMENT_HORIZON_SECONDS",
    "Estimate",
    "LoadBandwidth",
    "ModelAwareKnobs",
    "ModelAwareRouter",
    "ModelResidency",
    "Reservation",
    "ResidencyMirror",
    "Route",
    "inference_seconds",
]

#: Cost per item when neither the model nor any other model has been measured (seconds).
DEFAULT_COST_PER_ITEM_SECONDS = 0.01
#: Default ``displacement_horizon_seconds``: on the order of a bursty model's on period, and
#: long enough that the least recently used of a few Zipf-popular models is still in use.
DISPLACEMENT_HORIZON_SECONDS = 2.0
#: Weight of one poll's bandwidth sample. The spec names no knob; one sample already averages
#: every load of a poll interval, so half weight follows a changed weight source within two polls.
BANDWIDTH_EWMA_ALPHA = 0.5

_NS = 1_000_000_000


def _ns(seconds: float) -> int:
    return round(seconds * _NS)


def _frozen_map(value: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType({str(k): float(v) for k, v in value.items()})


def _at_least_one(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (value >= 1.0 and math.isfinite(value)):
        raise ValueError(f"{attribute.name} must be >= 1.0, got {value}")


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


def _not_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{attribute.name} must be >= 0, got {value}")


def _not_negative_each(
    instance: object, attribute: attrs.Attribute[Mapping[str, float]], value: Mapping[str, float]
) -> None:
    for endpoint, seconds in value.items():
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"{attribute.name}[{endpoint!r}] must be >= 0, got {seconds}")


@attrs.frozen
class ModelAwareKnobs:
    """``scheduling.model_aware.*``, validated on construction."""

    cold_load_penalty: float = attrs.field(default=1.0, validator=_at_least_one)
    default_load_bandwidth_bytes_per_second: float = attrs.field(default=8e9, validator=_positive)
    load_overhead_seconds: float = attrs.field(default=0.005, validator=_not_negative)
    #: A model the worker would evict counts in ``D(w)`` only if it was routed there within
    #: this many seconds: an idle model (a bursty trace's off period) costs nothing to evict.
    displacement_horizon_seconds: float = attrs.field(
        default=DISPLACEMENT_HORIZON_SECONDS, validator=_not_negative
    )
    network_seconds: Mapping[str, float] = attrs.field(
        factory=dict, converter=_frozen_map, validator=_not_negative_each, hash=False
    )


def inference_seconds(
    units: int, cost_per_item: float | None, fleet_cost_per_item: float | None
) -> float:
    """``T_I(m)``: units * the model's cost per item, else the fleet mean, else 0.01 s per item.

    A cost that is ``None`` or not > 0 counts as unmeasured; units below 1 count as 1.
    """
    for cost in (cost_per_item, fleet_cost_per_item):
        if cost is not None and cost > 0 and math.isfinite(cost):
            return max(1, units) * cost
    return max(1, units) * DEFAULT_COST_PER_ITEM_SECONDS


class LoadBandwidth:
    """Per-worker EWMA of weight-load bandwidth from the cumulative load counters of each poll.

    A sample is Δbytes / Δseconds against the previous poll (the first poll, and the first after
    a restart — a counter that went backwards — measure from the worker's zero). Polls with no
    load seconds add no sample; a worker never sampled uses the default.
    """

    def __init__(self, default: float, alpha: float = BANDWIDTH_EWMA_ALPHA) -> None:
        if not (default > 0 and math.isfinite(default)):
            raise ValueError(f"default bandwidth must be > 0, got {default}")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.default = default
        self.alpha = alpha
        self._last: dict[str, tuple[int, float]] = {}
        self._ewma: dict[str, float] = {}

    def observe(self, worker: str, bytes_total: int, seconds_total: float) -> float:
        """Fold one poll's counters in; returns the worker's bandwidth afterwards."""
        prev_bytes, prev_seconds = self._last.get(worker, (0, 0.0))
        if bytes_total < prev_bytes or seconds_total < prev_seconds:
            prev_bytes, prev_seconds = 0, 0.0
        self._last[worker] = (bytes_total, seconds_total)
        d_bytes, d_seconds = bytes_total - prev_bytes, seconds_total - prev_seconds
        if d_bytes > 0 and d_seconds > 0:
            sample = d_bytes / d_seconds
            old = self._ewma.get(worker)
            self._ewma[worker] = (
                sample if old is None else (1.0 - self.alpha) * old + self.alpha * sample
            )
        return self.bandwidth(worker)

    def bandwidth(self, worker: str) -> float:
        """``bw(w)`` in bytes per second."""
        return self._ewma.get(worker, self.default)

    def measured(self, worker: str) -> float | None:
        """The EWMA when the worker has been sampled, else ``None``."""
        return self._ewma.get(worker)


@attrs.frozen
class ModelResidency:
    """One model's residency on one worker, as a ``ModelControlStatus`` poll reports it."""

    model: str
    weight_nbytes: int
    device_resident: bool
    pinned: bool = False  # PINNED_DEVICE: always resident, never evicted, outside the budget


@attrs.define
class _Entry:
    nbytes: int
    resident: bool
    pinned: bool


@attrs.define
class _WorkerMirror:
    cache_max_bytes: int = 0  # 0: cache off, nothing is ever evicted
    models: dict[str, _Entry] = attrs.field(factory=dict)


class ResidencyMirror:
    """The gateway's view of which models are device-resident where, between polls.

    A poll replaces a worker's view with the truth. Routing ``m`` to a worker marks it resident
    and mirrors the worker's LRU: while the resident non-pinned bytes exceed the worker's
    ``weight_cache_max_bytes``, the least-recently-routed non-pinned models (never the one
    being routed; never-routed first, then by name) are marked evicted.
    """

    def __init__(self) -> None:
        self._workers: dict[str, _WorkerMirror] = {}
        self._last_routed: dict[tuple[str, str], int] = {}
        self._routed_at: dict[tuple[str, str], float] = {}
        self._sequence = 0

    def observe(
        self, worker: str, models: Iterable[ModelResidency], *, cache_max_bytes: int
    ) -> None:
        """Replace ``worker``'s mirror with one poll's truth (routing recency is kept)."""
        self._workers[worker] = _WorkerMirror(
            cache_max_bytes=cache_max_bytes,
            models={
                r.model: _Entry(r.weight_nbytes, r.device_resident or r.pinned, r.pinned)
                for r in models
            },
        )

    def is_resident(self, worker: str, model: str) -> bool:
        """Whether ``model`` is (believed) device-resident on ``worker``."""
        state = self._workers.get(worker)
        entry = state.models.get(model) if state is not None else None
        return entry is not None and entry.resident

    def resident_models(self, worker: str) -> list[str]:
        """Models believed resident on ``worker``, sorted."""
        state = self._workers.get(worker)
        return sorted(m for m, e in state.models.items() if e.resident) if state else []

    def budget_bytes(self, worker: str) -> int:
        """Resident non-pinned bytes counted against ``worker``'s budget."""
        state = self._workers.get(worker)
        if state is None:
            return 0
        return sum(e.nbytes for e in state.models.values() if e.resident and not e.pinned)

    def victims(self, worker: str, model: str, weight_nbytes: int) -> list[tuple[str, int]]:
        """``(model, bytes)`` that routing ``model`` to ``worker`` would evict, in order."""
        state = self._workers.get(worker)
        if state is None or state.cache_max_bytes <= 0:
            return []
        entry = state.models.get(model)
        if entry is not None and entry.resident:
            return []
        nbytes = entry.nbytes if entry is not None else weight_nbytes
        used = self.budget_bytes(worker) + nbytes
        out: list[tuple[str, int]] = []
        for _, name in sorted(
            (self._last_routed.get((worker, name), 0), name)
            for name, e in state.models.items()
            if e.resident and not e.pinned and name != model
        ):
            if used <= state.cache_max_bytes:
                break
            used -= state.models[name].nbytes
            out.append((name, state.models[name].nbytes))
        return out

    def routed_at(self, worker: str, model: str) -> float | None:
        """The ``now`` of the last :meth:`mark_routed` of ``model`` to ``worker`` (None: never)."""
        return self._routed_at.get((worker, model))

    def mark_routed(
        self, worker: str, model: str, weight_nbytes: int, *, now: float = 0.0
    ) -> list[str]:
        """Record that ``model`` was routed to ``worker`` at ``now`` (a monotonic clock's
        seconds); returns the models it evicted."""
        evicted = [name for name, _ in self.victims(worker, model, weight_nbytes)]
        self._sequence += 1
        self._last_routed[(worker, model)] = self._sequence
        self._routed_at[(worker, model)] = now
        state = self._workers.setdefault(worker, _WorkerMirror())
        entry = state.models.get(model)
        if entry is None:
            entry = state.models[model] = _Entry(weight_nbytes, resident=False, pinned=False)
        entry.resident = True
        for name in evicted:
            state.models[name].resident = False
        return evicted


@attrs.frozen
class Estimate:
    """One candidate's ``E(w)`` and its terms, in integer nanoseconds."""

    worker: str
    network_ns: int
    queue_ns: int
    load_ns: int
    inference_ns: int
    resident: bool
    #: ``D(w)``: the loads that the models this cold load evicts will need to come back.
    displacement_ns: int = 0

    @property
    def total_ns(self) -> int:
        """``E(w) = N + Q + L + T_I``: this request's expected latency."""
        return self.network_ns + self.queue_ns + self.load_ns + self.inference_ns

    @property
    def cost_ns(self) -> int:
        """What routing compares: ``E(w) + D(w)``."""
        return self.total_ns + self.displacement_ns

    @property
    def seconds(self) -> float:
        """``E(w)`` in seconds."""
        return self.total_ns / _NS


@attrs.frozen
class Reservation:
    """Work charged to ``worker``'s ``Q`` for one request: ``T_I`` (+ ``L`` when cold)."""

    token: int
    worker: str
    model: str
    nanoseconds: int
    cold: bool


@attrs.frozen
class Route:
    """A routing decision: ``order[0]`` is the choice, the rest the failover order."""

    order: tuple[str, ...]
    estimates: tuple[Estimate, ...]  # aligned with ``order``
    reservation: Reservation

    @property
    def placement(self) -> str:
        """Metric label: ``"resident"`` or ``"cold"`` for the chosen worker."""
        return "cold" if self.reservation.cold else "resident"


class ModelAwareRouter:
    """The ``model_aware`` policy's state: in-flight work, residency, bandwidth, cursors."""

    def __init__(
        self, knobs: ModelAwareKnobs, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.knobs = knobs
        self._clock = clock
        self.mirror = ResidencyMirror()
        self.bandwidth = LoadBandwidth(knobs.default_load_bandwidth_bytes_per_second)
        self._inflight_ns: dict[str, int] = {}
        self._open: dict[int, Reservation] = {}
        self._cursor: dict[str, str] = {}
        self._tokens = 0

    def observe_worker(
        self,
        worker: str,
        models: Iterable[ModelResidency],
        *,
        cache_max_bytes: int,
        load_bytes_total: int,
        load_seconds_total: float,
    ) -> None:
        """Apply one worker's successful ``ModelControlStatus`` poll."""
        self.mirror.observe(worker, models, cache_max_bytes=cache_max_bytes)
        self.bandwidth.observe(worker, load_bytes_total, load_seconds_total)

    def inflight_seconds(self, worker: str) -> float:
        """``Q(w)``: reserved compute of requests in flight on ``worker``."""
        return self._inflight_ns.get(worker, 0) / _NS

    def estimate(
        self, model: str, worker: str, *, weight_nbytes: int, inference_s: float
    ) -> Estimate:
        """``E(w)`` for one request of ``model`` whose ``T_I`` is ``inference_s``."""
        resident = self.mirror.is_resident(worker, model)
        load = displacement = 0.0
        if not resident:
            load = self._load_seconds(worker, weight_nbytes)
            since = self._clock() - self.knobs.displacement_horizon_seconds
            for victim, nbytes in self.mirror.victims(worker, model, weight_nbytes):
                routed = self.mirror.routed_at(worker, victim)
                if routed is not None and routed >= since:
                    displacement += self._load_seconds(worker, nbytes)
        return Estimate(
            worker=worker,
            network_ns=_ns(self.knobs.network_seconds.get(worker, 0.0)),
            queue_ns=self._inflight_ns.get(worker, 0),
            load_ns=_ns(load),
            inference_ns=_ns(inference_s),
            resident=resident,
            displacement_ns=_ns(displacement),
        )

    def _load_seconds(self, worker: str, nbytes: int) -> float:
        """``L``: penalty * (overhead + bytes / bandwidth) for one load on ``worker``."""
        k = self.knobs
        transfer = max(0, nbytes) / self.bandwidth.bandwidth(worker)
        return k.cold_load_penalty * (k.load_overhead_seconds + transfer)

    def route(
        self,
        model: str,
        candidates: Iterable[str],
        *,
        units: int = 1,
        weight_nbytes: int = 0,
        cost_per_item: float | None = None,
        fleet_cost_per_item: float | None = None,
    ) -> Route | None:
        """Choose a worker for one request and reserve its work; ``None`` without candidates.

        Order: ascending ``E + D``; ties → resident first, smaller ``Q``, rotation after the model's
        cursor (the worker chosen last), URL. The choice is marked resident in the mirror.
        """
        workers = sorted(set(candidates))
        if not workers:
            return None
        t_i = inference_seconds(units, cost_per_item, fleet_cost_per_item)
        start = bisect.bisect_right(workers, self._cursor[model]) if model in self._cursor else 0
        n = len(workers)
        rot = {w: (i - start) % n for i, w in enumerate(workers)}
        estimates = sorted(
            (
                self.estimate(model, w, weight_nbytes=weight_nbytes, inference_s=t_i)
                for w in workers
            ),
            key=lambda e: (e.cost_ns, not e.resident, e.queue_ns, rot[e.worker], e.worker),
        )
        chosen = estimates[0]
        self._cursor[model] = chosen.worker
        self._tokens += 1
        reservation = Reservation(
            token=self._tokens,
            worker=chosen.worker,
            model=model,
            nanoseconds=chosen.inference_ns + chosen.load_ns,
            cold=not chosen.resident,
        )
        self._open[reservation.token] = reservation
        self._inflight_ns[chosen.worker] = (
            self._inflight_ns.get(chosen.worker, 0) + reservation.nanoseconds
        )
        self.mirror.mark_routed(chosen.worker, model, weight_nbytes, now=self._clock())
        return Route(
            order=tuple(e.worker for e in estimates),
            estimates=tuple(estimates),
            reservation=reservation,
        )

    def release(self, reservation: Reservation) -> bool:
        """Return a reservation's work; ``False`` (and no change) when it was already released."""
        if self._open.pop(reservation.token, None) is None:
            return False
        left = self._inflight_ns[reservation.worker] - reservation.nanoseconds
        if left:
            self._inflight_ns[reservation.worker] = left
        else:
            del self._inflight_ns[reservation.worker]
        return True
