"""The native front door: gRPC (and other HTTP) served by a Rust HTTP/2 server to Python.

``grpc.aio``'s server spends most of a small call's CPU in its own machinery; here the HTTP/2
server (``h2corn``: hyper on tokio, TLS by rustls) runs on its own threads and hands each
call to an ASGI coroutine on the event loop that frames messages and writes the status
trailers itself. Handlers and their registration are those of ``grpc.aio``::

    front = GrpcFront(max_recv_msg_bytes=64 << 20, max_send_msg_bytes=64 << 20)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, front)
    front.add_port("0.0.0.0:8001")
    await front.start()

``h2corn`` comes with the ``server`` extra of reactantserver-core (the worker and the
gateway depend on it); importing this package does not need it.
"""

from __future__ import annotations

from reactantserver.core.front._app import GrpcApp
from reactantserver.core.front._context import AbortError, RpcContext
from reactantserver.core.front._methods import Method, MethodTable
from reactantserver.core.front._responses import ASGIApp
from reactantserver.core.front._server import FrontTls, GrpcFront, bind_listener, flood_backstop
from reactantserver.core.front._wire import parse_timeout, percent_encode

__all__ = [
    "ASGIApp",
    "AbortError",
    "FrontTls",
    "GrpcApp",
    "GrpcFront",
    "Method",
    "MethodTable",
    "RpcContext",
    "bind_listener",
    "flood_backstop",
    "parse_timeout",
    "percent_encode",
]
