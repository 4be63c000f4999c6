"""The gateway's HTTP port: its series, the workers', health."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.worker_e2e._harness import WorkerProcess, infer_input, rows, sum_samples

from ._gateway import GatewayProcess

pytestmark = pytest.mark.slow

GATEWAY_FAMILIES = (
    "reactantserver_gateway_requests",
    "reactantserver_gateway_request_latency_seconds",
    "reactantserver_gateway_worker_latency_seconds",
    "reactantserver_gateway_worker_ready",
    "reactantserver_gateway_worker_metrics_up",
    "reactantserver_gateway_inflight_requests",
    "reactantserver_gateway_requests_shed",
    "reactantserver_gateway_max_concurrent_requests",
    "reactantserver_gateway_failovers",
    "reactantserver_gateway_routing_table_size",
)


def _scrape(gateway: GatewayProcess) -> str:
    status, text = gateway.http_get("/metrics")
    assert status == 200
    return text


def test_metrics_hold_the_gateway_and_both_workers(
    gateway: GatewayProcess, workers: list[WorkerProcess], client: Any
) -> None:
    for _ in range(2):
        client.infer("mlp", [infer_input("x", rows(1, 16, seed=71), "FP32")])
    text = _scrape(gateway)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    missing = [name for name in GATEWAY_FAMILIES if name not in families]
    assert missing == [], sorted(families)
    for label in ("w0", "w1"):
        assert sum_samples(text, "reactantserver_gateway_worker_metrics_up", worker=label) == 1
        assert sum_samples(text, "reactantserver_gateway_worker_ready", worker=label) == 1
    assert (
        sum_samples(text, "reactantserver_gateway_requests_total", rpc="ModelInfer", model="mlp")
        >= 2
    )

    # Both workers' own series are there: per worker, its exposition's samples.
    worker_names = {
        family.name for family in text_string_to_metric_families(workers[0].http_get("/metrics")[2])
    }
    assert worker_names, "the worker exposes nothing"
    assert worker_names <= set(families)
    inflight = list(families["reactantserver_worker_inflight_requests"].samples)
    assert len(inflight) == 2  # one per worker
    assert all("worker" in sample.labels for sample in inflight)


def test_one_help_and_type_line_per_family(gateway: GatewayProcess) -> None:
    text = _scrape(gateway)
    for kind in ("HELP", "TYPE"):
        names = re.findall(rf"^# {kind} (\S+) ", text, flags=re.MULTILINE)
        duplicated = [name for name, count in Counter(names).items() if count > 1]
        assert duplicated == [], (kind, duplicated)
    # Every sample sits under its family's header (histogram parts included).
    families = list(text_string_to_metric_families(text))
    assert len({family.name for family in families}) == len(families)


def test_health_and_readiness(gateway: GatewayProcess) -> None:
    assert gateway.http_get("/healthz")[0] == 200
    assert gateway.http_get("/readyz")[0] == 200
    assert gateway.http_get("/no/such/path")[0] == 404
