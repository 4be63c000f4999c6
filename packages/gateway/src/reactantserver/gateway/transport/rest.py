"""KServe V2 REST on the gateway's HTTP port: ``/v2/...`` over the gRPC service's handlers.

REST only translates (:func:`reactantserver.core.rest.handle_rest`). :class:`GatewayRestBackend`
looks each method up in the very :class:`grpc.GenericRpcHandler` the gateway's gRPC server
serves (:meth:`GatewayService.handler`), serializes the request message the way gRPC would,
calls that handler and parses its answer: ``ModelInfer`` is ``Proxy.infer``, so routing,
failover, the inbound cap and the request metrics are the gRPC path's own::

    app = web.Application()
    add_rest_route(app, GatewayRestBackend(service))
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf.message import Message

from reactantserver.core.protocol import INFERENCE_METHODS
from reactantserver.core.rest import RestCallError, RestContext
from reactantserver.gateway.transport.service import GatewayService

__all__ = ["GatewayRestBackend"]

_log = logging.getLogger("reactantserver.gateway.rest")


class _CallDetails(grpc.HandlerCallDetails):  # type: ignore[misc]
    """What a generic handler looks a method up by: its full path."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


class GatewayRestBackend:
    """:class:`~reactantserver.core.rest.RestBackend` over the gateway's inference service."""

    def __init__(self, service: GatewayService) -> None:
        self._handler = service.handler()

    async def call(
        self,
        method: str,
        request: Message,
        time_remaining: float | None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> Message:
        """Run the gRPC handler of ``method``; a non-OK status raises :class:`RestCallError`."""
        info = INFERENCE_METHODS.get(method)
        rpc: Any = None if info is None else self._handler.service(_CallDetails(info.path))
        if info is None or rpc is None or rpc.unary_unary is None:
            raise RestCallError(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not served over REST")
        body = request.SerializeToString()
        argument = body if rpc.request_deserializer is None else rpc.request_deserializer(body)
        try:
            answer = await rpc.unary_unary(argument, RestContext(time_remaining, headers))
        except RestCallError:
            raise
        except Exception as exc:
            # What grpc.aio answers for a handler that raised: UNKNOWN (HTTP 500).
            _log.exception("REST %s failed", method)
            raise RestCallError(
                grpc.StatusCode.UNKNOWN, f"unexpected {type(exc).__name__}: {exc}"
            ) from None
        if isinstance(answer, Message):
            return answer
        return info.response.FromString(answer)
