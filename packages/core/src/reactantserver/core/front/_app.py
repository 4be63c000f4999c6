"""The ASGI application that carries gRPC: one coroutine per call, no per-call task.

The native server (``h2corn``) does HTTP/2 and TLS in Rust and calls this application once
per stream with the request's headers; the application reads the framed request, runs the
registered handler on the event loop and writes the framed response and the status
trailers. A unary call costs three ``send`` calls and no extra task; the client resetting
the stream cancels the call's coroutine, and a ``grpc-timeout`` arms one timer that ends
the call with ``DEADLINE_EXCEEDED``. Requests that are not gRPC go to ``fallback`` (REST)
or get HTTP 415.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc

from reactantserver.core.front._context import AbortError, RpcContext
from reactantserver.core.front._methods import Method, MethodTable
from reactantserver.core.front._responses import (
    END_BODY,
    ASGIApp,
    Receive,
    Scope,
    Send,
    finish,
    send_message,
    start_message,
    trailers_message,
)
from reactantserver.core.front._streams import Requests, Writer, respond
from reactantserver.core.front._wire import HEADER_LEN, Deframer, FrameError, parse_timeout

__all__ = ["ASGIApp", "GrpcApp", "Receive", "Send"]

_log = logging.getLogger("reactantserver.front")
_GRPC = b"application/grpc"


class _Expired:
    """A call's deadline timer: cancels the call's coroutine and remembers that it did."""

    __slots__ = ("fired", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.fired = False

    def __call__(self) -> None:
        self.fired = True
        self.task.cancel()


class GrpcApp:
    """gRPC calls to the methods of a :class:`MethodTable`; anything else to ``fallback``."""

    def __init__(
        self,
        methods: MethodTable,
        *,
        max_recv_msg_bytes: int,
        max_send_msg_bytes: int,
        fallback: ASGIApp | None = None,
    ) -> None:
        self.methods = methods
        self.max_recv = max_recv_msg_bytes
        self.max_send = max_send_msg_bytes
        self.fallback = fallback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await _lifespan(receive, send)
            return
        content_type = timeout = encoding = None
        headers = scope["headers"]
        for name, value in headers:
            if name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b"grpc-encoding":
                encoding = value
        if content_type is None or not content_type.startswith(_GRPC):
            await self._not_grpc(scope, receive, send)
            return
        gate = self.methods.gates.get(scope["path"])
        if gate is not None and (refusal := gate()) is not None:
            # Refused before its request is parsed or its deadline armed: a flood costs
            # little. The body is still taken off the stream (usually one receive), so the
            # server ends it cleanly instead of resetting a stream the client is still writing.
            await _drain(receive)
            await finish(send, False, grpc.StatusCode.RESOURCE_EXHAUSTED, refusal, ())
            return
        seconds = None if timeout is None else parse_timeout(timeout)
        if seconds is None:
            context = RpcContext(headers, None, scope.get("client"))
            await self._dispatch(scope["path"], context, receive, send, encoding)
            return
        task = asyncio.current_task()
        assert task is not None
        expiry = _Expired(task)
        handle = asyncio.get_running_loop().call_later(seconds, expiry)
        context = RpcContext(headers, time.monotonic() + seconds, scope.get("client"))
        try:
            await self._dispatch(scope["path"], context, receive, send, encoding)
        except asyncio.CancelledError:
            if not expiry.fired:
                raise  # the client went away: nothing to answer
            task.uncancel()
            context._done = True
            await finish(send, False, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", ())
        finally:
            handle.cancel()

    async def _dispatch(
        self,
        path: str,
        context: RpcContext,
        receive: Receive,
        send: Send,
        encoding: bytes | None,
    ) -> None:
        method = self.methods.find(path)
        if method is None:
            await _drain(receive)
            await finish(send, False, grpc.StatusCode.UNIMPLEMENTED, "Method not found!", ())
        elif method.request_streaming or method.response_streaming:
            await self._streaming(method, context, receive, send, encoding)
        else:
            await self._unary(method, context, receive, send, encoding)

    # -- unary ---------------------------------------------------------------------------

    async def _unary(
        self,
        method: Method,
        context: RpcContext,
        receive: Receive,
        send: Send,
        encoding: bytes | None,
    ) -> None:
        try:
            payload = await self._one_message(receive, encoding)
            request = payload if method.deserialize is None else method.deserialize(payload)
            if method.is_coroutine:
                response = await method.behaviour(request, context)
            else:
                response = method.behaviour(request, context)
                if asyncio.iscoroutine(response):
                    response = await response
        except Exception as exc:
            context._done = True
            await finish(send, False, *_ending(method, exc))
            return
        context._done = True
        code = context._code
        if code is not None and code is not grpc.StatusCode.OK:
            await finish(send, False, code, context._details, context._trailing)
            return
        if response is None:
            await finish(
                send, False, grpc.StatusCode.INTERNAL, "the handler returned no response", ()
            )
            return
        body = response if method.serialize is None else method.serialize(response)
        if len(body) > self.max_send:
            await finish(
                send,
                False,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(body)} vs. {self.max_send})",
                (),
            )
            return
        await send(start_message(context._initial))
        await send_message(send, body, more=False)
        await send(trailers_message(grpc.StatusCode.OK, context._details, context._trailing))

    async def _one_message(self, receive: Receive, encoding: bytes | None) -> bytes:
        """The request of a unary call: exactly one message in the body."""
        message = await receive()
        body: bytes = message.get("body", b"")
        if message.get("more_body"):
            body = await self._rest_of_body(receive, body)
        if len(body) >= HEADER_LEN and body[0] == 0:
            length = int.from_bytes(body[1:HEADER_LEN], "big")
            if length > self.max_recv:
                raise _too_large(length, self.max_recv)
            if len(body) == HEADER_LEN + length:
                return body[HEADER_LEN:]
        deframer = Deframer(self.max_recv, encoding)
        messages = deframer.feed(body)
        if len(messages) != 1 or deframer.pending:
            raise FrameError(
                grpc.StatusCode.INTERNAL,
                f"a unary call carries exactly one request message (got {len(messages)})",
            )
        return messages[0]

    async def _rest_of_body(self, receive: Receive, first: bytes) -> bytes:
        chunks = [first]
        size = len(first)
        checked = False
        while True:
            if not checked and size >= HEADER_LEN:
                head = b"".join(chunks)[:HEADER_LEN]
                length = int.from_bytes(head[1:HEADER_LEN], "big")
                if length > self.max_recv:
                    raise _too_large(length, self.max_recv)
                checked = True
            message = await receive()
            if message["type"] == "http.disconnect":
                raise asyncio.CancelledError
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    # -- streaming -----------------------------------------------------------------------

    async def _streaming(
        self,
        method: Method,
        context: RpcContext,
        receive: Receive,
        send: Send,
        encoding: bytes | None,
    ) -> None:
        writer = Writer(send, context, method.serialize, self.max_send)
        context._write = writer.write
        try:
            if method.request_streaming:
                requests = Requests(receive, Deframer(self.max_recv, encoding), method)
                context._read = requests.read
                argument: Any = requests
            else:
                payload = await self._one_message(receive, encoding)
                argument = payload if method.deserialize is None else method.deserialize(payload)
            await respond(method, method.behaviour(argument, context), writer)
        except Exception as exc:
            context._done = True
            await finish(send, writer.started, *_ending(method, exc))
            return
        context._done = True
        code = context._code or grpc.StatusCode.OK
        if not writer.started:
            await send(start_message(context._initial))
            writer.started = True
        await send(END_BODY)
        await send(trailers_message(code, context._details, context._trailing))

    async def _not_grpc(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.fallback is not None:
            await self.fallback(scope, receive, send)
            return
        await _drain(receive)
        await send(
            {
                "type": "http.response.start",
                "status": 415,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")],
            }
        )
        await send(
            {
                "type": "http.response.body",
                "body": b"this port serves gRPC (content-type: application/grpc)\n",
            }
        )


def _ending(
    method: Method, exc: Exception
) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str | bytes], ...]]:
    """The status a handler's exception ends its call with (anything unexpected: UNKNOWN)."""
    if isinstance(exc, AbortError):
        return exc.code, exc.details, exc.trailing_metadata
    if isinstance(exc, FrameError):
        return exc.code, exc.details, ()
    _log.exception("unexpected error in %s", method.path)
    return grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}", ()


def _too_large(length: int, limit: int) -> FrameError:
    return FrameError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"Received message larger than max ({length} vs. {limit})",
    )


async def _drain(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            return


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
