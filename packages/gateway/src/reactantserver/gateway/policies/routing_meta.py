"""Per-model routing metadata folded from ``ModelControlStatus`` polls.

Pure: no I/O, no clocks. The prober hands every round's successful polls in and publishes the
snapshot that comes back; routing and repacks read one snapshot at a time::

    meta = RoutingMeta(rebalance_compute_seconds=300.0)
    snapshot = meta.observe({"w0:8001": status0, "w1:8001": status1})   # every prober round
    weight = request_weight("compute", units, "m", snapshot, repack_cost_per_request)

The cost EWMAs run on the compute clock: a poll's ``dt`` is the GPU time the fleet consumed
since the previous poll, so an idle fleet never decays them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType

import attrs

from reactantserver.core.protocol import control_pb2

__all__ = [
    "WORK_BASES",
    "MetaSnapshot",
    "ModelMeta",
    "RoutingMeta",
    "WorkerMeta",
    "ewma_alpha",
    "request_weight",
]

#: The ``scheduling.work_basis`` values :func:`request_weight` understands.
WORK_BASES = ("compute", "items", "requests")


def ewma_alpha(dt: float, halflife: float) -> float:
    """``alpha = 1 - 2^(-dt/h)``: the weight of a sample taken ``dt`` compute-seconds later.

    ``dt <= 0`` gives 0 (the average is unchanged); ``dt = halflife`` gives 0.5.

    Raises:
        ValueError: ``halflife`` is not > 0.
    """
    if not halflife > 0:
        raise ValueError(f"halflife must be > 0, got {halflife}")
    if not dt > 0:
        return 0.0
    return 1.0 - math.pow(2.0, -dt / halflife)


def _fold(old: float | None, sample: float, alpha: float) -> float:
    return sample if old is None else (1.0 - alpha) * old + alpha * sample


@attrs.frozen
class ModelMeta:
    """What the fleet reported about one model, as of the last round that reported it.

    Sums and maxima are over the workers that reported it that round (``workers``, sorted);
    ``batch_input_name``/``batch_axis`` (1-based wire axis) are ``""``/0 while none is known;
    the costs (compute-seconds per request and per item) are ``None`` until measured.
    """

    name: str
    weight_nbytes: int
    max_batch: int
    batch_input_name: str
    batch_axis: int
    cost_per_request: float | None
    cost_per_item: float | None
    total_compute: float
    requests: int
    rows: int
    workers: tuple[str, ...]


@attrs.frozen
class WorkerMeta:
    """One worker's last successful poll: budget, discipline, residency and load counters.

    ``models``, ``device_resident`` and ``pinned`` (``residency == PINNED_DEVICE``) hold model
    names; ``weight_cache_max_bytes`` is 0 when the worker's cache is off (unconstrained).
    """

    url: str
    weight_cache_max_bytes: int
    discipline: str
    residency_mode: str
    models: tuple[str, ...]
    device_resident: frozenset[str]
    pinned: frozenset[str]
    weight_load_bytes_total: int
    weight_load_seconds_total: float

    @property
    def resident(self) -> frozenset[str]:
        """Models on the device: reported resident, or pinned there (always resident)."""
        return self.device_resident | self.pinned


@attrs.frozen
class MetaSnapshot:
    """One published view of the fleet; immutable, safe to hold across awaits.

    ``workers`` holds only the workers polled successfully in the round that produced it;
    ``models`` also keeps models no worker reported that round. ``fleet_compute`` is that
    round's Σ ``total_compute_seconds``; ``compute_delta`` the compute-seconds consumed since
    the previous round (restarted workers re-baselined, so never negative) — the EWMA's ``dt``.
    The fleet costs are means over the models measured so far (``None`` when none is).
    """

    models: Mapping[str, ModelMeta]
    workers: Mapping[str, WorkerMeta]
    fleet_compute: float
    compute_delta: float
    fleet_cost_per_item: float | None
    fleet_cost_per_request: float | None

    @classmethod
    def empty(cls) -> MetaSnapshot:
        """The snapshot before any poll: nothing known, nothing measured."""
        return cls(MappingProxyType({}), MappingProxyType({}), 0.0, 0.0, None, None)


@attrs.define
class _Counters:
    """One (model, worker)'s cumulative counters at its last poll."""

    compute: float = 0.0
    requests: int = 0
    rows: int = 0


