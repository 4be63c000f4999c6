"""The gateway's HTTP port: aggregated ``/metrics``, ``/healthz``, ``/readyz``, REST.

``GET /metrics`` scrapes every worker's ``/metrics`` concurrently (one shared client session,
opened on start-up and closed on cleanup), records
``reactantserver_gateway_worker_metrics_up{worker}`` and
answers the gateway's own series followed by the workers' (:func:`merge_expositions`). With a
``rest`` backend, ``/v2/...`` is the inference service over KServe V2 REST
(:mod:`reactantserver.gateway.transport.rest`). Every other path, and every method but
``GET``/``HEAD`` on the three probe paths, is ``404``::

    app = gateway_http_app(metrics=metrics, scrape_targets=[("w0", "10.0.0.5:8002")],
                           ready=lambda: any_worker_ready, rest=GatewayRestBackend(service))
    runner = await start_http(app, "0.0.0.0", 8002)
    port = runner.addresses[0][1]
    ...
    await runner.cleanup()

A scrape fails on a connection error, a timeout (``timeout_seconds`` per worker, 5 s by
default) or a status other than 200; the failed worker's samples are then left out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import aiohttp
from aiohttp import web

from reactantserver.core.rest import RestBackend
from reactantserver.core.rest.http_app import add_rest_route
from reactantserver.gateway.views.exposition import merge_expositions
from reactantserver.gateway.views.metrics import CONTENT_TYPE, GatewayMetrics
from reactantserver.gateway.views.status import StatusSource, add_status_routes

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_SCRAPE_TIMEOUT_SECONDS",
    "gateway_http_app",
]

DEFAULT_SCRAPE_TIMEOUT_SECONDS = 5.0
"""Per-worker timeout of one ``/metrics`` scrape."""
DEFAULT_MAX_BODY_BYTES = 512 * 1024 * 1024
"""Largest REST request body (as ``grpc.max_recv_msg_bytes``; the server passes its own)."""

_log = logging.getLogger(__name__)

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_SESSION = web.AppKey("scrape_session", aiohttp.ClientSession)


@web.middleware
async def _not_found(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Answer a known path with an unknown method ``404`` too (no ``405``: Triton answers none
    either)."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed:
        raise web.HTTPNotFound() from None


async def _scrape(
    session: aiohttp.ClientSession, label: str, target: str, timeout: aiohttp.ClientTimeout
) -> str | None:
    """The worker's exposition, or ``None`` when the scrape failed."""
    try:
        async with session.get(f"http://{target}/metrics", timeout=timeout) as response:
            if response.status != 200:
                _log.debug(
                    "worker metrics scrape failed worker=%s status=%s", label, response.status
                )
                return None
            body = await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        _log.debug("worker metrics scrape failed worker=%s error=%r", label, exc)
        return None
    return body.decode("utf-8", "replace")


def gateway_http_app(
    *,
    metrics: GatewayMetrics | None,
    scrape_targets: Sequence[tuple[str, str]],
    ready: Callable[[], bool],
    timeout_seconds: float = DEFAULT_SCRAPE_TIMEOUT_SECONDS,
    rest: RestBackend | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    status: StatusSource | None = None,
) -> web.Application:
    """The gateway's aiohttp application.

    Without ``metrics`` it is the REST port's application: the probes and ``rest`` only.
    ``scrape_targets`` are ``(worker label, "host:port")`` of the workers' HTTP ports, in
    exposition order; ``ready()`` backs ``/readyz``; ``rest`` serves ``/v2/...`` (request
    bodies up to ``max_body_bytes``); ``status`` serves the status page ``/`` and its
    document ``/status`` (:mod:`reactantserver.gateway.views.status`).
    """
    targets = tuple(scrape_targets)
    timeout = aiohttp.ClientTimeout(total=timeout_seconds)

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession() as session:
            app[_SESSION] = session
            yield

    async def get_metrics(request: web.Request) -> web.Response:
        assert metrics is not None
        session = request.app[_SESSION]
        bodies = await asyncio.gather(
            *(_scrape(session, label, target, timeout) for label, target in targets)
        )
        for (label, _), body in zip(targets, bodies, strict=True):
            metrics.worker_metrics_up.labels(label).set(0 if body is None else 1)
        sources: list[bytes | str] = [metrics.render()]
        sources.extend(body for body in bodies if body is not None)
        text = merge_expositions(sources)
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(request: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok")
        return web.Response(status=503, text="not ready")

    app = web.Application(middlewares=[_not_found], client_max_size=max_body_bytes)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if metrics is not None:
        app.cleanup_ctx.append(session_ctx)
        app.router.add_get("/metrics", get_metrics)
        if status is not None:
            add_status_routes(app, status, lambda request: request.app[_SESSION])
    if rest is not None:
        add_rest_route(app, rest)
    return app
