"""KServe V2 REST on the worker's HTTP port: ``/v2/...`` over the gRPC handlers.

REST only translates: :func:`reactantserver.core.rest.handle_rest` turns each HTTP request
into the protobuf request the gRPC service receives, :class:`WorkerRestBackend` runs the very
handler the gRPC server runs (:class:`InferenceService`), and the answer goes back the same
way. One catch-all route under ``/v2`` is mounted on the worker's aiohttp application::

    app = web.Application()
    add_rest_route(app, WorkerRestBackend(InferenceService(state)))
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import grpc
from google.protobuf.message import Message

from reactantserver.core.errors import ReactantError, status_message, status_of
from reactantserver.core.rest import RestCallError, RestContext
from reactantserver.worker.transport.inference import Handler, InferenceService

__all__ = ["WorkerRestBackend"]

_log = logging.getLogger("reactantserver.worker.rest")

#: Methods that exist on gRPC only: streaming has no KServe V2 REST form.
_GRPC_ONLY = frozenset({"ModelStreamInfer"})


class WorkerRestBackend:
    """:class:`~reactantserver.core.rest.RestBackend` over the worker's inference service."""

    def __init__(self, service: InferenceService) -> None:
        self._handlers: dict[str, Handler] = service.handlers()

    async def call(
        self,
        method: str,
        request: Message,
        time_remaining: float | None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> Message:
        """Run the gRPC handler of ``method``; a non-OK status raises :class:`RestCallError`."""
        handler = self._handlers.get(method)
        if handler is None or method in _GRPC_ONLY:
            raise RestCallError(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not served over REST")
        try:
            response: Message = await handler(request, RestContext(time_remaining, headers))
        except RestCallError:
            raise
        except ReactantError as exc:
            raise RestCallError(status_of(exc), status_message(exc)) from None
        except Exception as exc:
            # What grpc.aio answers for a handler that raised: UNKNOWN (HTTP 500).
            _log.exception("REST %s failed", method)
            raise RestCallError(
                grpc.StatusCode.UNKNOWN, f"unexpected {type(exc).__name__}: {exc}"
            ) from None
        return response
