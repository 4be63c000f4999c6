"""The gateway's end of the forwarding lane (:mod:`reactantserver.core.lane`).

One connection per worker carries every forwarded ``ModelInfer`` body concurrently; each call
has an id, its own deadline and a ``CANCEL`` frame when the caller gives up. Failures read like
the gRPC channel's so that the proxy's status table applies unchanged: a lost or refused
connection is ``UNAVAILABLE``, an expired timeout ``DEADLINE_EXCEEDED``, and a worker's status
is passed through with its message::

    lane = await LaneClient.connect(advert, max_recv=512 << 20, label="w0")
    body = await lane.call(request_bytes, timeout=2.5)    # or LaneError(code, details)
    lane.close()
"""

from __future__ import annotations

import asyncio
import itertools
from typing import cast

import grpc

from reactantserver.core.lane import (
    RESPONSE_HEADER,
    Advert,
    FrameReader,
    Kind,
    oversize_message,
    request_frame,
    traced_body,
)

__all__ = ["LaneClient", "LaneError"]

#: How long a connect and its ``HELLO`` may take before the lane is given up (gRPC is used).
CONNECT_TIMEOUT_S = 2.0

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class LaneError(Exception):
    """A call's non-OK outcome, shaped like ``grpc.aio.AioRpcError``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        """The status."""
        return self._code

    def details(self) -> str:
        """The message."""
        return self._details


class LaneClient(asyncio.Protocol):
    """One open, greeted lane connection to a worker."""

    def __init__(self, advert: Advert, label: str, *, max_recv: int) -> None:
        self.advert = advert
        self.label = label
        self._max_recv = max_recv
        self._reader = FrameReader(RESPONSE_HEADER, limit=max_recv)
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._ids = itertools.count(1)
        self._lost = False

    @classmethod
    async def connect(cls, advert: Advert, *, label: str, max_recv: int) -> LaneClient:
        """Connect and greet (``OSError`` or ``TimeoutError`` when that is not possible)."""
        loop = asyncio.get_running_loop()
        _, lane = await asyncio.wait_for(
            loop.create_unix_connection(lambda: cls(advert, label, max_recv=max_recv), advert.path),
            CONNECT_TIMEOUT_S,
        )
        try:
            await lane._exchange(Kind.HELLO, advert.token.encode(), CONNECT_TIMEOUT_S)
        except LaneError as error:
            lane.close()
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                message = f"lane did not answer the greeting in {CONNECT_TIMEOUT_S} s"
                raise OSError(message) from None
            raise OSError(f"lane refused the greeting: {error.details()}") from None
        except BaseException:
            lane.close()
            raise
        return lane

    @property
    def open(self) -> bool:
        """Whether calls can still be sent."""
        return not self._lost and self._transport is not None

    async def call(
        self, body: bytes, *, timeout: float | None, trace: tuple[tuple[str, str], ...] = ()
    ) -> bytes:
        """Forward one ``ModelInfer`` body; its response bytes, or :class:`LaneError`.

        ``timeout`` bounds the wait here and travels with the body, as a gRPC deadline does;
        a ``trace`` context (``traceparent``, ``tracestate``) travels in a traced frame.
        """
        if trace:
            return await self._exchange(Kind.TRACED_INFER, traced_body(trace, body), timeout)
        return await self._exchange(Kind.INFER, body, timeout)

    async def _exchange(self, kind: Kind, body: bytes, timeout: float | None) -> bytes:
        if not self.open:
            raise LaneError(grpc.StatusCode.UNAVAILABLE, f"lane to worker {self.label} is closed")
        call_id = next(self._ids) & 0xFFFFFFFF
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        self._pending[call_id] = future
        assert self._transport is not None
        self._transport.write(request_frame(call_id, kind, body, timeout))
        expiry = None if timeout is None else loop.call_later(timeout, self._expire, call_id)
        try:
            return await future
        except asyncio.CancelledError:
            self._withdraw(call_id)
            raise
        finally:
            if expiry is not None:
                expiry.cancel()

    def _expire(self, call_id: int) -> None:
        future = self._withdraw(call_id)
        if future is not None and not future.done():
            future.set_exception(LaneError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def _withdraw(self, call_id: int) -> asyncio.Future[bytes] | None:
        """Forget a call the caller gave up on and tell the worker to stop it."""
        future = self._pending.pop(call_id, None)
        if future is not None and self.open:
            assert self._transport is not None
            self._transport.write(request_frame(call_id, Kind.CANCEL))
        return future

    def close(self) -> None:
        """Close the connection; calls in flight fail with ``UNAVAILABLE``."""
        if self._transport is not None:
            self._transport.close()
        self._fail_all("lane closed by the gateway")

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport the lane writes calls to."""
        # uvloop's transports implement the interface without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail every call still waiting for an answer."""
        reason = f": {exc}" if exc is not None else ""
        self._fail_all(f"connection to worker {self.label} lost{reason}")

    def data_received(self, data: bytes) -> None:
        """Resolve each call whose answer arrived complete in ``data``."""
        for fields, body in self._reader.feed(data):
            length, call_id, status = int(fields[0]), int(fields[1]), int(fields[2])
            future = self._pending.pop(call_id, None)
            if future is None or future.done():
                continue  # cancelled or timed out meanwhile
            if body is None:
                message = oversize_message("Received", length, self._max_recv)
                future.set_exception(LaneError(grpc.StatusCode.RESOURCE_EXHAUSTED, message))
            elif status == 0:
                future.set_result(body)
            else:
                code = _CODES.get(status, grpc.StatusCode.UNKNOWN)
                future.set_exception(LaneError(code, body.decode("utf-8", "replace")))

    def _fail_all(self, message: str) -> None:
        self._lost = True
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(LaneError(grpc.StatusCode.UNAVAILABLE, message))
