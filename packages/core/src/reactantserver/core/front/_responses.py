"""The ASGI messages of a gRPC response: the start, framed messages, the status trailers.

A call that ends before its response started (a refusal at the admission gate, an unknown
method, a handler that aborts) is answered Trailers-Only, as gRPC's HTTP/2 protocol has it:
the status in the one header block that ends the stream, two ``send`` calls instead of three.

The constant messages are built once and reused for every plain call (the server copies what
it sends); calls with metadata or a status other than OK get their own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import grpc

from reactantserver.core.front._wire import encode_metadata, frame, frame_prefix, status_trailers

__all__ = [
    "END_BODY",
    "ASGIApp",
    "Receive",
    "Scope",
    "Send",
    "finish",
    "send_message",
    "start_message",
    "trailers_message",
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_GRPC = b"application/grpc"
_START: dict[str, Any] = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", _GRPC)],
    "trailers": True,
}
END_BODY: dict[str, Any] = {"type": "http.response.body", "body": b"", "more_body": False}
_OK: dict[str, Any] = {
    "type": "http.response.trailers",
    "headers": [(b"grpc-status", b"0")],
    "more_trailers": False,
}
#: Above this size a response goes out as prefix and payload (no copy of the payload).
_COPY_LIMIT = 64 * 1024


def start_message(initial: tuple[tuple[str, str | bytes], ...]) -> dict[str, Any]:
    """The response's start: status 200, gRPC content type, initial metadata."""
    if not initial:
        return _START
    return {**_START, "headers": [(b"content-type", _GRPC), *encode_metadata(initial)]}


def trailers_message(
    code: grpc.StatusCode, details: str, metadata: tuple[tuple[str, str | bytes], ...]
) -> dict[str, Any]:
    """The trailers that end the call with ``code``."""
    if code is grpc.StatusCode.OK and not details and not metadata:
        return _OK
    return {
        "type": "http.response.trailers",
        "headers": status_trailers(code, details, metadata),
        "more_trailers": False,
    }


async def send_message(send: Send, body: bytes, *, more: bool) -> None:
    """One framed message as the body (two parts when large, so it is not copied)."""
    if len(body) <= _COPY_LIMIT:
        await send({"type": "http.response.body", "body": frame(body), "more_body": more})
        return
    await send({"type": "http.response.body", "body": frame_prefix(len(body)), "more_body": True})
    await send({"type": "http.response.body", "body": body, "more_body": more})


async def finish(
    send: Send,
    started: bool,
    code: grpc.StatusCode,
    details: str,
    metadata: tuple[tuple[str, str | bytes], ...],
) -> None:
    """End a call with a status (after the response's start if it was not sent yet)."""
    if not started:
        # gRPC's Trailers-Only response: the status in the one header block that ends it.
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", _GRPC), *status_trailers(code, details, metadata)],
                "trailers": False,
            }
        )
        await send(END_BODY)
        return
    await send(END_BODY)
    await send(trailers_message(code, details, metadata))
