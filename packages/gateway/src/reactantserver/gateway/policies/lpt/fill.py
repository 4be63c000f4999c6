"""Fill plans and per-request replica selection of ``lpt_packing``.

Pure: no I/O, no clocks. The repack installs a placement with its fill plans, each tick
republishes the plans, and the ModelInfer path routes and releases::

    router = ReplicaRouter()
    router.install(assignment.placement, plans, routing_policy="fill_least")   # every repack
    route = router.route("m", units=4, weight=0.008, discovered=["w0:8001", "w1:8001"])
    try: ...forward to route.order...
    finally:
        if route.reservation is not None:
            router.release(route.reservation)

The quantum counts items: a run closes once it has taken ``Q`` items, so one 32-item request
closes a run of ``Q = 32``. Worker loads are kept in integer nanoseconds (like ``model_aware``)
so equal loads tie exactly and every release returns a counter to exactly 0.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Literal, TypeAlias, TypeVar

import attrs

from reactantserver.gateway.policies.lpt.packing import ModelPlacement

__all__ = [
    "FILL_MODES",
    "ROUTING_POLICIES",
    "FillMode",
    "FillPlan",
    "ReplicaReservation",
    "ReplicaRoute",
    "ReplicaRouter",
    "RoutingPolicy",
    "resolve_fill_plan",
]

FillMode: TypeAlias = Literal["run", "spread", "inflight"]
"""How a multi-replica model's requests fill its replicas."""
RoutingPolicy: TypeAlias = Literal["fill_least", "fill_rr"]
"""``fill_least`` breaks ties by worker load before rotation; ``fill_rr`` by rotation only."""

FILL_MODES: tuple[FillMode, ...] = ("run", "spread", "inflight")
ROUTING_POLICIES: tuple[RoutingPolicy, ...] = ("fill_least", "fill_rr")

_NS = 1_000_000_000
_K = TypeVar("_K")


def _fill_mode(value: str) -> FillMode:
    for mode in FILL_MODES:
        if value == mode:
            return mode
    raise ValueError(f"fill mode must be one of {', '.join(FILL_MODES)}, got {value!r}")


def _routing_policy(value: str) -> RoutingPolicy:
    for policy in ROUTING_POLICIES:
        if value == policy:
            return policy
    raise ValueError(f"routing policy must be one of {', '.join(ROUTING_POLICIES)}, got {value!r}")


@attrs.frozen
class FillPlan:
    """One model's fill mode, quantum ``Q`` (items, ≥ 1) and batch locator (``""``/0 = none)."""

    mode: FillMode
    quantum: int = attrs.field(validator=attrs.validators.ge(1))
    batch_input_name: str = ""
    batch_axis: int = 0


#: The plan of a model nobody resolved one for: ``run``, ``Q = 1``, no locator.
_UNKNOWN_PLAN = FillPlan("run", 1)


def resolve_fill_plan(
    model: str,
    *,
    max_batch: int | None,
    default_mode: str,
    default_factor: float,
    override_mode: str | None,
    override_factor: float | None,
    batch_input_name: str = "",
    batch_axis: int = 0,
) -> FillPlan:
    """Resolve ``model``'s fill plan.

    Mode = the override unless ``None``/``"inherit"``, else ``default_mode``; factor = the
    override if > 0, else ``default_factor``; ``Q = max(1, round(factor * max_batch))`` when
    the worker-reported ``max_batch`` is > 0 (Python's ``round``: halves go to even), else 1 —
    so an unreported model gets ``Q = 1``.

    Raises:
        ValueError: an unknown mode, or a ``default_factor`` that is not > 0.
    """
    if not (default_factor > 0 and math.isfinite(default_factor)):
        raise ValueError(f"{model}: routing_fill_factor must be > 0, got {default_factor}")
    chosen = override_mode if override_mode not in (None, "inherit") else default_mode
    try:
        mode = _fill_mode(str(chosen))
    except ValueError as exc:
        raise ValueError(f"{model}: {exc}") from None
    factor = default_factor
    if override_factor is not None and override_factor > 0 and math.isfinite(override_factor):
        factor = override_factor
    quantum = max(1, round(factor * max_batch)) if max_batch is not None and max_batch > 0 else 1
    return FillPlan(mode, quantum, batch_input_name, batch_axis)


@attrs.frozen
class ReplicaReservation:
    """What one routed request holds: ``units`` in-flight items and ``weight_ns`` worker load."""

    token: int
    model: str
    worker: str
    units: int
    weight_ns: int