@attrs.define
class _Round:
    """One model's sums over one round's reporting workers, and its re-baselined deltas."""

    weight_nbytes: int = 0
    max_batch: int = 0
    locator: tuple[str, int] | None = None
    total_compute: float = 0.0
    requests: int = 0
    rows: int = 0
    workers: list[str] = attrs.field(factory=list)
    d_compute: float = 0.0
    d_requests: int = 0
    d_rows: int = 0


def _positive_finite(name: str, value: float, *, allow_zero: bool = False) -> float:
    ok = value >= 0 if allow_zero else value > 0
    if not (ok and math.isfinite(value)):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return float(value)


class RoutingMeta:
    """The prober's fold of ``ModelControlStatus`` polls into :class:`MetaSnapshot` values.

    ``h = ema_halflife_compute_seconds`` when > 0, else ``rebalance_compute_seconds``; both can
    change between polls (pass them to :meth:`observe`). Deltas are taken per (model, worker)
    against that pair's last poll, so a worker missing from a round neither fakes a restart nor
    loses its traffic: its next poll covers both intervals. A pair seen for the first time
    counts from zero (a worker that served before the gateway started gives its lifetime
    average); a pair whose counters went backwards (the worker restarted) is re-baselined and
    adds nothing that round. Callers run on one event loop; :meth:`observe` is synchronous.
    """

    def __init__(
        self,
        *,
        rebalance_compute_seconds: float = 300.0,
        ema_halflife_compute_seconds: float = 0.0,
    ) -> None:
        self.rebalance_compute_seconds = _positive_finite(
            "rebalance_compute_seconds", rebalance_compute_seconds
        )
        self.ema_halflife_compute_seconds = _positive_finite(
            "ema_halflife_compute_seconds", ema_halflife_compute_seconds, allow_zero=True
        )
        self._last: dict[tuple[str, str], _Counters] = {}
        self._models: dict[str, ModelMeta] = {}
        self._snapshot = MetaSnapshot.empty()

    @property
    def halflife(self) -> float:
        """The effective EWMA half-life in compute-seconds."""
        h = self.ema_halflife_compute_seconds
        return h if h > 0 else self.rebalance_compute_seconds

    @property
    def snapshot(self) -> MetaSnapshot:
        """The last published snapshot (:meth:`MetaSnapshot.empty` before the first poll)."""
        return self._snapshot

    def observe(
        self,
        polls: Mapping[str, control_pb2.ModelControlStatusResponse],
        *,
        rebalance_compute_seconds: float | None = None,
        ema_halflife_compute_seconds: float | None = None,
    ) -> MetaSnapshot:
        """Fold one round of polls (worker URL → response; failed workers absent) in.

        Knobs given here replace the stored ones from this poll on. Returns (and keeps as
        :attr:`snapshot`) the new snapshot.
        """
        if rebalance_compute_seconds is not None:
            self.rebalance_compute_seconds = _positive_finite(
                "rebalance_compute_seconds", rebalance_compute_seconds
            )
        if ema_halflife_compute_seconds is not None:
            self.ema_halflife_compute_seconds = _positive_finite(
                "ema_halflife_compute_seconds", ema_halflife_compute_seconds, allow_zero=True
            )
        rounds: dict[str, _Round] = {}
        workers: dict[str, WorkerMeta] = {}
        fleet_compute = 0.0
        for url in sorted(polls):
            response = polls[url]
            workers[url] = _worker_meta(url, response)
            seen: set[str] = set()
            for status in response.models:
                if status.name in seen:  # a malformed poll; the first entry wins
                    continue
                seen.add(status.name)
                fleet_compute += status.total_compute_seconds
                self._accumulate(rounds.setdefault(status.name, _Round()), url, status)

        dt = sum(r.d_compute for r in rounds.values())
        alpha = ewma_alpha(dt, self.halflife)
        for name, r in rounds.items():
            self._models[name] = self._updated(name, r, alpha)
        models = dict(sorted(self._models.items()))
        self._snapshot = MetaSnapshot(
            models=MappingProxyType(models),
            workers=MappingProxyType(workers),
            fleet_compute=fleet_compute,
            compute_delta=dt,
            fleet_cost_per_item=_mean(m.cost_per_item for m in models.values()),
            fleet_cost_per_request=_mean(m.cost_per_request for m in models.values()),
        )
        return self._snapshot

    def _accumulate(self, r: _Round, url: str, status: control_pb2.ModelStatus) -> None:
        """Add one worker's report of a model to the round, with re-baselined deltas."""
        r.workers.append(url)
        r.weight_nbytes = max(r.weight_nbytes, status.weight_nbytes)
        r.max_batch = max(r.max_batch, status.max_batch_size)
        if r.locator is None and status.batch_input_name:
            r.locator = (status.batch_input_name, status.batch_axis)
        r.total_compute += status.total_compute_seconds
        r.requests += status.requests_served
        r.rows += status.rows_served
        now = _Counters(status.total_compute_seconds, status.requests_served, status.rows_served)
        before = self._last.get((status.name, url), _Counters())
        self._last[(status.name, url)] = now
        if now.compute < before.compute or now.requests < before.requests or now.rows < before.rows:
            return  # the worker restarted: re-baseline, no delta this round
        r.d_compute += now.compute - before.compute
        r.d_requests += now.requests - before.requests
        r.d_rows += now.rows - before.rows

    def _updated(self, name: str, r: _Round, alpha: float) -> ModelMeta:
        """The model's new metadata: this round's sums, costs folded with ``alpha``."""
        old = self._models.get(name)
        per_request = old.cost_per_request if old is not None else None
        per_item = old.cost_per_item if old is not None else None
        if r.d_requests > 0:
            per_request = _fold(per_request, r.d_compute / r.d_requests, alpha)
        if r.d_rows > 0:
            per_item = _fold(per_item, r.d_compute / r.d_rows, alpha)
        locator = r.locator
        if locator is None:
            locator = (old.batch_input_name, old.batch_axis) if old is not None else ("", 0)
        return ModelMeta(
            name=name,
            weight_nbytes=r.weight_nbytes,
            max_batch=r.max_batch,
            batch_input_name=locator[0],
            batch_axis=locator[1],
            cost_per_request=per_request,
            cost_per_item=per_item,
            total_compute=r.total_compute,
            requests=r.requests,
            rows=r.rows,
            workers=tuple(r.workers),
        )


