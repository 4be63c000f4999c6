"""The gateway's HTTP port over real sockets: aggregated /metrics, /healthz, /readyz, 404s."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from packages.gateway.tests._fake_workers import FakeWorkers, refused_port
from reactantserver.core.rest.http_app import start_http
from reactantserver.gateway.transport.http import _SESSION, gateway_http_app
from reactantserver.gateway.views.metrics import CONTENT_TYPE, GatewayMetrics

TIMEOUT = 0.3


def canned(worker: str) -> str:
    """A worker exposition: a counter, a histogram and a gauge, all labelled ``worker``."""
    return f"""\
# HELP reactantserver_worker_requests_total Inference requests by final status.
# TYPE reactantserver_worker_requests_total counter
reactantserver_worker_requests_total{{model="m",status="OK",worker="{worker}"}} 3.0
# HELP reactantserver_worker_request_latency_seconds Inference handler wall time.
# TYPE reactantserver_worker_request_latency_seconds histogram
reactantserver_worker_request_latency_seconds_bucket{{le="0.001",model="m",worker="{worker}"}} 1.0
reactantserver_worker_request_latency_seconds_bucket{{le="+Inf",model="m",worker="{worker}"}} 3.0
reactantserver_worker_request_latency_seconds_count{{model="m",worker="{worker}"}} 3.0
reactantserver_worker_request_latency_seconds_sum{{model="m",worker="{worker}"}} 0.5
# HELP reactantserver_worker_inflight_requests Inference requests in flight.
# TYPE reactantserver_worker_inflight_requests gauge
reactantserver_worker_inflight_requests{{worker="{worker}"}} 1.0
"""


class Workers(FakeWorkers):
    """Fake worker ``/metrics`` ports: canned, slow (until released) and failing ones."""

    def __init__(self) -> None:
        super().__init__("/metrics")

    async def canned(self, worker: str) -> str:
        return await self.answering(
            lambda: web.Response(text=canned(worker), content_type="text/plain")
        )

    async def slow(self) -> str:
        return await self.holding(lambda: web.Response(text=canned("slow")))

    async def failing(self) -> str:
        return await self.answering(lambda: web.Response(status=500, text=canned("failing")))


@contextlib.asynccontextmanager
async def gateway(
    metrics: GatewayMetrics,
    targets: Sequence[tuple[str, str]],
    ready: Callable[[], bool] = lambda: True,
) -> AsyncIterator[tuple[str, web.Application]]:
    """The gateway app on a free port; yields its base URL and the application."""
    app = gateway_http_app(
        metrics=metrics, scrape_targets=targets, ready=ready, timeout_seconds=TIMEOUT
    )
    runner = await start_http(app, "127.0.0.1", 0)
    try:
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}", app
    finally:
        await runner.cleanup()


async def fetch(url: str, method: str = "GET") -> tuple[int, str, str]:
    """``(status, Content-Type header, body)``."""
    async with aiohttp.ClientSession() as session, session.request(method, url) as response:
        return response.status, response.headers.get("Content-Type", ""), await response.text()


def up(metrics: GatewayMetrics, worker: str) -> float | None:
    return metrics.registry.get_sample_value(
        "reactantserver_gateway_worker_metrics_up", {"worker": worker}
    )


def test_metrics_merges_own_series_and_every_worker() -> None:
    metrics = GatewayMetrics()
    metrics.worker_ready.labels("w0").set(1)

    async def main() -> str:
        workers = Workers()
        try:
            targets = [("w0", await workers.canned("w0")), ("w1", await workers.canned("w1"))]
            async with gateway(metrics, targets) as (base, _):
                status, content_type, body = await fetch(f"{base}/metrics")
                assert status == 200
                assert content_type == CONTENT_TYPE
                return body
        finally:
            await workers.close()

    body = asyncio.run(main())
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert len(families) == len(list(text_string_to_metric_families(body)))
    latency = families["reactantserver_worker_request_latency_seconds"]
    assert latency.type == "histogram"
    assert {s.labels["worker"] for s in latency.samples} == {"w0", "w1"}
    assert len(latency.samples) == 8
    assert [s.labels["worker"] for s in families["reactantserver_worker_requests"].samples] == [
        "w0",
        "w1",
    ]
    ups = {
        s.labels["worker"]: s.value
        for s in families["reactantserver_gateway_worker_metrics_up"].samples
    }
    assert ups == {"w0": 1.0, "w1": 1.0}
    # The gateway's own series come first.
    names = list(families)
    assert names.index("reactantserver_gateway_requests") < names.index(
        "reactantserver_worker_requests"
    )
    assert body.count("# TYPE reactantserver_worker_request_latency_seconds ") == 1


def test_slow_refused_and_failing_workers_are_down_and_omitted() -> None:
    metrics = GatewayMetrics()

    async def main() -> tuple[str, float]:
        workers = Workers()
        try:
            with refused_port() as refused:
                targets = [
                    ("ok", await workers.canned("ok")),
                    ("slow1", await workers.slow()),
                    ("slow2", await workers.slow()),
                    ("refused", refused),
                    ("failing", await workers.failing()),
                ]
                async with gateway(metrics, targets) as (base, _):
                    start = time.monotonic()
                    status, _, body = await fetch(f"{base}/metrics")
                    elapsed = time.monotonic() - start
                    assert status == 200
                    return body, elapsed
        finally:
            await workers.close()

    body, elapsed = asyncio.run(main())
    # Both slow workers time out together: the scrapes run concurrently.
    assert TIMEOUT <= elapsed < 2 * TIMEOUT + 0.5
    families = {f.name: f for f in text_string_to_metric_families(body)}
    ups = {
        s.labels["worker"]: s.value
        for s in families["reactantserver_gateway_worker_metrics_up"].samples
    }
    assert ups == {"ok": 1.0, "slow1": 0.0, "slow2": 0.0, "refused": 0.0, "failing": 0.0}
    worker_samples = [
        s
        for name, f in families.items()
        if name.startswith("reactantserver_worker_")
        for s in f.samples
    ]
    assert len(worker_samples) == 6
    assert {s.labels["worker"] for s in worker_samples} == {"ok"}


def test_up_recovers_once_a_worker_answers_again() -> None:
    metrics = GatewayMetrics()
    answering = False

    async def main() -> None:
        async def handler(request: web.Request) -> web.Response:
            if not answering:
                return web.Response(status=503)
            return web.Response(text=canned("w0"))

        nonlocal answering
        workers = Workers()
        try:
            async with gateway(metrics, [("w0", await workers.serve(handler))]) as (base, _):
                await fetch(f"{base}/metrics")
                assert up(metrics, "w0") == 0
                answering = True
                _, _, body = await fetch(f"{base}/metrics")
                assert up(metrics, "w0") == 1
                assert 'worker="w0"' in body
        finally:
            await workers.close()

    asyncio.run(main())


def test_no_targets_serves_own_series_only_and_head_works() -> None:
    metrics = GatewayMetrics(mode="lpt_packing")

    async def main() -> None:
        async with gateway(metrics, []) as (base, _):
            status, content_type, body = await fetch(f"{base}/metrics")
            assert status == 200
            assert content_type == CONTENT_TYPE
            assert "reactantserver_gateway_repacks_total" in body
            assert "worker_" not in body.replace("gateway_worker_", "")
            status, _, body = await fetch(f"{base}/metrics", "HEAD")
            assert (status, body) == (200, "")

    asyncio.run(main())


def test_healthz_readyz_and_404s() -> None:
    ready = False

    async def main() -> None:
        nonlocal ready
        async with gateway(GatewayMetrics(), [], ready=lambda: ready) as (base, _):
            assert (await fetch(f"{base}/healthz"))[::2] == (200, "ok")
            assert (await fetch(f"{base}/readyz"))[::2] == (503, "not ready")
            ready = True
            assert (await fetch(f"{base}/readyz"))[::2] == (200, "ok")
            ready = False
            assert (await fetch(f"{base}/readyz"))[::2] == (503, "not ready")
            assert (await fetch(f"{base}/readyz", "HEAD"))[0] == 503
            assert (await fetch(f"{base}/healthz", "HEAD"))[0] == 200
            for method, path in [
                ("GET", "/"),
                ("GET", "/metrics/extra"),
                ("GET", "/v2/health/ready"),
                ("POST", "/metrics"),
                ("PUT", "/healthz"),
                ("DELETE", "/readyz"),
            ]:
                assert (await fetch(f"{base}{path}", method))[0] == 404, (method, path)

    asyncio.run(main())


def test_the_scrape_session_opens_on_startup_and_closes_on_cleanup() -> None:
    async def main() -> aiohttp.ClientSession:
        async with gateway(GatewayMetrics(), []) as (_, app):
            session = app[_SESSION]
            assert not session.closed
        return session

    assert asyncio.run(main()).closed
