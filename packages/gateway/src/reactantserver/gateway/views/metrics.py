"""The gateway's Prometheus metrics: every gateway family of docs/reference/metrics.md, on its own
registry.

The metric objects are attributes; the proxy's hot path uses the typed helpers::

    metrics = GatewayMetrics(mode="lpt_packing")
    metrics.observe_request("ModelInfer", "resnet", grpc.StatusCode.OK, 0.012)
    metrics.observe_worker("ModelInfer", "w0", 0.011)
    metrics.failover("resnet", "w0", "UNAVAILABLE")
    metrics.set_placement({"resnet": {"w0": 0.5, "w1": 0.5}})
    metrics.worker_ready.labels("w0").set(1)
    body = metrics.render()             # served with CONTENT_TYPE

Decisions made here:

* Families of a policy (:data:`LPT_FAMILIES`, :data:`MODEL_AWARE_FAMILIES`) are registered only
  in that ``mode``; in the others their attributes still exist and accept updates, but nothing
  is exported (a labelled family without children would still print its ``HELP``/``TYPE``).
  ``reactantserver_gateway_worker_inflight_work`` is in both policies' sets, so absent under
  ``round_robin``.
* ``reactantserver_gateway_repacks_total`` starts with its three triggers at 0 (lpt), so rates work
  from the
  first repack.
* ``*_created`` series are dropped, like the worker's; the process, GC and platform collectors
  are included (an ordinary per-process registry, no multiprocess mode).
* :meth:`GatewayMetrics.set_placement` also sets ``reactantserver_gateway_model_replicas`` (the
  number of
  workers with a positive weight; 0 for a dropped model).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

__all__ = [
    "CONTENT_TYPE",
    "LATENCY_BUCKETS",
    "LPT_FAMILIES",
    "MODEL_AWARE_FAMILIES",
    "MODES",
    "REPACK_TRIGGERS",
    "GatewayMetrics",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""``Content-Type`` of :meth:`GatewayMetrics.render` (Prometheus text format 0.0.4)."""

LATENCY_BUCKETS = tuple(0.001 * 2**k for k in range(14))
"""Latency upper bounds: ``0.001 * 2**k`` s, k = 0..13, as the worker's (``+Inf`` implied)."""

MODES = ("round_robin", "lpt_packing", "model_aware")
"""The ``scheduling.mode`` values :class:`GatewayMetrics` accepts."""

REPACK_TRIGGERS = ("startup", "compute", "operator")
"""The ``trigger`` label values of ``reactantserver_gateway_repacks_total``."""

LPT_FAMILIES = frozenset(
    {
        "reactantserver_gateway_placement_weight",
        "reactantserver_gateway_model_utilization",
        "reactantserver_gateway_model_replicas",
        "reactantserver_gateway_replica_outstanding",
        "reactantserver_gateway_model_fill_quantum",
        "reactantserver_gateway_repacks_total",
        "reactantserver_gateway_replica_routed_total",
        "reactantserver_gateway_worker_inflight_work",
    }
)
"""Families exported only under ``lpt_packing``."""

MODEL_AWARE_FAMILIES = frozenset(
    {
        "reactantserver_gateway_worker_inflight_work",
        "reactantserver_gateway_model_aware_routes_total",
        "reactantserver_gateway_worker_load_bandwidth_bytes_per_second",
    }
)
"""Families exported only under ``model_aware``."""

_POLICY_FAMILIES = {"lpt_packing": LPT_FAMILIES, "model_aware": MODEL_AWARE_FAMILIES}


class _Registry(CollectorRegistry):
    """A registry whose exposition leaves out the ``*_created`` samples."""

    def collect(self) -> Iterator[Metric]:
        """Every registered family without its ``*_created`` samples."""
        for family in super().collect():
            created = family.name + "_created"
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = [s for s in family.samples if s.name != created]
            yield out


