"""The servicer context a handler gets on the native front: grpc.aio's, in the parts we use.

Handlers written for ``grpc.aio`` run unchanged: ``abort`` raises, ``time_remaining`` reads
the call's deadline, ``set_code``/``set_details`` shape the status of a handler that returns,
``send_initial_metadata`` and ``set_trailing_metadata`` add headers, and streaming handlers
``write`` responses and ``read`` requests. Everything is computed lazily: a plain unary call
that asks nothing of its context costs one small object.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NoReturn

import grpc

from reactantserver.core.front._wire import Headers, Metadata, decode_metadata

__all__ = ["AbortError", "RpcContext"]


class AbortError(grpc.aio.AbortError):  # type: ignore[misc]
    """Raised by :meth:`RpcContext.abort`: the call ends with this status."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        trailing_metadata: Iterable[tuple[str, str | bytes]] = (),
    ) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.trailing_metadata = tuple(trailing_metadata)


class RpcContext:
    """One call's context (a subset of ``grpc.aio.ServicerContext``)."""

    __slots__ = (
        "_client",
        "_code",
        "_deadline",
        "_details",
        "_done",
        "_headers",
        "_initial",
        "_initial_sent",
        "_read",
        "_trailing",
        "_write",
    )

    def __init__(
        self,
        headers: Headers,
        deadline: float | None,
        client: tuple[str, int] | None,
    ) -> None:
        self._headers = headers
        self._deadline = deadline
        self._client = client
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._initial: tuple[tuple[str, str | bytes], ...] = ()
        self._initial_sent = False
        self._trailing: tuple[tuple[str, str | bytes], ...] = ()
        self._done = False
        self._write: Callable[[Any], Awaitable[None]] | None = None
        self._read: Callable[[], Awaitable[Any]] | None = None

    # -- what a handler asks -------------------------------------------------------------

    def time_remaining(self) -> float | None:
        """Seconds until the call's deadline (``grpc-timeout``), None without one."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def invocation_metadata(self) -> Metadata:
        """The request's custom metadata (``-bin`` values as bytes)."""
        return decode_metadata(self._headers)

    def peer(self) -> str:
        """``ipv4:host:port`` (or ``ipv6:[host]:port``) of the client; ``unix:`` otherwise."""
        if self._client is None:
            return "unix:"
        host, port = self._client
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Iterable[tuple[str, str | bytes]] = (),
    ) -> NoReturn:
        """End the call with ``code`` (raises; never returns)."""
        if code is grpc.StatusCode.OK:
            raise ValueError("abort with StatusCode.OK")
        raise AbortError(code, details, trailing_metadata or self._trailing)

    def set_code(self, code: grpc.StatusCode) -> None:
        """The status of a handler that returns normally."""
        self._code = code

    def set_details(self, details: str) -> None:
        """The status message of a handler that returns normally."""
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        """What ``set_code`` set."""
        return self._code

    def details(self) -> str:
        """What ``set_details`` set."""
        return self._details

    async def send_initial_metadata(self, metadata: Iterable[tuple[str, str | bytes]]) -> None:
        """Headers to send with the response's start (before any message)."""
        if self._initial_sent:
            raise RuntimeError("initial metadata already sent")
        self._initial = (*self._initial, *metadata)

    def set_trailing_metadata(self, metadata: Iterable[tuple[str, str | bytes]]) -> None:
        """Metadata to send with the status."""
        self._trailing = tuple(metadata)

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """What ``set_trailing_metadata`` set."""
        return self._trailing

    async def write(self, message: Any) -> None:
        """Send one response of a server-streaming call."""
        if self._write is None:
            raise RuntimeError("write() is for server-streaming calls")
        await self._write(message)

    async def read(self) -> Any:
        """The next request of a client-streaming call (``grpc.aio.EOF`` at its end)."""
        if self._read is None:
            raise RuntimeError("read() is for client-streaming calls")
        return await self._read()

    def done(self) -> bool:
        """Whether the call has ended."""
        return self._done

    def cancelled(self) -> bool:
        """Whether the call ended by cancellation or deadline (as far as this side knows)."""
        return self._done and self._code is grpc.StatusCode.CANCELLED

    def disable_next_message_compression(self) -> None:
        """Responses are never compressed here; kept for grpc.aio compatibility."""

    def set_compression(self, compression: Any) -> None:
        """Responses are never compressed here; kept for grpc.aio compatibility."""
