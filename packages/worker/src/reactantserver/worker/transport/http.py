"""The worker's HTTP ports: ``/metrics``, ``/healthz``, ``/readyz``, KServe V2 REST.

With ``endpoints.http_port`` set, REST and the probes have a port of their own (Triton's 8000)
and the metrics port keeps ``/metrics``, the probes and the status page (``GET /`` and its
document ``GET /status``, :mod:`reactantserver.worker.views.status`): the status page is an
operator's view, like the metrics, so it stays off the port clients are given. Without it, one
port serves everything.

The application runs on the gRPC server's event loop; ``/v2/...`` is the inference service
over REST (:mod:`reactantserver.worker.transport.rest`); every other path (and every other
method on the three probe paths) is ``404``::

    runner = await start_http(http_app(state, metrics), "127.0.0.1", 9100)  # core.rest.http_app
    rest = await start_http(http_app(state, None, service), "127.0.0.1", 8000)  # REST only
    ...
    await runner.cleanup()
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from reactantserver.core.rest.http_app import add_rest_route
from reactantserver.worker.state import WorkerState
from reactantserver.worker.transport.inference import InferenceService
from reactantserver.worker.transport.rest import WorkerRestBackend
from reactantserver.worker.views.metrics import CONTENT_TYPE, WorkerMetrics
from reactantserver.worker.views.status import add_status_routes

__all__ = ["http_app"]

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _not_found(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Answer a known path with an unknown method ``404`` too (no ``405``: Triton answers none
    either)."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed:
        raise web.HTTPNotFound() from None


def http_app(
    state: WorkerState,
    metrics: WorkerMetrics | None,
    service: InferenceService | None = None,
    *,
    rest: bool = True,
) -> web.Application:
    """The worker's aiohttp application: the probes, plus ``/metrics`` and the status page
    when ``metrics`` is given, plus ``/v2`` REST when ``rest`` is true.

    The metrics port gets both (``rest`` off when REST has a port of its own); the REST port
    gets ``metrics=None``, so it can be exposed to clients without the operator's views. A
    request body may be as large as a gRPC message (``grpc.max_recv_msg_bytes``).
    """

    async def get_metrics(request: web.Request) -> web.Response:
        assert metrics is not None
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(request: web.Request) -> web.Response:
        if state.ready():
            return web.Response(text="ok")
        return web.Response(status=503, text="not ready")

    app = web.Application(
        middlewares=[_not_found], client_max_size=state.config.grpc.max_recv_msg_bytes
    )
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if metrics is not None:
        app.router.add_get("/metrics", get_metrics)
        add_status_routes(app, state)
    if rest:
        add_rest_route(app, WorkerRestBackend(service or InferenceService(state)))
    return app
