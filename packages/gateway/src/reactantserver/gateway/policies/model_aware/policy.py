"""The ``model_aware`` policy at run time: status polls in, cold-start-aware choices out.

Glue between the prober, the pure :class:`~reactantserver.gateway.policies.model_aware.estimate.
ModelAwareRouter` (the latency estimate) and :class:`~reactantserver.gateway.policies.routing_meta.
RoutingMeta` (cost per item, batch locator). Workers whose status poll failed are not
estimated: a model with such a replica is routed round robin over its replicas, with a
warning, until the polls come back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import grpc

from reactantserver.core.protocol import control_pb2
from reactantserver.gateway.policies.knobs import (
    SchedulingKnobs,
    apply_policy_request,
    to_proto,
)
from reactantserver.gateway.policies.model_aware.estimate import (
    ModelAwareKnobs,
    ModelAwareRouter,
    ModelResidency,
    Reservation,
)
from reactantserver.gateway.policies.policy import Choice, RoundRobin
from reactantserver.gateway.policies.routing_meta import RoutingMeta
from reactantserver.gateway.transport.proxy import ForwardError
from reactantserver.gateway.views.metrics import GatewayMetrics
from reactantserver.gateway.workers.link import WorkerLink

__all__ = ["ModelAwarePolicy"]

_log = logging.getLogger("reactantserver.gateway")
_PINNED = control_pb2.PINNED_DEVICE


class ModelAwarePolicy:
    """Route each request to the worker with the smallest estimated latency ``E(w)``."""

    mode = "model_aware"
    needs_status = True

    def __init__(
        self,
        knobs: SchedulingKnobs,
        network_seconds: Mapping[str, float],
        links: Sequence[WorkerLink],
        metrics: GatewayMetrics,
    ) -> None:
        self.knobs = knobs
        self._network = dict(network_seconds)
        self.router = ModelAwareRouter(self._router_knobs())
        self.meta = RoutingMeta(
            rebalance_compute_seconds=knobs.rebalance_compute_seconds,
            ema_halflife_compute_seconds=knobs.ema_halflife_compute_seconds,
        )
        self.links = list(links)
        self._labels = {link.url: link.label for link in links}
        self.metrics = metrics
        self._polled: frozenset[str] = frozenset()
        self._fallback = RoundRobin()
        self._warned: set[str] = set()

    def _router_knobs(self) -> ModelAwareKnobs:
        k = self.knobs
        return ModelAwareKnobs(
            cold_load_penalty=k.cold_load_penalty,
            default_load_bandwidth_bytes_per_second=k.default_load_bandwidth_bytes_per_second,
            load_overhead_seconds=k.load_overhead_seconds,
            network_seconds=self._network,
        )

    # -------------------------------------------------------------- Policy

    def batch_locator(self, model: str) -> tuple[str, int] | None:
        """The worker-reported batch input and axis, once known."""
        meta = self.meta.snapshot.models.get(model)
        if meta is None or not meta.batch_input_name or meta.batch_axis <= 0:
            return None
        return meta.batch_input_name, meta.batch_axis

    def observe(self, polls: Mapping[str, control_pb2.ModelControlStatusResponse]) -> None:
        """Fold one round of polls into the costs, the residency mirror and the bandwidths."""
        self.meta.observe(
            polls,
            rebalance_compute_seconds=self.knobs.rebalance_compute_seconds,
            ema_halflife_compute_seconds=self.knobs.ema_halflife_compute_seconds,
        )
        for url, poll in polls.items():
            self.router.observe_worker(
                url,
                [
                    ModelResidency(
                        model=m.name,
                        weight_nbytes=m.weight_nbytes,
                        device_resident=m.device_resident,
                        pinned=m.residency == _PINNED,
                    )
                    for m in poll.models
                ],
                cache_max_bytes=poll.weight_cache_max_bytes,
                load_bytes_total=poll.weight_load_bytes_total,
                load_seconds_total=poll.weight_load_seconds_total,
            )
            self.metrics.worker_load_bandwidth_bytes_per_second.labels(
                worker=self._labels.get(url, url)
            ).set(self.router.bandwidth.bandwidth(url))
        self._polled = frozenset(polls)

    def choose(self, model: str, replicas: tuple[str, ...], units: int) -> Choice:
        """Argmin of ``E(w)`` over the replicas; round robin while a replica is unpolled."""
        unpolled = [url for url in replicas if url not in self._polled]
        if unpolled:
            if model not in self._warned:
                self._warned.add(model)
                _log.warning(
                    "model_aware: no status from %s; routing %s round robin",
                    ",".join(unpolled),
                    model,
                )
            return self._fallback.choose(model, replicas, units)
        self._warned.discard(model)
        snapshot = self.meta.snapshot
        meta = snapshot.models.get(model)
        route = self.router.route(
            model,
            replicas,
            units=units,
            weight_nbytes=meta.weight_nbytes if meta is not None else 0,
            cost_per_item=meta.cost_per_item if meta is not None else None,
            fleet_cost_per_item=snapshot.fleet_cost_per_item,
        )
        if route is None:
            return Choice(())
        self.metrics.model_aware_routes_total.labels(model=model, placement=route.placement).inc()
        self._publish_inflight(route.reservation.worker)
        reservation = route.reservation

        def release(reservation: Reservation = reservation) -> None:
            self.router.release(reservation)
            self._publish_inflight(reservation.worker)

        return Choice(route.order, release)

    def _publish_inflight(self, url: str) -> None:
        self.metrics.worker_inflight_work.labels(
            worker=self._labels.get(url, url), basis="compute"
        ).set(self.router.inflight_seconds(url))

    # -------------------------------------------------------- GatewayControl

    def scheduling_status(self) -> control_pb2.GetSchedulingStatusResponse:
        """Mode, knobs, per-model residency and per-worker in-flight work and bandwidth."""
        snapshot = self.meta.snapshot
        response = control_pb2.GetSchedulingStatusResponse(
            mode=self.mode, policy=to_proto(self.knobs)
        )
        for name in sorted(snapshot.models):
            meta = snapshot.models[name]
            status = response.models.add(
                name=name,
                weight_nbytes=meta.weight_nbytes,
                max_batch=meta.max_batch,
                cost_seconds=meta.cost_per_request or 0.0,
                effective_replicas=len(meta.workers),
            )
            for url in meta.workers:
                status.replicas.add(
                    worker=self._labels.get(url, url),
                    resident=self.router.mirror.is_resident(url, name),
                )
        for link in self.links:
            worker = snapshot.workers.get(link.url)
            response.workers.add(
                worker=link.label,
                ready=link.ready,
                inflight_compute=self.router.inflight_seconds(link.url),
                weight_budget_bytes=worker.weight_cache_max_bytes if worker else 0,
                load_bandwidth_bytes_per_second=self.router.bandwidth.bandwidth(link.url),
            )
        return response

    def set_scheduling_policy(
        self, request: control_pb2.SetSchedulingPolicyRequest
    ) -> control_pb2.SetSchedulingPolicyResponse:
        """Apply a masked update of the ``model_aware`` knobs (all or nothing)."""
        knobs, warnings = apply_policy_request(
            self.knobs,
            request,
            mode=self.mode,
            compute_accumulated=0.0,
            first_repack_done=False,
        )
        self.knobs = knobs
        self.router.knobs = self._router_knobs()
        self.router.bandwidth.default = knobs.default_load_bandwidth_bytes_per_second
        return control_pb2.SetSchedulingPolicyResponse(
            applied=to_proto(knobs), warnings=warnings, persisted=False
        )

    def set_model_placement(
        self, request: control_pb2.SetModelPlacementRequest
    ) -> control_pb2.SetModelPlacementResponse:
        """Placement overrides belong to ``lpt_packing``."""
        raise ForwardError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "SetModelPlacement needs scheduling.mode lpt_packing",
        )

    async def repack_rpc(self, request: control_pb2.RepackRequest) -> control_pb2.RepackResponse:
        """Repacking belongs to ``lpt_packing``."""
        raise ForwardError(
            grpc.StatusCode.FAILED_PRECONDITION, "Repack needs scheduling.mode lpt_packing"
        )
