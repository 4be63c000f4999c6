"""``RequestCounters`` renders exactly what ``prometheus_client``'s own Counter and Histogram
would for the same observations, and keeps the codec CPU per model."""

from __future__ import annotations

import threading

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from reactantserver.worker.request_counters import LATENCY_BUCKETS, RequestCounters

OBSERVATIONS = [
    ("a", grpc.StatusCode.OK, 0.0004),
    ("a", grpc.StatusCode.OK, 0.001),  # on a bound: counted in that bucket
    ("a", grpc.StatusCode.INVALID_ARGUMENT, 0.003),
    ("b", grpc.StatusCode.UNAVAILABLE, 0.02),
    ("a", grpc.StatusCode.OK, 99.0),  # beyond the last bound: +Inf only
    ("b", grpc.StatusCode.DEADLINE_EXCEEDED, 8.192),
    ("a", grpc.StatusCode.INVALID_ARGUMENT, 0.5),
]


def _reference() -> bytes:
    registry = CollectorRegistry()
    requests = Counter(
        "reactantserver_worker_requests_total",
        "Inference requests by final status.",
        ["model", "status"],
        registry=registry,
    )
    latency = Histogram(
        "reactantserver_worker_request_latency_seconds",
        "Inference handler wall time.",
        ["model"],
        buckets=LATENCY_BUCKETS,
        registry=registry,
    )
    # Series in the order RequestCounters emits them: per model, OK first, then by name.
    for model in ("a", "b"):
        seen = sorted(
            {s for m, s, _ in OBSERVATIONS if m == model},
            key=lambda s: (s is not grpc.StatusCode.OK, s.name),
        )
        for status in seen:
            requests.labels(model, status.name)
        latency.labels(model)
    for model, status, seconds in OBSERVATIONS:
        requests.labels(model, status.name).inc()
        latency.labels(model).observe(seconds)
    return generate_latest(registry)


def _without_created(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "_created" not in line]


def test_renders_as_prometheus_client_would() -> None:
    counters = RequestCounters(lambda name: True)
    for model, status, seconds in OBSERVATIONS:
        counters.observe(model, status, seconds)
    registry = CollectorRegistry()
    registry.register(counters)
    assert _without_created(generate_latest(registry)) == _without_created(_reference())


def test_unknown_models_get_no_series_and_forget_drops_them() -> None:
    known = {"a"}
    counters = RequestCounters(lambda name: name in known)
    counters.observe("minted", grpc.StatusCode.NOT_FOUND, 0.001, 5, 0)
    counters.observe("a", grpc.StatusCode.OK, 0.001, 7, 3)
    counters.observe("a", grpc.StatusCode.OK, 0.002, 1, 2)
    assert counters.codec_cpu() == {"a": (8, 5)}
    assert b"minted" not in generate_latest(_registry(counters))
    counters.forget("a")
    known.clear()
    counters.observe("a", grpc.StatusCode.OK, 0.001)  # late: no longer registered
    assert counters.codec_cpu() == {}
    assert b"model=" not in generate_latest(_registry(counters))


def test_concurrent_observers_lose_nothing() -> None:
    counters = RequestCounters(lambda name: True)

    def hammer() -> None:
        for _ in range(2000):
            counters.observe("a", grpc.StatusCode.OK, 0.001, 1, 1)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counters.codec_cpu() == {"a": (8000, 8000)}
    text = generate_latest(_registry(counters)).decode()
    assert 'reactantserver_worker_requests_total{model="a",status="OK"} 8000.0' in text
    assert 'reactantserver_worker_request_latency_seconds_count{model="a"} 8000.0' in text


def _registry(counters: RequestCounters) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(counters)
    return registry