def _worker_meta(url: str, response: control_pb2.ModelControlStatusResponse) -> WorkerMeta:
    return WorkerMeta(
        url=url,
        weight_cache_max_bytes=response.weight_cache_max_bytes,
        discipline=response.discipline,
        residency_mode=response.residency_mode,
        models=tuple(sorted({m.name for m in response.models})),
        device_resident=frozenset(m.name for m in response.models if m.device_resident),
        pinned=frozenset(
            m.name for m in response.models if m.residency == control_pb2.PINNED_DEVICE
        ),
        weight_load_bytes_total=response.weight_load_bytes_total,
        weight_load_seconds_total=response.weight_load_seconds_total,
    )


def _measured(cost: float | None) -> float | None:
    return cost if cost is not None and cost > 0 and math.isfinite(cost) else None


def _mean(costs: Iterable[float | None]) -> float | None:
    values = [c for c in map(_measured, costs) if c is not None]
    return sum(values) / len(values) if values else None


def request_weight(
    basis: str,
    units: int,
    model: str,
    snapshot: MetaSnapshot,
    repack_cost_per_request: Mapping[str, float],
) -> float:
    """One request's weight on its worker's load counter.

    ``items`` → units; ``compute`` → units * the model's cost per item, else the fleet mean,
    else 1.0; ``requests`` → the model's cost per request from the last repack, else the
    fleet mean cost per request, else 1.0 (so a 32-item request weighs what a 1-item one
    does). ``basis`` is case-insensitive; units below 1 count as 1 (as item counting does);
    a cost that is ``None``, not > 0 or not finite counts as unmeasured.

    Raises:
        ValueError: ``basis`` is not one of :data:`WORK_BASES`.
    """
    kind = basis.lower()
    n = max(1, units)
    if kind == "items":
        return float(n)
    if kind == "compute":
        meta = snapshot.models.get(model)
        own = _measured(meta.cost_per_item) if meta is not None else None
        return n * _first_measured(own, snapshot.fleet_cost_per_item)
    if kind == "requests":
        own = _measured(repack_cost_per_request.get(model))
        return _first_measured(own, snapshot.fleet_cost_per_request)
    raise ValueError(f"unknown work basis {basis!r}; expected one of {', '.join(WORK_BASES)}")


def _first_measured(*costs: float | None) -> float:
    for cost in costs:
        measured = _measured(cost)
        if measured is not None:
            return measured
    return 1.0