class GatewayMetrics:
    """The gateway's registry and metric objects (one per process; never the global registry).

    ``mode`` is ``scheduling.mode``: it decides which policy families are exported.
    """

    def __init__(self, *, mode: str = "round_robin") -> None:
        if mode not in MODES:
            raise ValueError(f"unknown scheduling mode {mode!r}; expected one of {MODES}")
        self.mode = mode
        self.registry: CollectorRegistry = _Registry()
        exported = _POLICY_FAMILIES.get(mode, frozenset())

        def registry_for(name: str) -> CollectorRegistry | None:
            policy = name in LPT_FAMILIES or name in MODEL_AWARE_FAMILIES
            return self.registry if not policy or name in exported else None

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, labels, registry=registry_for(name))

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(name, doc, labels, registry=registry_for(name))

        def histogram(name: str, doc: str, *labels: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS, registry=self.registry)

        self.requests_total = counter(
            "reactantserver_gateway_requests_total",
            "Requests by RPC, model and final status.",
            "rpc",
            "model",
            "status",
        )
        self.request_latency_seconds = histogram(
            "reactantserver_gateway_request_latency_seconds",
            "Gateway handler wall time.",
            "rpc",
            "model",
        )
        self.worker_latency_seconds = histogram(
            "reactantserver_gateway_worker_latency_seconds",
            "Wall time of calls to a worker.",
            "rpc",
            "worker",
        )
        self.routing_table_size = gauge(
            "reactantserver_gateway_routing_table_size", "Models with a route."
        )
        self.worker_ready = gauge(
            "reactantserver_gateway_worker_ready", "1 if the worker is ready.", "worker"
        )
        self.worker_lane = gauge(
            "reactantserver_gateway_worker_lane",
            "1 if ModelInfer goes to the worker over its forwarding lane (0: gRPC).",
            "worker",
        )
        self.worker_metrics_up = gauge(
            "reactantserver_gateway_worker_metrics_up",
            "1 if the last scrape of the worker succeeded.",
            "worker",
        )
        self.inflight_requests = gauge(
            "reactantserver_gateway_inflight_requests", "Inference requests in flight."
        )
        self.requests_shed_total = counter(
            "reactantserver_gateway_requests_shed_total",
            "Requests refused with RESOURCE_EXHAUSTED (inbound cap).",
        )
        self.max_concurrent_requests = gauge(
            "reactantserver_gateway_max_concurrent_requests",
            "Configured inbound cap (0: unlimited).",
        )
        self.failovers_total = counter(
            "reactantserver_gateway_failovers_total",
            "Requests retried on another worker.",
            "model",
            "from_worker",
            "reason",
        )
        self.placement_weight = gauge(
            "reactantserver_gateway_placement_weight",
            "Share of the model's traffic (0: unplaced).",
            "model",
            "worker",
        )
        self.model_utilization = gauge(
            "reactantserver_gateway_model_utilization",
            "Estimated device share the model uses.",
            "model",
        )
        self.model_replicas = gauge(
            "reactantserver_gateway_model_replicas", "Workers placed.", "model"
        )
        self.replica_outstanding = gauge(
            "reactantserver_gateway_replica_outstanding",
            "In-flight items per replica.",
            "model",
            "worker",
        )
        self.model_fill_quantum = gauge(
            "reactantserver_gateway_model_fill_quantum", "Items per fill run (Q).", "model"
        )
        self.repacks_total = counter(
            "reactantserver_gateway_repacks_total", "Repacks by trigger.", "trigger"
        )
        self.replica_routed_total = counter(
            "reactantserver_gateway_replica_routed_total",
            "Requests routed per replica.",
            "model",
            "worker",
        )
        self.worker_inflight_work = gauge(
            "reactantserver_gateway_worker_inflight_work",
            "Reserved work in flight per worker.",
            "worker",
            "basis",
        )
        self.model_aware_routes_total = counter(
            "reactantserver_gateway_model_aware_routes_total",
            "model_aware routes by placement.",
            "model",
            "placement",
        )
        self.worker_load_bandwidth_bytes_per_second = gauge(
            "reactantserver_gateway_worker_load_bandwidth_bytes_per_second",
            "Estimated weight-load bandwidth of the worker.",
            "worker",
        )
        if mode == "lpt_packing":
            for trigger in REPACK_TRIGGERS:
                self.repacks_total.labels(trigger)
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        # Hot-path children by label values: one dict hit per request. The gateway updates
        # these from its event loop only; the metric children are thread-safe anyway.
        self._requests: dict[tuple[str, str, grpc.StatusCode], tuple[Counter, Histogram]] = {}
        self._workers: dict[tuple[str, str], Histogram] = {}
        self._placed: dict[str, frozenset[str]] = {}

    def observe_request(
        self, rpc: str, model: str, status: grpc.StatusCode, seconds: float
    ) -> None:
        """Count one finished request (``model`` is ``""`` for RPCs without one)."""
        key = (rpc, model, status)
        children = self._requests.get(key)
        if children is None:
            children = self._requests[key] = (
                self.requests_total.labels(rpc, model, status.name),
                self.request_latency_seconds.labels(rpc, model),
            )
        counter, histogram = children
        counter.inc()
        histogram.observe(seconds)

    def observe_worker(self, rpc: str, worker: str, seconds: float) -> None:
        """Record the wall time of one call forwarded to ``worker``."""
        key = (rpc, worker)
        histogram = self._workers.get(key)
        if histogram is None:
            histogram = self._workers[key] = self.worker_latency_seconds.labels(rpc, worker)
        histogram.observe(seconds)

    def failover(self, model: str, from_worker: str, reason: str) -> None:
        """Count one failover away from ``from_worker`` (``reason``: e.g. ``"UNAVAILABLE"``)."""
        self.failovers_total.labels(model, from_worker, reason).inc()

    def forget_model(self, model: str) -> None:
        """Drop the request series of ``model`` (after it left the routing table)."""
        keys = [key for key in self._requests if key[1] == model]
        for key in keys:
            del self._requests[key]
            self.requests_total.remove(key[0], model, key[2].name)
        for rpc in {key[0] for key in keys}:
            self.request_latency_seconds.remove(rpc, model)

    def set_placement(self, weights: Mapping[str, Mapping[str, float]]) -> None:
        """Set the placement weights and replica counts from ``{model: {worker: weight}}``.

        Pairs set before and missing now are set to 0 (so are the replicas of a dropped model).
        """
        placed: dict[str, frozenset[str]] = {}
        for model, row in weights.items():
            for worker, weight in row.items():
                self.placement_weight.labels(model, worker).set(weight)
            self.model_replicas.labels(model).set(sum(w > 0 for w in row.values()))
            placed[model] = frozenset(row)
        for model, workers in self._placed.items():
            for worker in workers - placed.get(model, frozenset()):
                self.placement_weight.labels(model, worker).set(0)
            if model not in placed:
                self.model_replicas.labels(model).set(0)
        self._placed = placed

    def render(self) -> bytes:
        """The gateway's own series in Prometheus text format 0.0.4 (see :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)
