"""``ModelStreamInfer``: each message served like a unary call, answered in completion order.

Messages on one stream run concurrently (each holds its own in-flight slot). A failed message
gets a response with ``error_message`` set and an ``infer_response`` carrying only the model
name and id; the stream stays open. It ends once the client half-closed and every answer is
written; a cancelled stream cancels its queued requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

from reactantserver.core.errors import ReactantError, status_message
from reactantserver.core.protocol import grpc_service_pb2 as pb

__all__ = ["Serve", "stream_infer"]

Serve: TypeAlias = Callable[[pb.ModelInferRequest, float | None], Awaitable[pb.ModelInferResponse]]
"""How one message is served, given the stream's time remaining (``InferenceService.serve``)."""


async def _answer(
    serve: Serve, message: pb.ModelInferRequest, time_remaining: float | None
) -> pb.ModelStreamInferResponse:
    try:
        response = await serve(message, time_remaining)
    except ReactantError as exc:
        return pb.ModelStreamInferResponse(
            error_message=status_message(exc),
            infer_response=pb.ModelInferResponse(model_name=message.model_name, id=message.id),
        )
    return pb.ModelStreamInferResponse(infer_response=response)


async def stream_infer(
    serve: Serve,
    requests: AsyncIterable[pb.ModelInferRequest],
    context: Any,
) -> AsyncIterator[pb.ModelStreamInferResponse]:
    """The stream handler: read, serve concurrently, yield answers as they complete."""
    answers: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
    running: set[asyncio.Task[None]] = set()

    async def serve_one(message: pb.ModelInferRequest) -> None:
        await answers.put(await _answer(serve, message, context.time_remaining()))

    async def read() -> None:
        try:
            async for message in requests:
                task = asyncio.create_task(serve_one(message))
                running.add(task)
                task.add_done_callback(running.discard)
            while running:
                await asyncio.wait(set(running))
        finally:
            await answers.put(None)

    reader = asyncio.create_task(read())
    try:
        while (answer := await answers.get()) is not None:
            yield answer
        await reader
    finally:
        for task in (reader, *running):
            task.cancel()
        for task in (reader, *running):
            with contextlib.suppress(asyncio.CancelledError):
                await task
