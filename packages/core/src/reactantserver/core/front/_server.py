"""The native front door: an ``h2corn`` server (Rust, hyper) carrying gRPC to Python handlers.

:class:`GrpcFront` takes method handlers the way a ``grpc.aio`` server does
(``add_generic_rpc_handlers``, ``add_registered_method_handlers``, so generated
``add_*Servicer_to_server`` functions work), binds its listeners at once (so a taken port
fails the start, and port 0 tells the chosen port), then serves them with
:class:`~reactantserver.core.front._app.GrpcApp` on the running event loop::

    front = GrpcFront(max_recv_msg_bytes=64 << 20, max_send_msg_bytes=64 << 20)
    front.add_generic_rpc_handlers([inference_service_handler(handlers)])
    port = front.add_port("127.0.0.1:0")
    await front.start()
    ...
    await front.stop(grace=5.0)

HTTP/2 framing, flow control, HPACK and TLS run on the server's own threads; per call the
event loop runs only the application's coroutine. Requests that are not gRPC go to the
``fallback`` ASGI application when one is given (REST on the same port).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import grpc

from reactantserver.core.front._app import GrpcApp
from reactantserver.core.front._methods import MethodTable
from reactantserver.core.front._responses import ASGIApp

__all__ = ["FrontTls", "GrpcFront", "bind_listener", "flood_backstop"]

_log = logging.getLogger("reactantserver.front")

#: Per-connection HTTP/2 stream limit when the configuration sets none (gRPC's default: 100).
DEFAULT_MAX_STREAMS = 1024


def flood_backstop(max_concurrent_requests: int) -> int:
    """The native server's call limit for an in-flight cap (0: none).

    Well above the cap, so that requests over the cap reach the application and are refused
    with ``RESOURCE_EXHAUSTED``; only a flood far beyond it is shed natively.
    """
    if max_concurrent_requests <= 0:
        return 0
    return max(256, 8 * max_concurrent_requests)


@attrs.frozen
class FrontTls:
    """Inbound TLS: certificate and key; with a client CA, mutual TLS (client certs required)."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""