@attrs.frozen
class ReplicaRoute:
    """A routing decision: ``order[0]`` is the choice, the rest the failover order.

    ``reservation`` is ``None`` when the request is untracked (no placement: round robin).
    """

    order: tuple[str, ...]
    reservation: ReplicaReservation | None


@attrs.define
class _Run:
    """A model's fill state: the rotation cursor (last chosen URL) and the open run."""

    cursor: str | None = None
    target: str | None = None  # None: no run open
    items: int = 0


class ReplicaRouter:
    """``route_replica`` over an installed placement, with its live counters.

    Counters — in-flight items and routed requests per (model, worker), load per worker —
    survive :meth:`install`, so requests routed before a repack release correctly after it.
    Callers run on one event loop and :meth:`route`/:meth:`release` never await, so each
    selection is atomic: that is the per-model selection lock.
    """

    def __init__(self) -> None:
        self._placement: dict[str, tuple[str, ...]] = {}
        self._plans: dict[str, FillPlan] = {}
        self._policy: RoutingPolicy = "fill_least"
        self._outs: dict[tuple[str, str], int] = {}
        self._routed: dict[tuple[str, str], int] = {}
        self._load_ns: dict[str, int] = {}
        self._runs: dict[str, _Run] = {}
        self._open: dict[int, ReplicaReservation] = {}
        self._tokens = 0

    # --- installation ----------------------------------------------------------------------

    def install(
        self,
        placement: Mapping[str, ModelPlacement],
        plans: Mapping[str, FillPlan],
        *,
        routing_policy: str,
    ) -> None:
        """Install a new placement and its plans; live counters carry over.

        Every open run is ended; rotation cursors are kept. Models with no workers are treated
        as unplaced (round robin).
        """
        policy = _routing_policy(routing_policy)
        self._placement = {
            name: tuple(sorted(set(p.workers))) for name, p in placement.items() if p.workers
        }
        self._plans = dict(plans)
        self._policy = policy
        for run in self._runs.values():
            run.target, run.items = None, 0

    def set_plans(self, plans: Mapping[str, FillPlan]) -> None:
        """Republish the fill plans (each tick, ``SetModelPlacement``); runs stay open."""
        self._plans = dict(plans)

    def set_routing_policy(self, routing_policy: str) -> None:
        """Switch ``fill_least``/``fill_rr`` (a live knob) without a repack."""
        self._policy = _routing_policy(routing_policy)

    # --- accessors -------------------------------------------------------------------------

    @property
    def routing_policy(self) -> RoutingPolicy:
        """The tie-break policy in force."""
        return self._policy

    def replicas(self, model: str) -> tuple[str, ...]:
        """The model's placed workers, sorted (empty when it has no placement)."""
        return self._placement.get(model, ())

    def plan(self, model: str) -> FillPlan:
        """The model's fill plan (``run``, ``Q = 1``, no locator when none was resolved)."""
        return self._plans.get(model, _UNKNOWN_PLAN)

    def outstanding(self, model: str, worker: str) -> int:
        """In-flight items of ``model`` on ``worker``."""
        return self._outs.get((model, worker), 0)

    def routed_total(self, model: str, worker: str) -> int:
        """Requests of ``model`` routed to ``worker`` with a reservation, ever."""
        return self._routed.get((model, worker), 0)

    def worker_load(self, worker: str) -> float:
        """The reserved weight in flight on ``worker`` (work-basis units)."""
        return self._load_ns.get(worker, 0) / _NS

    def cursor(self, model: str) -> str | None:
        """The worker the model's rotation last chose (``None`` before the first choice)."""
        run = self._runs.get(model)
        return run.cursor if run is not None else None

    # --- routing ---------------------------------------------------------------------------

    def route(
        self, model: str, units: int, weight: float, discovered: Sequence[str]
    ) -> ReplicaRoute | None:
        """Choose a replica for one request and reserve it; ``None`` when nothing serves it.

        Without a placement: round robin over ``discovered`` (sorted), untracked. Otherwise the
        placed replicas (not filtered by ``discovered``; failover covers a dead one) by the
        model's fill mode, then ``discovered`` workers outside the placement as extra failover.
        Units below 1 count as 1.

        Raises:
            ValueError: ``weight`` is negative or not finite.
        """
        if not (weight >= 0 and math.isfinite(weight)):
            raise ValueError(f"request weight must be finite and >= 0, got {weight}")
        replicas = self._placement.get(model)
        if not replicas:
            return self._round_robin(model, discovered)
        units = max(1, units)
        run = self._runs.setdefault(model, _Run())
        outs = [self._outs.get((model, w), 0) for w in replicas]
        plan = self.plan(model)
        if len(replicas) == 1:
            chosen = replicas[0]
        elif plan.mode == "run":
            chosen = self._choose_run(run, replicas, outs, plan.quantum, units)
        elif plan.mode == "spread":
            chosen = self._choose_spread(run, replicas, outs)
        else:
            chosen = self._choose_inflight(run, replicas, outs, plan.quantum)
        q = plan.quantum
        others = sorted((o // q, o, w) for w, o in zip(replicas, outs, strict=True) if w != chosen)
        outside = sorted(set(discovered) - set(replicas))
        order = (chosen, *(w for _, _, w in others), *outside)
        return ReplicaRoute(order, self._reserve(model, chosen, units, weight))

    def release(self, reservation: ReplicaReservation) -> bool:
        """Return a reservation's items and load; ``False`` (no change) if already released."""
        if self._open.pop(reservation.token, None) is None:
            return False
        _subtract(self._outs, (reservation.model, reservation.worker), reservation.units)
        _subtract(self._load_ns, reservation.worker, reservation.weight_ns)
        return True

    def _reserve(self, model: str, worker: str, units: int, weight: float) -> ReplicaReservation:
        self._tokens += 1
        reservation = ReplicaReservation(self._tokens, model, worker, units, round(weight * _NS))
        self._open[reservation.token] = reservation
        key = (model, worker)
        self._outs[key] = self._outs.get(key, 0) + units
        self._routed[key] = self._routed.get(key, 0) + 1
        if reservation.weight_ns:
            self._load_ns[worker] = self._load_ns.get(worker, 0) + reservation.weight_ns
        return reservation

    def _round_robin(self, model: str, discovered: Sequence[str]) -> ReplicaRoute | None:
        workers = sorted(set(discovered))
        if not workers:
            return None
        run = self._runs.setdefault(model, _Run())
        start = bisect.bisect_right(workers, run.cursor) if run.cursor is not None else 0
        start %= len(workers)
        run.cursor = workers[start]
        return ReplicaRoute(tuple(workers[start:] + workers[:start]), None)

    def _ranks(self, run: _Run, replicas: tuple[str, ...]) -> list[tuple[int, int]]:
        """Per replica ``([wl], rot)``: ``wl`` only under ``fill_least`` (else 0)."""
        n = len(replicas)
        start = bisect.bisect_right(replicas, run.cursor) if run.cursor is not None else 0
        least = self._policy == "fill_least"
        return [
            (self._load_ns.get(w, 0) if least else 0, (i - start) % n)
            for i, w in enumerate(replicas)
        ]

    def _choose_run(
        self, run: _Run, replicas: tuple[str, ...], outs: list[int], q: int, units: int
    ) -> str:
        floors = [o // q for o in outs]
        floor_q = min(floors)
        behind = [f > floor_q for f in floors]
        target = replicas.index(run.target) if run.target in replicas else None
        if target is not None and run.items < q and not behind[target] and sum(outs) > 0:
            run.items += units
            return replicas[target]
        ranks = self._ranks(run, replicas)
        best = min(range(len(replicas)), key=lambda i: (behind[i], *ranks[i]))
        run.cursor = run.target = replicas[best]
        run.items = units
        return replicas[best]

    def _choose_spread(self, run: _Run, replicas: tuple[str, ...], outs: list[int]) -> str:
        ranks = self._ranks(run, replicas)
        best = min(range(len(replicas)), key=lambda i: (outs[i], *ranks[i]))
        run.cursor = replicas[best]
        return replicas[best]

    def _choose_inflight(
        self, run: _Run, replicas: tuple[str, ...], outs: list[int], q: int
    ) -> str:
        prog = [(o // q, -o) for o in outs]
        ranks = self._ranks(run, replicas)
        best = min(range(len(replicas)), key=lambda i: (prog[i], *ranks[i]))
        if prog.count(prog[best]) > 1:
            run.cursor = replicas[best]
        return replicas[best]


def _subtract(counters: dict[_K, int], key: _K, n: int) -> None:
    """Take ``n`` off ``counters[key]``, dropping the entry at exactly 0."""
    left = counters.get(key, 0) - n
    if left:
        counters[key] = left
    else:
        counters.pop(key, None)
