"""The gateway's ``/status`` document and page over real sockets (issue 16).

Workers are real aiohttp servers on 127.0.0.1 standing in for a worker's HTTP port (one serving
a worker document, a failing, a slow and a garbled one); the policies are the real ones the
gateway builds from its configuration, fed real ``ModelControlStatus`` protobufs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from packages.gateway.tests._fake_workers import FakeWorkers, refused_port
from reactantserver.core.protocol import control_pb2
from reactantserver.core.rest.http_app import start_http
from reactantserver.core.status import PAGE_CONTENT_TYPE, WorkerStatus
from reactantserver.gateway.config import (
    CompactionMode,
    GatewayConfig,
    SchedulingConfig,
    SchedulingMode,
)
from reactantserver.gateway.policies.lpt.policy import LptPolicy
from reactantserver.gateway.policies.modes import make_policy
from reactantserver.gateway.policies.policy import Policy, RoundRobin, Routes
from reactantserver.gateway.transport.http import gateway_http_app
from reactantserver.gateway.views.metrics import GatewayMetrics
from reactantserver.gateway.views.status import StatusSource
from reactantserver.gateway.workers.link import ChannelSettings, WorkerLink

TIMEOUT = 0.3
SETTINGS = ChannelSettings(
    max_send_msg_bytes=1 << 20, max_recv_msg_bytes=1 << 20, max_concurrent_streams=4
)


def worker_document(name: str) -> WorkerStatus:
    """A complete worker document, as a worker's ``/status`` answers it."""
    return {
        "kind": "worker",
        "name": name,
        "version": "0.1.0",
        "ready": True,
        "uptime_seconds": 12.5,
        "platform": "cpu",
        "discipline": "fair",
        "model_control_mode": "static",
        "device": {"weight_bytes_resident": 4096, "weight_budget_bytes": None, "pinned_bytes": 0},
        "models": [
            {
                "name": "mlp",
                "version": "1",
                "state": "READY",
                "residency": "device",
                "weight_bytes": 4096,
                "queue_depth": 0,
                "requests": 7,
                "failures": 1,
                "executions": 5,
                "device_time_share": 1.0,
                "weight": 1.0,
                "queue_wait_p50_seconds": 0.001,
                "queue_wait_p99_seconds": 0.002,
                "batch_sizes": {"1": 3, "4": 2},
                "loads": 1,
                "evictions": 0,
            }
        ],
    }


class Workers(FakeWorkers):
    """Stand-in worker ``/status`` ports: a document, a failing, a slow and a garbled one."""

    def __init__(self) -> None:
        super().__init__("/status")

    async def document(self, name: str) -> str:
        return await self.answering(lambda: web.json_response(worker_document(name)))

    async def failing(self) -> str:
        return await self.answering(lambda: web.Response(status=500, text="boom"))

    async def slow(self) -> str:
        return await self.holding(lambda: web.json_response(worker_document("slow")))

    async def garbled(self, body: str) -> str:
        return await self.answering(
            lambda: web.Response(text=body, content_type="application/json")
        )


def links(*ready: bool) -> list[WorkerLink]:
    """Real worker links ``w0``, ``w1``, ... (never dialled: channels open on first use)."""
    out = []
    for i, is_ready in enumerate(ready):
        link = WorkerLink(f"10.0.0.{i + 1}:8001", f"w{i}", SETTINGS)
        link.ready = is_ready
        out.append(link)
    return out


def source(
    workers: Sequence[WorkerLink],
    endpoints: Sequence[str] = (),
    *,
    policy: Policy | None = None,
    routes: Routes | None = None,
    ready: bool = True,
) -> StatusSource:
    return StatusSource(
        version="9.9.9",
        policy=policy or RoundRobin(),
        routes=lambda: routes or {},
        workers=workers,
        http_endpoints=endpoints,
        ready=lambda: ready,
        timeout_seconds=TIMEOUT,
    )


async def document_of(status: StatusSource) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        document = await status.document(session)
    # What goes over the wire: plain JSON.
    decoded: dict[str, Any] = json.loads(json.dumps(document))
    return decoded


def test_round_robin_without_worker_endpoints() -> None:
    w0, w1 = links(True, False)
    routes = {"mlp": (w0.url, w1.url), "two_io": (w1.url,)}
    doc = asyncio.run(document_of(source([w0, w1], routes=routes, ready=False)))
    assert doc["kind"] == "gateway"
    assert doc["version"] == "9.9.9"
    assert doc["ready"] is False
    assert doc["uptime_seconds"] >= 0
    assert doc["policy"] == "round_robin"
    assert doc["last_repack"] is None
    # The routing table, restricted to the workers that are ready now, by label.
    assert doc["placement"] == [
        {"model": "mlp", "workers": ["w0"]},
        {"model": "two_io", "workers": []},
    ]
    assert [(w["name"], w["endpoint"], w["ready"]) for w in doc["workers"]] == [
        ("w0", "10.0.0.1:8001", True),
        ("w1", "10.0.0.2:8001", False),
    ]
    for worker in doc["workers"]:
        assert worker["status"] is None
        assert "no HTTP endpoint" in worker["error"]