def bind_listener(address: str, *, reuse_port: bool = False, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``[v6]:port``); port 0 picks a free one.

    ``reuse_port`` lets several processes share the port (``SO_REUSEPORT``); off, a port in
    use fails here (``RuntimeError`` "Failed to bind ...", as grpc words it).
    """
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, int(port_text)))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"Failed to bind to address {address}: {exc.strerror}") from exc
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class GrpcFront:
    """A gRPC server on the native HTTP/2 front, with the registration API of grpc servers.

    ``max_concurrent_calls`` (0: none) bounds the calls running in Python at once; the native
    server sheds the rest with HTTP 503 (``UNAVAILABLE``) before any Python runs.
    """

    def __init__(
        self,
        *,
        max_recv_msg_bytes: int,
        max_send_msg_bytes: int,
        max_concurrent_streams: int = DEFAULT_MAX_STREAMS,
        max_concurrent_calls: int = 0,
        idle_timeout_seconds: float = 0.0,
        runtime_threads: int = 1,
        log_format: str = "text",
        fallback: ASGIApp | None = None,
    ) -> None:
        self.methods = MethodTable()
        self.app = GrpcApp(
            self.methods,
            max_recv_msg_bytes=max_recv_msg_bytes,
            max_send_msg_bytes=max_send_msg_bytes,
            fallback=fallback,
        )
        self._max_recv = max_recv_msg_bytes
        self._max_streams = max(1, max_concurrent_streams)
        self._max_calls = max_concurrent_calls
        self._idle_timeout = idle_timeout_seconds
        self._threads = runtime_threads
        self._log_format = log_format
        self._sockets: list[socket.socket] = []
        self._tls: FrontTls | None = None
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    # -- registration (the grpc server API generated code calls) --------------------------

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        """Serve the methods of ``handlers``."""
        self.methods.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        """Serve one service's ``handlers`` (method name -> handler)."""
        self.methods.add_registered_method_handlers(service, handlers)

    def set_gate(self, path: str, gate: Callable[[], str | None]) -> None:
        """Refuse calls of ``path`` with ``RESOURCE_EXHAUSTED`` while ``gate()`` gives a reason,
        before their request is read (an in-flight cap)."""
        self.methods.set_gate(path, gate)

    # -- listeners -----------------------------------------------------------------------

    def add_port(
        self, address: str, tls: FrontTls | None = None, *, reuse_port: bool = False
    ) -> int:
        """Bind ``address`` now (plain, or TLS with ``tls``); returns the bound port."""
        if self._task is not None:
            raise RuntimeError("add ports before start()")
        if tls is not None:
            if self._tls is not None and self._tls != tls:
                raise ValueError("one TLS identity per front")
            self._tls = tls
        elif self._tls is not None:
            raise ValueError("a front serves either plain or TLS listeners, not both")
        sock = bind_listener(address, reuse_port=reuse_port)
        self._sockets.append(sock)
        return int(sock.getsockname()[1])

    def add_socket(self, sock: socket.socket) -> int:
        """Serve on an already listening socket (e.g. one shared by front processes)."""
        self._sockets.append(sock)
        return int(sock.getsockname()[1])

    # -- running -------------------------------------------------------------------------

    def _config(self, grace: float) -> Any:
        from h2corn import Config

        options: dict[str, Any] = {
            "bind": [f"fd://{sock.fileno()}" for sock in self._sockets],
            "lifespan": "off",
            "grpc": True,
            "access_log": False,
            # The server's own few lines (its start-up banner, connection errors) follow the
            # process's log format, so JSON logs stay JSON lines.
            "log_format": self._log_format,
            "runtime_threads": self._threads,
            "max_concurrent_streams": self._max_streams,
            # The backstop of a flood: beyond this many calls in Python at once the native
            # server answers HTTP 503 (gRPC UNAVAILABLE) without running any Python.
            "limit_concurrency": self._max_calls,
            # A message over the limit is refused by the application with gRPC's status as
            # soon as its prefix arrives; the HTTP layer only bounds what a body may be.
            "max_request_body_size": self._max_recv + 64 * 1024,
            "timeout_graceful_shutdown": grace,
            # gRPC keeps connections open while idle (no MAX_CONNECTION_IDLE by default).
            "timeout_keep_alive": self._idle_timeout,
        }
        if self._tls is not None:
            options["certfile"] = Path(self._tls.cert_file)
            options["keyfile"] = Path(self._tls.key_file)
            if self._tls.client_ca_file:
                options["ca_certs"] = Path(self._tls.client_ca_file)
                options["cert_reqs"] = "required"
        return Config(**options)

    async def start(self, *, grace_seconds: float = 30.0) -> None:
        """Start serving on the running loop; returns once the listeners accept."""
        from h2corn import Server

        if not self._sockets:
            raise RuntimeError("no listener: call add_port() first")
        app: Any = self.app  # h2corn types its application with its own TypedDicts
        self._server = Server(app, self._config(grace_seconds))
        self._task = asyncio.create_task(self._server.serve(), name="grpc-front")
        waiting = asyncio.create_task(self._server.wait_started())
        done, _ = await asyncio.wait({waiting, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if self._task in done:
            waiting.cancel()
            self._task.result()  # raises the start-up error
            raise RuntimeError("the front stopped while starting")
        waiting.result()

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting; let calls in flight finish for up to ``grace`` seconds, then end."""
        if self._task is None:
            self._close_sockets()
            return
        self._server.shutdown()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=grace)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        except Exception:  # a failing drain must not fail the shutdown
            _log.exception("the gRPC front failed while stopping")
        self._task = None
        self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in self._sockets:
            sock.close()
        self._sockets = []
