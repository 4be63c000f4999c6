"""Streaming calls: the response side written message by message, the request side read.

:class:`Writer` sends the response's start with the first message; :class:`Requests` turns the
request body's chunks into messages, as an async iterator and as ``context.read()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from reactantserver.core.front._context import AbortError, RpcContext
from reactantserver.core.front._methods import Method
from reactantserver.core.front._responses import Receive, Send, send_message, start_message
from reactantserver.core.front._wire import Deframer, FrameError

__all__ = ["Requests", "Writer", "respond"]


class Writer:
    """The response side of a streaming call: start once, then one message per write."""

    __slots__ = ("context", "max_send", "send", "serialize", "started")

    def __init__(
        self,
        send: Send,
        context: RpcContext,
        serialize: Callable[[Any], bytes] | None,
        max_send: int,
    ) -> None:
        self.send = send
        self.context = context
        self.serialize = serialize
        self.max_send = max_send
        self.started = False

    async def write(self, message: Any) -> None:
        """Send one response message (the start first, if not sent yet)."""
        body = message if self.serialize is None else self.serialize(message)
        if len(body) > self.max_send:
            raise AbortError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(body)} vs. {self.max_send})",
            )
        if not self.started:
            self.context._initial_sent = True
            await self.send(start_message(self.context._initial))
            self.started = True
        await send_message(self.send, body, more=True)


class Requests:
    """The request side of a client-streaming call, as an async iterator and ``read()``."""

    def __init__(self, receive: Receive, deframer: Deframer, method: Method) -> None:
        self._receive = receive
        self._deframer = deframer
        self._deserialize = method.deserialize
        self._ready: list[bytes] = []
        self._ended = False

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        while not self._ready:
            if self._ended:
                raise StopAsyncIteration
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise asyncio.CancelledError
            self._ready = self._deframer.feed(message.get("body", b""))
            if not message.get("more_body"):
                self._ended = True
                if self._deframer.pending:
                    raise FrameError(
                        grpc.StatusCode.INTERNAL, "the request stream ended inside a message"
                    )
        payload = self._ready.pop(0)
        return payload if self._deserialize is None else self._deserialize(payload)

    async def read(self) -> Any:
        """The next request, or ``grpc.aio.EOF`` after the last."""
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            return grpc.aio.EOF


async def respond(method: Method, result: Any, writer: Writer) -> None:
    """Write what a streaming-call handler produced: generated messages or one response."""
    if method.response_streaming:
        if hasattr(result, "__aiter__"):
            async for response in result:
                await writer.write(response)
        elif asyncio.iscoroutine(result):
            await result  # the handler writes through context.write
        return
    if asyncio.iscoroutine(result):
        result = await result
    if result is not None:
        await writer.write(result)
