"""The aiohttp glue of the worker's and the gateway's HTTP port: the ``/v2`` route, the listener.

Both servers mount KServe V2 REST the same way and open their HTTP port the same way, so the
two functions live here once. aiohttp comes with core's ``server`` extra; it is imported when
a function runs, so the thin client (which depends on core) never loads it::

    app = web.Application()
    add_rest_route(app, backend)            # backend: a RestBackend
    runner = await start_http(app, "127.0.0.1", 0)
    ...
    await runner.cleanup()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reactantserver.core.rest import RestBackend, handle_rest

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["add_rest_route", "start_http"]


def add_rest_route(app: web.Application, backend: RestBackend) -> None:
    """Mount ``/v2`` and everything under it (any method) on ``app``, served by ``backend``.

    The body is read as sent (aiohttp has already undone a gzip/deflate ``Content-Encoding``);
    a response is compressed when the client's ``Accept-Encoding`` asks for it.
    """
    from aiohttp import web

    async def serve(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        answer = await handle_rest(request.method, request.raw_path, request.headers, body, backend)
        response = web.Response(status=answer.status, body=answer.body, headers=answer.headers)
        if request.headers.get("Accept-Encoding"):
            response.enable_compression()
        return response

    app.router.add_route("*", r"/v2{tail:(?:/.*)?}", serve)


async def start_http(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Serve ``app`` on ``host:port`` (port 0: any free one; see ``runner.addresses``).

    Returns the runner; ``await runner.cleanup()`` stops the listener (and runs the app's
    cleanup hooks). No access log.
    """
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
