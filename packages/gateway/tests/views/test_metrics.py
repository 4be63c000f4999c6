"""GatewayMetrics: the gateway families of docs/reference/metrics.md, per-mode exposure, helpers
and placement."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from reactantserver.gateway.views.metrics import (
    CONTENT_TYPE,
    LATENCY_BUCKETS,
    LPT_FAMILIES,
    MODEL_AWARE_FAMILIES,
    GatewayMetrics,
)

#: docs/reference/metrics.md, gateway: family (as parsed: counters without ``_total``) -> type,
#: labels.
COMMON = {
    "reactantserver_gateway_requests": ("counter", ("model", "rpc", "status")),
    "reactantserver_gateway_request_latency_seconds": ("histogram", ("model", "rpc")),
    "reactantserver_gateway_worker_latency_seconds": ("histogram", ("rpc", "worker")),
    "reactantserver_gateway_routing_table_size": ("gauge", ()),
    "reactantserver_gateway_worker_ready": ("gauge", ("worker",)),
    "reactantserver_gateway_worker_lane": ("gauge", ("worker",)),
    "reactantserver_gateway_worker_metrics_up": ("gauge", ("worker",)),
    "reactantserver_gateway_inflight_requests": ("gauge", ()),
    "reactantserver_gateway_requests_shed": ("counter", ()),
    "reactantserver_gateway_max_concurrent_requests": ("gauge", ()),
    "reactantserver_gateway_failovers": ("counter", ("from_worker", "model", "reason")),
}
LPT = {
    "reactantserver_gateway_placement_weight": ("gauge", ("model", "worker")),
    "reactantserver_gateway_model_utilization": ("gauge", ("model",)),
    "reactantserver_gateway_model_replicas": ("gauge", ("model",)),
    "reactantserver_gateway_replica_outstanding": ("gauge", ("model", "worker")),
    "reactantserver_gateway_model_fill_quantum": ("gauge", ("model",)),
    "reactantserver_gateway_repacks": ("counter", ("trigger",)),
    "reactantserver_gateway_replica_routed": ("counter", ("model", "worker")),
    "reactantserver_gateway_worker_inflight_work": ("gauge", ("basis", "worker")),
}
MODEL_AWARE = {
    "reactantserver_gateway_worker_inflight_work": ("gauge", ("basis", "worker")),
    "reactantserver_gateway_model_aware_routes": ("counter", ("model", "placement")),
    "reactantserver_gateway_worker_load_bandwidth_bytes_per_second": ("gauge", ("worker",)),
}


def parsed(metrics: GatewayMetrics) -> dict[str, tuple[str, list[Sample]]]:
    body = metrics.render().decode()
    return {
        f.name: (f.type, list(f.samples))
        for f in text_string_to_metric_families(body)
        if f.name.startswith("reactantserver_gateway_")
    }


def touch_everything(m: GatewayMetrics) -> None:
    """Give every labelled family one child so its label names show in the exposition."""
    m.observe_request("ModelInfer", "m", grpc.StatusCode.OK, 0.003)
    m.observe_worker("ModelInfer", "w0", 0.002)
    m.worker_ready.labels("w0").set(1)
    m.worker_lane.labels("w0").set(1)
    m.worker_metrics_up.labels("w0").set(1)
    m.failover("m", "w0", "UNAVAILABLE")
    m.set_placement({"m": {"w0": 1.0}})
    m.model_utilization.labels("m").set(0.25)
    m.replica_outstanding.labels("m", "w0").set(4)
    m.model_fill_quantum.labels("m").set(8)
    m.repacks_total.labels("startup").inc()
    m.replica_routed_total.labels("m", "w0").inc()
    m.worker_inflight_work.labels("w0", "compute").set(0.5)
    m.model_aware_routes_total.labels("m", "cold").inc()
    m.worker_load_bandwidth_bytes_per_second.labels("w0").set(8e9)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("round_robin", COMMON),
        ("lpt_packing", {**COMMON, **LPT}),
        ("model_aware", {**COMMON, **MODEL_AWARE}),
    ],
)
def test_each_mode_exports_exactly_its_families_with_spec_labels(
    mode: str, expected: dict[str, tuple[str, tuple[str, ...]]]
) -> None:
    m = GatewayMetrics(mode=mode)
    touch_everything(m)
    got = parsed(m)
    assert set(got) == set(expected)
    for name, (kind, labels) in expected.items():
        got_kind, samples = got[name]
        assert got_kind == kind, name
        assert samples, name
        label_names = {k for s in samples for k in s.labels if k != "le"}
        assert tuple(sorted(label_names)) == labels, name


def test_policy_families_are_not_even_declared_under_round_robin() -> None:
    body = GatewayMetrics(mode="round_robin").render().decode()
    for name in LPT_FAMILIES | MODEL_AWARE_FAMILIES:
        assert name not in body
    assert "reactantserver_gateway_worker_inflight_work" in LPT_FAMILIES & MODEL_AWARE_FAMILIES


def test_own_registry_no_created_samples_and_process_collectors() -> None:
    m = GatewayMetrics()
    touch_everything(m)
    assert m.registry is not REGISTRY
    assert REGISTRY.get_sample_value("reactantserver_gateway_requests_total") is None
    body = m.render().decode()
    assert "_created" not in body
    assert "process_" in body or "python_info" in body
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_observe_request_counts_by_code_name_and_latency_uses_worker_buckets() -> None:
    m = GatewayMetrics()
    m.observe_request("ModelInfer", "m", grpc.StatusCode.OK, 0.003)
    m.observe_request("ModelInfer", "m", grpc.StatusCode.OK, 0.02)
    m.observe_request("ModelInfer", "m", grpc.StatusCode.UNAVAILABLE, 0.5)
    m.observe_request("ServerLive", "", grpc.StatusCode.OK, 0.0001)
    value = m.registry.get_sample_value
    ok = {"rpc": "ModelInfer", "model": "m", "status": "OK"}
    assert value("reactantserver_gateway_requests_total", ok) == 2
    assert value("reactantserver_gateway_requests_total", {**ok, "status": "UNAVAILABLE"}) == 1
    live = {"rpc": "ServerLive", "model": "", "status": "OK"}
    assert value("reactantserver_gateway_requests_total", live) == 1
    lat = {"rpc": "ModelInfer", "model": "m"}
    assert value("reactantserver_gateway_request_latency_seconds_count", lat) == 3
    assert (
        value("reactantserver_gateway_request_latency_seconds_bucket", {**lat, "le": "0.004"}) == 1
    )
    assert (
        value("reactantserver_gateway_request_latency_seconds_bucket", {**lat, "le": "8.192"}) == 3
    )
    assert tuple(0.001 * 2**k for k in range(14)) == LATENCY_BUCKETS
    les = {
        s.labels["le"]
        for s in parsed(m)["reactantserver_gateway_request_latency_seconds"][1]
        if s.name.endswith("_bucket")
    }
    assert len(les) == 15  # 14 bounds plus +Inf


def test_observe_worker_and_failover() -> None:
    m = GatewayMetrics()
    m.observe_worker("ModelInfer", "w1", 0.01)
    m.observe_worker("ModelInfer", "w1", 0.03)
    m.failover("m", "w1", "UNAVAILABLE")
    m.failover("m", "w1", "UNAVAILABLE")
    value = m.registry.get_sample_value
    worker = {"rpc": "ModelInfer", "worker": "w1"}
    assert value("reactantserver_gateway_worker_latency_seconds_count", worker) == 2
    assert value("reactantserver_gateway_worker_latency_seconds_sum", worker) == pytest.approx(0.04)
    fail = {"model": "m", "from_worker": "w1", "reason": "UNAVAILABLE"}
    assert value("reactantserver_gateway_failovers_total", fail) == 2


def test_forget_model_drops_its_request_series_only() -> None:
    m = GatewayMetrics()
    m.observe_request("ModelInfer", "gone", grpc.StatusCode.OK, 0.01)
    m.observe_request("ModelInfer", "gone", grpc.StatusCode.INTERNAL, 0.01)
    m.observe_request("ModelInfer", "kept", grpc.StatusCode.OK, 0.01)
    m.forget_model("gone")
    m.forget_model("never-seen")
    body = m.render().decode()
    assert 'model="gone"' not in body
    assert 'model="kept"' in body
    m.observe_request("ModelInfer", "gone", grpc.StatusCode.OK, 0.01)
    value = m.registry.get_sample_value
    assert (
        value(
            "reactantserver_gateway_requests_total",
            {"rpc": "ModelInfer", "model": "gone", "status": "OK"},
        )
        == 1
    )


def test_set_placement_zeroes_dropped_pairs_and_counts_replicas() -> None:
    m = GatewayMetrics(mode="lpt_packing")
    value = m.registry.get_sample_value

    def weight(model: str, worker: str) -> float | None:
        return value("reactantserver_gateway_placement_weight", {"model": model, "worker": worker})

    def replicas(model: str) -> float | None:
        return value("reactantserver_gateway_model_replicas", {"model": model})

    m.set_placement({"a": {"w0": 1.0}, "b": {"w0": 0.5, "w1": 0.5}})
    assert (weight("a", "w0"), weight("b", "w0"), weight("b", "w1")) == (1.0, 0.5, 0.5)
    assert (replicas("a"), replicas("b")) == (1, 2)
    m.set_placement({"b": {"w1": 1.0}, "c": {"w2": 1.0}})
    assert (weight("a", "w0"), weight("b", "w0"), weight("b", "w1")) == (0.0, 0.0, 1.0)
    assert weight("c", "w2") == 1.0
    assert (replicas("a"), replicas("b"), replicas("c")) == (0, 1, 1)
    m.set_placement({})
    assert (weight("b", "w1"), weight("c", "w2"), replicas("c")) == (0.0, 0.0, 0)


def test_repack_triggers_start_at_zero_under_lpt() -> None:
    m = GatewayMetrics(mode="lpt_packing")
    for trigger in ("startup", "compute", "operator"):
        assert (
            m.registry.get_sample_value(
                "reactantserver_gateway_repacks_total", {"trigger": trigger}
            )
            == 0
        )


def test_policy_attributes_work_but_stay_hidden_in_other_modes() -> None:
    m = GatewayMetrics(mode="round_robin")
    m.set_placement({"a": {"w0": 1.0}})
    m.repacks_total.labels("compute").inc()
    assert (
        m.registry.get_sample_value(
            "reactantserver_gateway_placement_weight", {"model": "a", "worker": "w0"}
        )
        is None
    )
    assert "reactantserver_gateway_repacks" not in m.render().decode()


def test_instances_are_independent_and_unknown_mode_is_refused() -> None:
    a, b = GatewayMetrics(), GatewayMetrics()
    a.observe_request("ModelInfer", "m", grpc.StatusCode.OK, 0.01)
    labels = {"rpc": "ModelInfer", "model": "m", "status": "OK"}
    assert b.registry.get_sample_value("reactantserver_gateway_requests_total", labels) is None
    with pytest.raises(ValueError, match="scheduling mode"):
        GatewayMetrics(mode="random")