def test_worker_documents_are_fetched_and_failures_reported() -> None:
    async def main() -> dict[str, Any]:
        workers = Workers()
        try:
            with refused_port() as refused:
                endpoints = [
                    await workers.document("w0"),
                    await workers.failing(),
                    await workers.slow(),
                    await workers.garbled("not json"),
                    await workers.garbled('{"kind": "gateway"}'),
                    refused,
                ]
                return await document_of(source(links(*[True] * 7), endpoints))
        finally:
            await workers.close()

    doc = asyncio.run(main())
    by_name = {w["name"]: w for w in doc["workers"]}
    assert list(by_name) == [f"w{i}" for i in range(7)]
    assert by_name["w0"]["status"] == worker_document("w0")
    assert by_name["w0"]["error"] is None
    errors = {name: w["error"] for name, w in by_name.items() if name != "w0"}
    assert all(by_name[name]["status"] is None for name in errors)
    assert "HTTP 500" in errors["w1"]
    assert f"within {TIMEOUT} s" in errors["w2"]
    assert "not JSON" in errors["w3"]
    assert "not a worker status document" in errors["w4"]
    assert "ClientConnectorError" in errors["w5"]
    assert "no HTTP endpoint" in errors["w6"]  # metrics_endpoints shorter than the workers


def test_workers_are_fetched_concurrently() -> None:
    async def main() -> tuple[float, dict[str, Any]]:
        workers = Workers()
        try:
            endpoints = [await workers.slow() for _ in range(4)]
            loop = asyncio.get_running_loop()
            started = loop.time()
            doc = await document_of(source(links(*[True] * 4), endpoints))
            return loop.time() - started, doc
        finally:
            await workers.close()

    elapsed, doc = asyncio.run(main())
    assert all(w["status"] is None for w in doc["workers"])
    assert elapsed < 4 * TIMEOUT  # one timeout for all, not one after another


def _lpt(workers: Sequence[WorkerLink]) -> LptPolicy:
    scheduling = SchedulingConfig(
        mode=SchedulingMode.LPT_PACKING, compaction_mode=CompactionMode.OFF
    )
    config = GatewayConfig(endpoints=tuple(w.url for w in workers), scheduling=scheduling)
    policy = make_policy(config, workers, GatewayMetrics(mode="lpt_packing"))
    assert isinstance(policy, LptPolicy)
    return policy


def _poll(*models: str) -> control_pb2.ModelControlStatusResponse:
    return control_pb2.ModelControlStatusResponse(
        discipline="fifo",
        weight_cache_max_bytes=1 << 30,
        models=[control_pb2.ModelStatus(name=m, weight_nbytes=1024, weight=1.0) for m in models],
    )


def test_lpt_placement_and_last_repack() -> None:
    workers = links(True, True)
    policy = _lpt(workers)

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        before = await document_of(source(workers, policy=policy))
        policy.startup_repack({w.url: _poll("a", "b", "c") for w in workers})
        return before, await document_of(source(workers, policy=policy))

    before, after = asyncio.run(main())
    assert before["policy"] == "lpt_packing"
    assert before["last_repack"] == {"generation": 0, "seconds_ago": None, "reason": None}
    assert before["placement"] == []
    assert after["last_repack"]["generation"] == 1
    assert after["last_repack"]["reason"] == "startup"
    assert 0 <= after["last_repack"]["seconds_ago"] < 60
    # Default replicas 1: every model on exactly one worker, by label; the discovery routing
    # table (empty here) does not matter under lpt_packing.
    assert [row["model"] for row in after["placement"]] == ["a", "b", "c"]
    for row in after["placement"]:
        assert len(row["workers"]) == 1
        assert row["workers"][0] in {"w0", "w1"}


@contextlib.asynccontextmanager
async def gateway_port(status: StatusSource | None) -> AsyncIterator[str]:
    app = gateway_http_app(
        metrics=GatewayMetrics(), scrape_targets=[], ready=lambda: True, status=status
    )
    runner = await start_http(app, "127.0.0.1", 0)
    try:
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def fetch(url: str) -> tuple[int, str, bytes]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, response.headers.get("Content-Type", ""), await response.read()


def test_http_port_serves_the_page_and_the_document() -> None:
    async def main() -> list[tuple[int, str, bytes]]:
        workers = Workers()
        try:
            endpoint = await workers.document("w0")
            status = source(links(True), [endpoint], routes={"mlp": ("10.0.0.1:8001",)})
            async with gateway_port(status) as base:
                return [await fetch(f"{base}{path}") for path in ("/", "/status", "/nope")]
        finally:
            await workers.close()

    (page_status, page_type, page), (doc_status, doc_type, body), (missing, _, _) = asyncio.run(
        main()
    )
    assert page_status == 200
    assert page_type == PAGE_CONTENT_TYPE
    assert page.lstrip().lower().startswith(b"<!doctype html")
    assert b"/status" in page
    assert doc_status == 200
    assert doc_type.startswith("application/json")
    doc = json.loads(body)
    assert doc["kind"] == "gateway"
    assert doc["placement"] == [{"model": "mlp", "workers": ["w0"]}]
    assert doc["workers"][0]["status"] == worker_document("w0")
    assert missing == 404


def test_without_a_status_source_neither_route_exists() -> None:
    async def main() -> list[int]:
        async with gateway_port(None) as base:
            return [(await fetch(f"{base}{path}"))[0] for path in ("/", "/status")]

    assert asyncio.run(main()) == [404, 404]
