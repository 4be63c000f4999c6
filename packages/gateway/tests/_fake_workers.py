"""Stand-in worker HTTP ports for the gateway's HTTP tests: real aiohttp servers on 127.0.0.1.

Each test module subclasses :class:`FakeWorkers` for the path it scrapes and the answers it
needs; ``slow`` ones hold their answer until ``release`` is set (by :meth:`FakeWorkers.close`)::

    class Workers(FakeWorkers):
        def __init__(self) -> None:
            super().__init__("/metrics")
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web

from reactantserver.core.rest.http_app import start_http

__all__ = ["FakeWorkers", "refused_port"]

Answer = Callable[[], web.Response]
"""Builds one answer (a response cannot be sent twice, so one per request)."""


class FakeWorkers:
    """Worker HTTP ports answering ``GET path``; every one is cleaned up by :meth:`close`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.release = asyncio.Event()
        self._runners: list[web.AppRunner] = []

    async def serve(self, handler: Callable[[web.Request], Awaitable[web.Response]]) -> str:
        """A new port answering ``path`` with ``handler``; its ``host:port``."""
        app = web.Application()
        app.router.add_get(self.path, handler)
        runner = await start_http(app, "127.0.0.1", 0)
        self._runners.append(runner)
        host, port = runner.addresses[0][:2]
        return f"{host}:{port}"

    async def answering(self, answer: Answer) -> str:
        """A port that answers ``answer()`` at once."""

        async def handler(request: web.Request) -> web.Response:
            return answer()

        return await self.serve(handler)

    async def holding(self, answer: Answer) -> str:
        """A port that answers ``answer()`` only once ``release`` is set."""

        async def handler(request: web.Request) -> web.Response:
            await self.release.wait()
            return answer()

        return await self.serve(handler)

    async def close(self) -> None:
        """Release the held answers and stop every port."""
        self.release.set()
        for runner in self._runners:
            await runner.cleanup()


@contextlib.contextmanager
def refused_port() -> Iterator[str]:
    """A bound but not listening port: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"
