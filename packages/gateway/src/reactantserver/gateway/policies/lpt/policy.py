"""The ``lpt_packing`` policy at run time: tick, repack, fill plans, routing, compaction.

Every prober round feeds the status polls to :meth:`LptPolicy.observe` (the *tick*): fill plans
are refreshed and the fleet's consumed compute is accumulated; once it reaches the active
budget (or an operator asked) the policy *repacks*: arrival-rate and cost EWMAs give each model
its utilisation ``u``, :func:`compute_assignment` places models on workers, the replica router
is re-installed with live counters carried over, and changed workers are compacted
. Requests are routed by :class:`ReplicaRouter` over the installed
placement. Operator control lives in :mod:`reactantserver.gateway.policies.lpt.control`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from reactantserver.core.protocol import control_pb2
from reactantserver.gateway.policies.knobs import SchedulingKnobs
from reactantserver.gateway.policies.lpt import control as lpt_control
from reactantserver.gateway.policies.lpt.control import RepackRecord
from reactantserver.gateway.policies.lpt.fill import FillPlan, ReplicaRouter, resolve_fill_plan
from reactantserver.gateway.policies.lpt.overrides import ModelOverride
from reactantserver.gateway.policies.lpt.packing import (
    ModelDemand,
    ModelPlacement,
    Replicas,
    WorkerBudget,
    compute_assignment,
    placement_change,
)
from reactantserver.gateway.policies.policy import Choice
from reactantserver.gateway.policies.routing_meta import (
    MetaSnapshot,
    RoutingMeta,
    ewma_alpha,
    request_weight,
)
from reactantserver.gateway.views.metrics import GatewayMetrics
from reactantserver.gateway.workers.link import COMPACT_MEMORY, WorkerLink, compact_deadline

__all__ = ["LptPolicy"]

_log = logging.getLogger("reactantserver.gateway")


class LptPolicy:
    """Concentrate each model on its replicas and balance compute and memory across workers."""

    mode = "lpt_packing"
    needs_status = True

    def __init__(
        self,
        knobs: SchedulingKnobs,
        overrides: Mapping[str, ModelOverride],
        links: Sequence[WorkerLink],
        metrics: GatewayMetrics,
        *,
        request_timeout_seconds: float,
    ) -> None:
        self.knobs = knobs
        self.overrides: Mapping[str, ModelOverride] = dict(overrides)
        self.links = list(links)
        self.labels = {link.url: link.label for link in links}
        self.metrics = metrics
        self.request_timeout_seconds = request_timeout_seconds
        self.meta = RoutingMeta(
            rebalance_compute_seconds=knobs.rebalance_compute_seconds,
            ema_halflife_compute_seconds=knobs.ema_halflife_compute_seconds,
        )
        self.router = ReplicaRouter()
        self.placement: dict[str, ModelPlacement] = {}
        self.drifted: frozenset[str] = frozenset()
        self.utilization: dict[str, float] = {}
        self.arrival_rate: dict[str, float] = {}
        self.cost_per_request: dict[str, float] = {}
        self._arrivals: collections.Counter[str] = collections.Counter()
        self._baseline: dict[str, tuple[float, int]] = {}
        self.compute_accum = 0.0
        self.first_tick_repack_done = False
        self.repacks_since_compaction = 0
        self.operator_requested = 0
        self.operator_completed = 0
        self.last = RepackRecord()
        self.last_tick_unix = 0.0
        self.ready_workers = 0
        self.assigned_bytes: dict[str, int] = {}
        self.budgets: dict[str, int] = {}
        self._ticks = 0
        self._last_repack_wall: float | None = None
        self._last_repack_compute = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        #: Set by the server: run the next prober round now (operator repack).
        self.wake: Callable[[], None] = lambda: None

    # -------------------------------------------------------------- Policy

    def batch_locator(self, model: str) -> tuple[str, int] | None:
        """The batch input and axis of the model's fill plan, once the workers reported one."""
        plan = self.router.plan(model)
        if not plan.batch_input_name or plan.batch_axis <= 0:
            return None
        return plan.batch_input_name, plan.batch_axis

    def choose(self, model: str, replicas: tuple[str, ...], units: int) -> Choice:
        """``route_replica``: the placed replica the fill plan picks, then failover order."""
        self._arrivals[model] += 1
        weight = request_weight(
            self.knobs.work_basis, units, model, self.meta.snapshot, self.cost_per_request
        )
        route = self.router.route(model, units, weight, replicas)
        if route is None:
            return Choice(())
        reservation = route.reservation
        if reservation is None:
            return Choice(route.order)
        worker = reservation.worker
        self.metrics.replica_routed_total.labels(model=model, worker=self._label(worker)).inc()
        self._publish_worker(model, worker)

        def release() -> None:
            self.router.release(reservation)
            self._publish_worker(model, worker)

        return Choice(route.order, release)

    def _label(self, url: str) -> str:
        return self.labels.get(url, url)

    def _publish_worker(self, model: str, worker: str) -> None:
        label = self._label(worker)
        self.metrics.replica_outstanding.labels(model=model, worker=label).set(
            self.router.outstanding(model, worker)
        )
        self.metrics.worker_inflight_work.labels(worker=label, basis=self.knobs.work_basis).set(
            self.router.worker_load(worker)
        )

    # ---------------------------------------------------------------- tick

    def observe(self, polls: Mapping[str, control_pb2.ModelControlStatusResponse]) -> None:
        """One tick: fold the polls in, refresh fill plans, repack when the budget is spent."""
        snapshot = self.meta.observe(
            polls,
            rebalance_compute_seconds=self.knobs.rebalance_compute_seconds,
            ema_halflife_compute_seconds=self.knobs.ema_halflife_compute_seconds,
        )
        self.last_tick_unix = time.time()
        self.ready_workers = sum(1 for link in self.links if link.ready)
        self.router.set_plans(self.fill_plans(snapshot))
        if self._ticks > 0:  # the first observation only baselines
            self.compute_accum += max(0.0, snapshot.compute_delta)
        self._ticks += 1
        if not polls:
            return
        if self.operator_requested > self.operator_completed:
            requested = self.operator_requested
            self.repack("operator", polls)
            self.operator_completed = requested
            return
        threshold = self.knobs.active_threshold(self.first_tick_repack_done)
        if self.compute_accum > 0 and self.compute_accum >= threshold:
            self.repack("compute", polls)
            self.first_tick_repack_done = True
            self.compute_accum = 0.0

    def fill_plans(self, snapshot: MetaSnapshot) -> dict[str, FillPlan]:
        """Every reported or overridden model's fill plan under the current knobs."""
        plans: dict[str, FillPlan] = {}
        for name in sorted({*snapshot.models, *self.overrides}):
            meta = snapshot.models.get(name)
            override = self.overrides.get(name, ModelOverride())
            plans[name] = resolve_fill_plan(
                name,
                max_batch=meta.max_batch if meta is not None else None,
                default_mode=self.knobs.routing_fill_mode,
                default_factor=self.knobs.routing_fill_factor,
                override_mode=override.fill_mode,
                override_factor=override.fill_factor,
                batch_input_name=meta.batch_input_name if meta is not None else "",
                batch_axis=meta.batch_axis if meta is not None else 0,
            )
        return plans

    # -------------------------------------------------------------- repack

    def startup_repack(self, polls: Mapping[str, control_pb2.ModelControlStatusResponse]) -> None:
        """The initial placement, once the preconditions hold."""
        self.observe_without_repack(polls)
        self.repack("startup", polls)

    def observe_without_repack(
        self, polls: Mapping[str, control_pb2.ModelControlStatusResponse]
    ) -> None:
        """Fold polls in and refresh fill plans (the start-up baseline)."""
        snapshot = self.meta.observe(polls)
        self._ticks += 1
        self.ready_workers = len(polls)
        self.router.set_plans(self.fill_plans(snapshot))

    def repack(
        self, trigger: str, polls: Mapping[str, control_pb2.ModelControlStatusResponse]
    ) -> None:
        """Recompute the placement from fresh EWMAs and install it."""
        snapshot = self.meta.snapshot
        now = time.monotonic()
        wall = 0.0 if self._last_repack_wall is None else now - self._last_repack_wall
        compute = max(0.0, snapshot.fleet_compute - self._last_repack_compute)
        self._fold_rates(snapshot, wall, compute)
        workers = sorted(polls)
        everywhere = {
            name
            for name, meta in snapshot.models.items()
            if set(workers) <= set(meta.workers) and meta.workers
        }
        demands = [
            ModelDemand(name, self.utilization.get(name, 0.0), snapshot.models[name].weight_nbytes)
            for name in sorted(everywhere)
        ]
        budgets = [WorkerBudget(url, polls[url].weight_cache_max_bytes) for url in workers]
        replicas: dict[str, Replicas] = {
            name: o.replicas for name, o in self.overrides.items() if o.replicas is not None
        }
        before = {name: p.workers for name, p in self.placement.items()}
        assignment = compute_assignment(
            demands,
            budgets,
            default_replicas=self.knobs.default_replicas,
            replicas=replicas,
            forbid_memory_oversubscription=self.knobs.forbid_memory_oversubscription,
            hysteresis=self.knobs.hysteresis,
            previous=before,
        )
        placement = dict(assignment.placement)
        drifted = sorted(set(snapshot.models) - everywhere)
        for name in drifted:
            owners = tuple(sorted(w for w in snapshot.models[name].workers if w in polls))
            if owners:
                placement[name] = ModelPlacement(owners, tuple(1 / len(owners) for _ in owners))
                _log.warning("model %s is not on every worker; spread over %s", name, owners)
        change = placement_change(before, {n: p.workers for n, p in placement.items()})
        self.placement = placement
        self.drifted = frozenset(drifted)
        self.router.install(
            placement, self.fill_plans(snapshot), routing_policy=self.knobs.routing_policy
        )
        self.budgets = {b.url: b.cap for b in budgets}
        self.assigned_bytes = dict(assignment.memory_load)
        self.last = RepackRecord(
            unix_seconds=time.time(),
            wall_elapsed=wall,
            compute_seconds=compute,
            trigger=trigger,
            models_placed=len(placement),
            models_moved=len(change.moved),
            count=self.last.count + 1,
        )
        self._last_repack_wall = now
        self._last_repack_compute = snapshot.fleet_compute
        _log.info(
            "repack trigger=%s models=%d moved=%d held=%d max_improvement=%.3f "
            "hysteresis=%.3f compute=%.3fs wall=%.3fs",
            trigger,
            len(placement),
            len(change.moved),
            assignment.held,
            assignment.max_improvement,
            self.knobs.hysteresis,
            compute,
            wall,
        )
        for url, used in assignment.memory_load.items():
            cap = self.budgets.get(url, 0)
            if cap > 0 and used > cap:
                _log.warning("worker %s: assigned %d bytes over its %d budget", url, used, cap)
        self._publish_repack(trigger, placement)
        self._compact(change.changed_workers)

    def _fold_rates(self, snapshot: MetaSnapshot, wall: float, compute: float) -> None:
        alpha = ewma_alpha(compute, self.meta.halflife) if compute > 0 else 0.0
        for name, meta in snapshot.models.items():
            if wall > 0:
                sample = self._arrivals.get(name, 0) / wall
                old = self.arrival_rate.get(name)
                self.arrival_rate[name] = (
                    sample if old is None else (1 - alpha) * old + alpha * sample
                )
            base = self._baseline.get(name)
            if base is not None:
                d_compute, d_requests = meta.total_compute - base[0], meta.requests - base[1]
                if d_compute >= 0 and d_requests > 0:
                    sample = d_compute / d_requests
                    old_cost = self.cost_per_request.get(name)
                    self.cost_per_request[name] = (
                        sample if old_cost is None else (1 - alpha) * old_cost + alpha * sample
                    )
            elif meta.requests > 0 and meta.cost_per_request is not None:
                self.cost_per_request[name] = meta.cost_per_request
            self._baseline[name] = (meta.total_compute, meta.requests)
            rate = self.arrival_rate.get(name, 0.0)
            cost = self.cost_per_request.get(name, 0.0)
            self.utilization[name] = rate * cost if rate > 0 and cost > 0 else 0.0
        self._arrivals.clear()

    def _publish_repack(self, trigger: str, placement: Mapping[str, ModelPlacement]) -> None:
        self.metrics.repacks_total.labels(trigger=trigger).inc()
        self.metrics.set_placement(
            {
                name: {self._label(w): wt for w, wt in zip(p.workers, p.weights, strict=True)}
                for name, p in placement.items()
            }
        )
        for name, u in self.utilization.items():
            self.metrics.model_utilization.labels(model=name).set(u)
        for name, plan in self.router_plans().items():
            self.metrics.model_fill_quantum.labels(model=name).set(plan.quantum)

    def router_plans(self) -> dict[str, FillPlan]:
        """The fill plan of every placed model."""
        return {name: self.router.plan(name) for name in self.placement}

    # ----------------------------------------------------------- compaction

    def _compact(self, changed_workers: Sequence[str]) -> None:
        mode, interval = self.knobs.compaction_mode, self.knobs.compaction_interval
        if mode == "off" or interval <= 0:
            return
        self.repacks_since_compaction += 1
        if self.repacks_since_compaction < interval or not changed_workers:
            return
        self.repacks_since_compaction = 0
        by_url = {link.url: link for link in self.links}
        for url in changed_workers:
            link = by_url.get(url)
            if link is None:
                continue
            models: list[str] = []
            if mode == "scheduled":
                models = sorted(n for n, p in self.placement.items() if url in p.workers)
            request = control_pb2.CompactMemoryRequest(reload_models=models)
            task = asyncio.get_running_loop().create_task(self._compact_one(link, request))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _compact_one(
        self, link: WorkerLink, request: control_pb2.CompactMemoryRequest
    ) -> None:
        timeout = compact_deadline(self.request_timeout_seconds)
        try:
            await link.call(COMPACT_MEMORY, request.SerializeToString(), timeout=timeout)
        except Exception as error:  # isolated per worker
            _log.warning("CompactMemory on %s failed: %s", link.label, error)

    # -------------------------------------------------------- GatewayControl

    def scheduling_status(self) -> control_pb2.GetSchedulingStatusResponse:
        """``GetSchedulingStatus``."""
        return lpt_control.scheduling_status(self)

    def set_scheduling_policy(
        self, request: control_pb2.SetSchedulingPolicyRequest
    ) -> control_pb2.SetSchedulingPolicyResponse:
        """``SetSchedulingPolicy``."""
        return lpt_control.set_scheduling_policy(self, request)

    def set_model_placement(
        self, request: control_pb2.SetModelPlacementRequest
    ) -> control_pb2.SetModelPlacementResponse:
        """``SetModelPlacement``."""
        return lpt_control.set_model_placement(self, request)

    async def repack_rpc(self, request: control_pb2.RepackRequest) -> control_pb2.RepackResponse:
        """``Repack``."""
        return await lpt_control.repack(self, request)
