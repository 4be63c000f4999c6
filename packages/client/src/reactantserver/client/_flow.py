"""One source of truth for sync and async: client logic as generators of I/O operations.

The retry loop, shared-memory negotiation and stale-registration recovery are written once,
as generators that *yield* what they need done (:class:`Unary`, :class:`Sleep`,
:class:`Exclusive`) and receive the result. Two small drivers run them: :func:`run_sync` on a
blocking channel and :func:`run_async` on the running loop's ``grpc.aio`` channel::

    def ready(key: ChannelKey) -> Flow[bool]:
        reply = yield Unary(key, INFERENCE_METHODS["ServerReady"], pb.ServerReadyRequest(), 5.0)
        return reply.ready

    run_sync(ready(key))            # or: await run_async(ready(key))

A failed operation is thrown into the generator at its ``yield``, so flows use ordinary
``try``/``except``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, TypeAlias, TypeVar

import attrs
from google.protobuf.message import Message

from reactantserver.client._channels import CHANNELS, ChannelKey
from reactantserver.core.protocol import InferenceMethod

__all__ = ["Exclusive", "Flow", "Guard", "Op", "Sleep", "Unary", "run_async", "run_sync"]

T = TypeVar("T")


@attrs.frozen
class Unary:
    """Call ``method`` on ``key``'s endpoint; the result is the response message."""

    key: ChannelKey
    method: InferenceMethod
    request: Message
    timeout: float | None


@attrs.frozen
class Sleep:
    """Wait ``seconds`` (blocking, or ``asyncio.sleep`` on the loop)."""

    seconds: float


class Guard:
    """Mutual exclusion for :class:`Exclusive`: a thread lock, plus one asyncio lock per loop."""

    def __init__(self) -> None:
        self.thread_lock = threading.Lock()
        self._loop_locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        self._mutex = threading.Lock()

    def loop_lock(self) -> asyncio.Lock:
        """The asyncio lock of the running loop."""
        loop = asyncio.get_running_loop()
        with self._mutex:
            for old in [lp for lp in self._loop_locks if lp.is_closed()]:
                del self._loop_locks[old]
            lock = self._loop_locks.get(loop)
            if lock is None:
                lock = self._loop_locks[loop] = asyncio.Lock()
            return lock


@attrs.frozen
class Exclusive:
    """Run the flow ``body()`` while holding ``guard``; the result is what it returns."""

    guard: Guard
    body: Callable[[], Generator[Any, Any, Any]]


Op: TypeAlias = Unary | Sleep | Exclusive
Flow: TypeAlias = Generator[Op, Any, T]


def run_sync(flow: Flow[T]) -> T:
    """Drive ``flow`` to completion on blocking channels; its return value."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = flow.send(value) if error is None else flow.throw(error)
        except StopIteration as stop:
            result: T = stop.value
            return result
        value, error = None, None
        try:
            value = _execute_sync(op)
        except Exception as exc:
            error = exc


def _execute_sync(op: Op) -> Any:
    if isinstance(op, Unary):
        stubs = CHANNELS.blocking(op.key)
        call = stubs.unary(
            op.method.path, op.method.request.SerializeToString, op.method.response.FromString
        )
        return call(op.request, timeout=op.timeout)
    if isinstance(op, Sleep):
        time.sleep(op.seconds)
        return None
    with op.guard.thread_lock:
        return run_sync(op.body())


async def run_async(flow: Flow[T]) -> T:
    """Drive ``flow`` to completion on the running loop's aio channels; its return value."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = flow.send(value) if error is None else flow.throw(error)
        except StopIteration as stop:
            result: T = stop.value
            return result
        value, error = None, None
        try:
            value = await _execute_async(op)
        except Exception as exc:
            error = exc


async def _execute_async(op: Op) -> Any:
    if isinstance(op, Unary):
        stubs = CHANNELS.for_loop(op.key)
        call = stubs.unary(
            op.method.path, op.method.request.SerializeToString, op.method.response.FromString
        )
        return await call(op.request, timeout=op.timeout)
    if isinstance(op, Sleep):
        await asyncio.sleep(op.seconds)
        return None
    async with op.guard.loop_lock():
        return await run_async(op.body())
