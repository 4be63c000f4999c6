"""The worker's ``/status`` document and page: over the MockBackend, real bundles and HTTP."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import jax
import numpy as np
import pytest
from aiohttp import web

from packages.worker.tests._fake_source import SIZE, FakeSource
from packages.worker.tests._mock_runtime import mock_runtime, pool
from packages.worker.tests._world import start_world, world_config
from packages.worker.tests.conftest import BundleMaker, Tensor
from reactantserver.core import status as schema
from reactantserver.core.config import ModelSchedulingConfig, SchedulerConfig, WorkerConfig
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.rest.http_app import start_http
from reactantserver.core.types import InferRequest
from reactantserver.worker.registry import ModelEntry, ModelState
from reactantserver.worker.runtime import Residency
from reactantserver.worker.state import WorkerState
from reactantserver.worker.transport.http import http_app
from reactantserver.worker.views.metrics import WorkerMetrics
from reactantserver.worker.views.status import add_status_routes, worker_status

__all__ = ["pool"]  # fixtures, imported by name for pytest

X = Tensor("x", "f32", "nk", {"k": 2})
Y = Tensor("y", "f32", "nk", {"k": 2})
W = np.array([10.0, 100.0], np.float32)


def by_name(doc: schema.WorkerStatus) -> dict[str, schema.ModelStatus]:
    return {m["name"]: m for m in doc["models"]}


def assert_schema(value: Any, document: Any) -> None:
    """Every key of the TypedDict ``document`` is present, and nothing else (recursively)."""
    hints = typing.get_type_hints(document)
    assert set(value) == set(hints), (document.__name__, set(value) ^ set(hints))
    nested = {"device": schema.DeviceStatus, "models": schema.ModelStatus}
    for key, inner in nested.items():
        if key in value:
            for item in value[key] if isinstance(value[key], list) else [value[key]]:
                assert_schema(item, inner)


# -- the document ----------------------------------------------------------------------------


def test_before_the_runtime_models_are_registry_entries_only() -> None:
    config = WorkerConfig(
        scheduler=SchedulerConfig(models={"slow": ModelSchedulingConfig(weight=2.5)})
    )
    state = WorkerState(config, version="1.2.3")
    state.registry.put(ModelEntry.loading("slow"))
    state.registry.put(ModelEntry.failed("bad", "no such file\nmore"))
    doc = worker_status(state, uptime_seconds=3.5)
    assert_schema(doc, schema.WorkerStatus)
    assert {k: v for k, v in doc.items() if k not in {"models", "device"}} == {
        "kind": "worker",
        "name": "worker",
        "version": "1.2.3",
        "ready": False,
        "uptime_seconds": 3.5,
        "platform": "cpu",
        "discipline": "fair",
        "model_control_mode": "dynamic",
    }
    assert doc["device"] == {
        "weight_bytes_resident": 0,
        "weight_budget_bytes": None,
        "pinned_bytes": 0,
    }
    assert [m["name"] for m in doc["models"]] == ["bad", "slow"]
    models = by_name(doc)
    assert models["slow"] == {
        "name": "slow",
        "version": "1",
        "state": "LOADING",
        "residency": "host",
        "weight_bytes": 0,
        "queue_depth": 0,
        "requests": 0,
        "failures": 0,
        "executions": 0,
        "device_time_share": None,
        "weight": 2.5,
        "queue_wait_p50_seconds": None,
        "queue_wait_p99_seconds": None,
        "batch_sizes": {},
        "loads": 0,
        "evictions": 0,
    }
    assert (models["bad"]["state"], models["bad"]["weight"]) == ("UNAVAILABLE", 1.0)
    json.dumps(doc, allow_nan=False)


def test_residency_budget_and_churn_from_the_weight_cache(
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    state = WorkerState(WorkerConfig(worker_name="w3"), version="0.1.0")
    runtime = state.runtime = mock_runtime(state, pool, enabled=True, budget=SIZE)
    cache = runtime.weights
    cache.add_model("pin", FakeSource(size=300), Residency.PINNED_DEVICE)
    cache.add_model("a", FakeSource(), Residency.PINNED_SYSTEM)
    cache.add_model("b", FakeSource(), Residency.UNPINNED)
    cache.add_model("hidden", FakeSource(size=10), Residency.UNPINNED)  # not in the registry
    for name in ("pin", "a", "b"):
        state.registry.put(ModelEntry(name, ModelState.READY))
    for name in "aba":  # the budget holds one model: b, then a, are evicted once each
        cache.acquire(name)
    doc = worker_status(state, uptime_seconds=0.0)
    assert doc["name"] == "w3"
    assert doc["device"] == {
        "weight_bytes_resident": SIZE + 300,
        "weight_budget_bytes": SIZE,
        "pinned_bytes": 300,
    }
    models = by_name(doc)
    assert list(models) == ["a", "b", "pin"]  # a cache name without an entry is skipped
    residency = {
        n: (m["residency"], m["weight_bytes"], m["loads"], m["evictions"])
        for n, m in models.items()
    }
    assert residency == {
        "a": ("device", SIZE, 2, 1),
        "b": ("host", SIZE, 1, 1),
        "pin": ("pinned", 300, 1, 0),
    }


def test_without_the_cache_there_is_no_budget(pool: concurrent.futures.ThreadPoolExecutor) -> None:
    state = WorkerState(WorkerConfig(), version="0.1.0")
    runtime = state.runtime = mock_runtime(state, pool, enabled=False, budget=SIZE)
    runtime.weights.add_model("m", FakeSource(size=64), Residency.UNPINNED)
    state.registry.put(ModelEntry("m", ModelState.READY))
    doc = worker_status(state, uptime_seconds=0.0)
    assert doc["device"] == {
        "weight_bytes_resident": 64,
        "weight_budget_bytes": None,
        "pinned_bytes": 0,
    }
    assert by_name(doc)["m"]["residency"] == "device"


def _scale(x: jax.Array, w: jax.Array) -> jax.Array:
    return x * w


@pytest.fixture
def live(make_bundle: BundleMaker, tmp_path: Path) -> Iterator[WorkerState]:
    """Two compiled jax bundles ("a", "b", sizes 1 and 4), scheduler running, cache on."""
    bundles = [
        make_bundle(name, _scale, inputs=[X], outputs=[Y], weights=[("w", W)], batch_sizes=[1, 4])
        for name in ("a", "b")
    ]
    config = world_config(tmp_path / "cache", budget=1 << 20, worker_name="w0")
    world = start_world(config, bundles, version="0.1.0")
    try:
        yield world.state
    finally:
        world.close()


def _serve(state: WorkerState, rows: Sequence[tuple[str, int]]) -> None:
    runtime = state.runtime
    assert runtime is not None

    async def serve() -> None:
        for model, n in rows:
            x = np.full((n, 2), n, np.float32)
            request = InferRequest(model_name=model, inputs=[NamedTensor("x", x)])
            await runtime.dataplane.infer(request)

    asyncio.run(serve())


def test_counters_waits_shares_and_batches_after_real_requests(live: WorkerState) -> None:
    runtime = live.runtime
    assert runtime is not None
    before = by_name(worker_status(live, uptime_seconds=0.0))
    assert {m["residency"] for m in before.values()} == {"host"}  # nothing loaded yet
    assert {m["device_time_share"] for m in before.values()} == {None}
    _serve(live, [("a", 1), ("a", 2), ("a", 3), ("b", 1)])
    assert runtime.scheduler.set_weight("a", 3.0)
    doc = worker_status(live, uptime_seconds=1.0)
    assert_schema(doc, schema.WorkerStatus)
    assert doc["ready"] is True
    a, b = by_name(doc)["a"], by_name(doc)["b"]
    assert (a["requests"], a["failures"], a["executions"]) == (3, 0, 3)
    assert (b["requests"], b["executions"]) == (1, 1)
    assert a["batch_sizes"] == {"1": 1, "4": 2}
    assert b["batch_sizes"] == {"1": 1}
    assert (a["weight"], b["weight"]) == (3.0, 1.0)
    assert (a["state"], a["residency"], a["weight_bytes"]) == ("READY", "device", W.nbytes)
    assert (a["loads"], a["evictions"], a["queue_depth"]) == (1, 0, 0)
    p50, p99 = a["queue_wait_p50_seconds"], a["queue_wait_p99_seconds"]
    assert p50 is not None
    assert p99 is not None
    assert 0 <= p50 <= p99
    share_a, share_b = a["device_time_share"], b["device_time_share"]
    assert share_a is not None
    assert share_b is not None
    assert share_a > 0
    assert share_b > 0
    assert share_a + share_b == pytest.approx(1.0)
    assert doc["device"]["weight_bytes_resident"] == 2 * W.nbytes
    json.dumps(doc, allow_nan=False)


def test_failed_requests_count_as_requests_and_failures(live: WorkerState) -> None:
    runtime = live.runtime
    assert runtime is not None
    bad = InferRequest(model_name="a", inputs=[NamedTensor("x", np.ones((1, 3), np.float32))])
    with pytest.raises(Exception, match="x"):
        asyncio.run(runtime.dataplane.infer(bad))
    a = by_name(worker_status(live, uptime_seconds=0.0))["a"]
    assert (a["requests"], a["failures"], a["executions"]) == (1, 1, 0)


# -- HTTP ------------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_page_and_document_over_http() -> None:
    state = WorkerState(WorkerConfig(worker_name="<b>w&1</b>"), version="0.1.0")
    state.registry.put(ModelEntry.loading("m"))

    async def main() -> None:
        app = http_app(state, WorkerMetrics(state, environ={}))
        runner = await start_http(app, "127.0.0.1", 0)
        try:
            host, port = runner.addresses[0][:2]
            base = f"http://{host}:{port}"
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/") as response:
                    assert response.status == 200
                    assert response.headers["Content-Type"] == schema.PAGE_CONTENT_TYPE
                    assert await response.read() == schema.page()
                async with session.get(f"{base}/status") as response:
                    assert response.status == 200
                    assert response.content_type == "application/json"
                    assert response.headers["Cache-Control"] == "no-store"
                    doc = await response.json()
                assert_schema(doc, schema.WorkerStatus)
                assert doc["name"] == "<b>w&1</b>"  # JSON carries it as is; the page escapes
                assert [m["name"] for m in doc["models"]] == ["m"]
                async with session.head(f"{base}/status") as response:
                    assert response.status == 200
                for method in ("POST", "DELETE"):
                    async with session.request(method, f"{base}/status") as response:
                        assert response.status == 404
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_uptime_counts_from_when_the_routes_were_added() -> None:
    state = WorkerState(WorkerConfig(), version="0.1.0")
    clock = _Clock()
    app = web.Application()
    add_status_routes(app, state, clock=clock)
    clock.now += 42.0

    async def main() -> Any:
        runner = await start_http(app, "127.0.0.1", 0)
        try:
            host, port = runner.addresses[0][:2]
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://{host}:{port}{schema.STATUS_PATH}") as response,
            ):
                return await response.json()
        finally:
            await runner.cleanup()

    assert asyncio.run(main())["uptime_seconds"] == 42.0
