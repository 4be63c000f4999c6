"""KServe V2 REST over the gRPC service: HTTP requests in, protobuf calls, HTTP answers out.

REST only translates: :func:`handle_rest` turns a ``/v2/...`` request
into the very protobuf request the gRPC service receives, calls it through a
:class:`RestBackend` (the worker's or the gateway's handlers), and turns the response, or the
status it failed with, into an HTTP answer. No I/O and no HTTP framework here; a server
mounts it behind one catch-all route::

    response = await handle_rest(
        request.method, request.raw_path, request.headers, await request.read(), backend
    )
    return web.Response(status=response.status, body=response.body, headers=response.headers)

Statuses: the gRPC code of a failure maps through :func:`http_status` (404, 429, 503, 504,
500, everything else 400), with a ``{"error": "<message>"}`` JSON body. An unknown path is a
404, a known path with the wrong method a 405 with ``Allow`` (what Triton answers). ``HEAD`` is
served wherever ``GET`` is, without the body.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import attrs

from reactantserver.core.rest._endpoints import translate
from reactantserver.core.rest._routes import ALLOWED_METHODS, match_route
from reactantserver.core.rest._types import (
    RestBackend,
    RestCallError,
    RestContext,
    RestResponse,
    error_response,
    http_status,
)

__all__ = [
    "RestBackend",
    "RestCallError",
    "RestContext",
    "RestResponse",
    "handle_rest",
    "http_status",
]

_log = logging.getLogger("reactantserver.rest")

_NOT_FOUND = 404
_METHOD_NOT_ALLOWED = 405
_INTERNAL = 500


async def handle_rest(
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    backend: RestBackend,
    *,
    time_remaining: float | None = None,
) -> RestResponse:
    """Answer one KServe V2 REST request by calling ``backend``.

    ``path`` is the raw (percent-encoded) request path, a query string allowed; ``headers``
    are looked up case-insensitively; ``body`` is the decoded (decompressed) request body;
    ``time_remaining`` is passed on to every backend call. Never raises for a bad request or
    a failed call: those become their HTTP status.
    """
    verb = method.upper()
    try:
        route = match_route(path)
    except RestCallError as exc:
        return _failure(exc)
    if route is None:
        return error_response(_NOT_FOUND, f"no KServe V2 endpoint at {method} {path}")
    allowed = ALLOWED_METHODS[route.endpoint]
    head = verb == "HEAD" and "GET" in allowed
    if verb not in allowed and not head:
        return error_response(
            _METHOD_NOT_ALLOWED,
            f"{method} is not allowed on {path} (use {', '.join(sorted(allowed))})",
            {"Allow": ", ".join(sorted(allowed | ({"HEAD"} if "GET" in allowed else set())))},
        )
    try:
        request, render = translate(route, "GET" if head else verb, headers, body)
        reply = await backend.call(
            route.endpoint.value, request, time_remaining, headers=headers.items()
        )
        response = render(reply)
    except RestCallError as exc:
        response = _failure(exc)
    except Exception as exc:
        # The transport edge: whatever escaped a backend becomes a 500, as gRPC's INTERNAL.
        _log.exception("REST %s %s failed", method, path)
        response = error_response(_INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
    return attrs.evolve(response, body=b"") if head else response


def _failure(exc: RestCallError) -> RestResponse:
    return error_response(http_status(exc.code), exc.message)
