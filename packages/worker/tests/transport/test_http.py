"""The worker's HTTP port over a real socket: /metrics, /healthz, /readyz and 404s."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reactantserver.core.config import WorkerConfig
from reactantserver.core.rest.http_app import start_http
from reactantserver.worker.registry import ModelEntry, ModelState
from reactantserver.worker.state import WorkerState
from reactantserver.worker.transport.http import http_app
from reactantserver.worker.views.metrics import CONTENT_TYPE, WorkerMetrics

Check = Callable[[aiohttp.ClientSession, str], Awaitable[None]]


@contextlib.asynccontextmanager
async def serving(state: WorkerState) -> AsyncIterator[str]:
    """The app on 127.0.0.1 at a free port; yields its base URL."""
    runner = await start_http(http_app(state, WorkerMetrics(state, environ={})), "127.0.0.1", 0)
    try:
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def run(state: WorkerState, check: Check) -> None:
    """Serve ``state`` and run ``check(session, base_url)`` against it."""

    async def main() -> None:
        async with serving(state) as base, aiohttp.ClientSession() as session:
            await check(session, base)

    asyncio.run(main())


async def get(
    session: aiohttp.ClientSession, url: str, method: str = "GET"
) -> tuple[int, str, str]:
    """``(status, content type header, body)``."""
    async with session.request(method, url) as response:
        return response.status, response.headers.get("Content-Type", ""), await response.text()


@pytest.fixture
def state() -> WorkerState:
    return WorkerState(WorkerConfig(worker_name="w7"), version="0.1.0")


def test_healthz_answers_ok_from_the_start(state: WorkerState) -> None:
    async def check(session: aiohttp.ClientSession, base: str) -> None:
        status, content_type, body = await get(session, f"{base}/healthz")
        assert (status, body) == (200, "ok")
        assert content_type.startswith("text/plain")

    run(state, check)


def test_readyz_follows_server_ready(state: WorkerState) -> None:
    async def check(session: aiohttp.ClientSession, base: str) -> None:
        url = f"{base}/readyz"
        assert (await get(session, url))[::2] == (503, "not ready")  # still starting
        state.started = True
        assert (await get(session, url))[::2] == (503, "not ready")  # no servable model
        state.registry.put(ModelEntry("m", ModelState.READY))
        assert (await get(session, url))[::2] == (200, "ok")
        state.stopping = True
        assert (await get(session, url))[::2] == (503, "not ready")
        assert (await get(session, f"{base}/healthz"))[::2] == (200, "ok")

    run(state, check)


def test_metrics_serves_the_text_exposition(state: WorkerState) -> None:
    async def check(session: aiohttp.ClientSession, base: str) -> None:
        for path in ("/metrics", "/metrics?name[]=reactantserver_worker_info&x=1"):
            status, content_type, body = await get(session, base + path)
            assert status == 200
            assert content_type == CONTENT_TYPE
            families = {f.name: f for f in text_string_to_metric_families(body)}
            (info,) = families["reactantserver_worker_info"].samples
            assert info.labels["worker"] == "w7"
            assert "process_cpu_seconds" in families

    run(state, check)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/index.html"),
        ("POST", "/"),
        ("POST", "/status"),
        ("GET", "/nope"),
        ("GET", "/metrics/extra"),
        ("GET", "/v3/health/ready"),
        ("POST", "/metrics"),
        ("DELETE", "/readyz"),
        ("PUT", "/healthz"),
    ],
)
def test_everything_else_is_404(state: WorkerState, method: str, path: str) -> None:
    async def check(session: aiohttp.ClientSession, base: str) -> None:
        status, _, _ = await get(session, base + path, method)
        assert status == 404

    run(state, check)


def test_no_access_log(state: WorkerState, caplog: pytest.LogCaptureFixture) -> None:
    async def check(session: aiohttp.ClientSession, base: str) -> None:
        await get(session, f"{base}/healthz")
        await get(session, f"{base}/nope")

    with caplog.at_level(logging.DEBUG, logger="aiohttp.access"):
        run(state, check)
    assert not [r for r in caplog.records if r.name == "aiohttp.access"]


def test_a_taken_port_fails_start_and_leaves_nothing_running(state: WorkerState) -> None:
    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(OSError, match=r"(?i)address already in use"):
                await start_http(http_app(state, WorkerMetrics(state)), "127.0.0.1", port)

    asyncio.run(main())


def test_cleanup_closes_the_port(state: WorkerState) -> None:
    async def main() -> None:
        async with serving(state) as base, aiohttp.ClientSession() as session:
            assert (await get(session, f"{base}/healthz"))[0] == 200
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectionError):
                await get(session, f"{base}/healthz")

    asyncio.run(main())
