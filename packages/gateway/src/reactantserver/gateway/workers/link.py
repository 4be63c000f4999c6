"""The gateway's link to each worker: one ``grpc.aio`` channel, raw-byte calls, two gates.

A :class:`WorkerLink` owns the channel to one worker and hands out callables that send and
receive **bytes** (no serializer on either side), so a forwarded ``ModelInfer`` body is never
decoded. Two gates bound what reaches the worker:

- the *outbound slots*: at most ``max_concurrent_streams`` calls in flight (excess waits,
  bounded by the request's own deadline);
- the *register gate*: while a shared-memory register/unregister is being fanned out to this
  worker, new inferences to it wait, so a request never races its region's registration.

A call that times out in the prober resets the channel (:meth:`WorkerLink.reset`).

``ModelInfer`` bodies go through :meth:`WorkerLink.infer`: over the worker's forwarding lane
(:mod:`reactantserver.core.lane`) when the prober found one it could reach, else over gRPC::

    link = WorkerLink("127.0.0.1:8080", "w0", settings)
    async with link.slot(deadline_s):
        body = await link.infer(request_bytes, timeout=remaining_s)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import grpc
import grpc.aio
from google.protobuf.message import Message

from reactantserver.core.lane import ADVERT_METADATA_KEY, Advert, parse_advert
from reactantserver.core.protocol import MODEL_INFER, SERVER_READY
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.gateway.workers.lane import LaneClient

__all__ = [
    "COMPACT_MEMORY",
    "ChannelSettings",
    "RegisterGate",
    "WorkerLink",
    "call_message",
    "compact_deadline",
]

_log = logging.getLogger("reactantserver.gateway")

_M = TypeVar("_M", bound=Message)

#: ``WorkerControl.CompactMemory``, which the gateway fans out and lpt compaction sends.
COMPACT_MEMORY = "/reactantserver.control.v1.WorkerControl/CompactMemory"
#: Deadline floor of a CompactMemory call (reloading many models takes a while).
_COMPACT_DEADLINE_FLOOR_S = 300.0

#: Ping idle workers every 30 s (20 s to answer) so a dead peer is noticed between probes.
_KEEPALIVE = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)


@attrs.frozen
class ChannelSettings:
    """How the gateway dials workers: message limits, slots and optional (m)TLS material."""

    max_send_msg_bytes: int
    max_recv_msg_bytes: int
    max_concurrent_streams: int
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    lane: bool = True
    """Use a worker's forwarding lane when it advertises one (never with TLS to workers)."""

    @property
    def use_lane(self) -> bool:
        """Whether lanes may be used: asked for, and no TLS configured towards workers."""
        return self.lane and not (self.ca_file or self.cert_file)

    def options(self) -> list[tuple[str, int]]:
        """Channel arguments."""
        return [
            ("grpc.max_send_message_length", self.max_send_msg_bytes),
            ("grpc.max_receive_message_length", self.max_recv_msg_bytes),
            *_KEEPALIVE,
        ]

    def credentials(self) -> grpc.ChannelCredentials | None:
        """TLS towards workers when a CA (or client certificate) is configured."""
        if not (self.ca_file or self.cert_file):
            return None

        def read(path: str) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )


class RegisterGate:
    """Inference waits while any shared-memory (un)registration to the worker is in flight."""

    def __init__(self) -> None:
        self._holders = 0
        self._open = asyncio.Event()
        self._open.set()

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Close the gate for the duration of the block (nested holders are counted)."""
        self._holders += 1
        self._open.clear()
        try:
            yield
        finally:
            self._holders -= 1
            if self._holders == 0:
                self._open.set()

    async def passed(self) -> None:
        """Return once no registration is in flight."""
        if not self._open.is_set():
            await self._open.wait()


class WorkerLink:
    """One worker: its channel, its raw-byte callables, its slots and its register gate."""

    def __init__(self, url: str, label: str, settings: ChannelSettings) -> None:
        self.url = url
        self.label = label
        self.settings = settings
        self.gate = RegisterGate()
        self._slots = asyncio.Semaphore(settings.max_concurrent_streams)
        self._channel: grpc.aio.Channel | None = None
        self._calls: dict[str, Any] = {}
        #: The open forwarding lane, if any (set by :meth:`adopt_lane`).
        self.lane: LaneClient | None = None
        self._unreachable: Advert | None = None
        #: Last prober verdict; ``False`` until the first successful ``ServerReady``.
        self.ready = False
        #: Whether this worker ever answered a probe (for the wedge exit).
        self.ever_answered = False

    @property
    def channel(self) -> grpc.aio.Channel:
        """The channel, dialled on first use (lazily, so it belongs to the running loop)."""
        if self._channel is None:
            credentials = self.settings.credentials()
            options = self.settings.options()
            if credentials is None:
                self._channel = grpc.aio.insecure_channel(self.url, options=options)
            else:
                self._channel = grpc.aio.secure_channel(self.url, credentials, options=options)
            self._calls = {}
        return self._channel

    def _callable(self, kind: str, path: str) -> Any:
        channel = self.channel
        key = f"{kind}:{path}"
        call = self._calls.get(key)
        if call is None:
            factory = channel.unary_unary if kind == "unary" else channel.stream_stream
            call = factory(path)  # no (de)serializers: bytes in, bytes out
            self._calls[key] = call
        return call

    async def call(
        self, path: str, body: bytes, *, timeout: float | None, metadata: Any = None
    ) -> bytes:
        """Send ``body`` to the method at ``path``; the response bytes, or ``AioRpcError``."""
        result: bytes = await self._callable("unary", path)(
            body, timeout=timeout, metadata=metadata
        )
        return result

    async def infer(
        self, body: bytes, *, timeout: float | None, trace: tuple[tuple[str, str], ...] = ()
    ) -> bytes:
        """Forward a ``ModelInfer`` body: over the lane when open, else over gRPC.

        ``trace`` is the W3C trace context (``traceparent``, ``tracestate``) to send along:
        gRPC metadata, or the lane's traced frame. Raises ``AioRpcError`` or
        :class:`~reactantserver.gateway.workers.lane.LaneError`; both have ``code()`` and
        ``details()``.
        """
        lane = self.lane
        if lane is not None and lane.open:
            return await lane.call(body, timeout=timeout, trace=trace)
        return await self.call(MODEL_INFER, body, timeout=timeout, metadata=trace or None)

    async def probe_ready(self, *, timeout: float) -> tuple[pb.ServerReadyResponse, Advert | None]:
        """``ServerReady``, with the lane advert from the answer's initial metadata."""
        call = self._callable("unary", SERVER_READY)(
            pb.ServerReadyRequest().SerializeToString(), timeout=timeout
        )
        answer = pb.ServerReadyResponse.FromString(await call)
        advert = None
        for key, value in await call.initial_metadata() or ():
            if key == ADVERT_METADATA_KEY:
                advert = parse_advert(value)
        return answer, advert

    async def adopt_lane(self, advert: Advert | None) -> None:
        """Follow the worker's advert: connect to a new lane, drop one no longer offered.

        A lane that cannot be reached (another host, another user) is not retried until
        the worker advertises a different one; gRPC serves meanwhile.
        """
        if not self.settings.use_lane:
            return
        current = self.lane
        if current is not None and current.open and current.advert == advert:
            return
        self._drop_lane()
        if advert is None or advert == self._unreachable:
            return
        try:
            self.lane = await LaneClient.connect(
                advert, label=self.label, max_recv=self.settings.max_recv_msg_bytes
            )
        except (OSError, TimeoutError) as exc:
            self._unreachable = advert
            _log.info("worker %s: forwarding lane not reachable, using gRPC: %s", self.label, exc)
            return
        _log.info("worker %s: forwarding over its lane %s", self.label, advert.path)

    def _drop_lane(self) -> None:
        lane, self.lane = self.lane, None
        if lane is not None:
            lane.close()

    @contextlib.asynccontextmanager
    async def slot(self, timeout: float | None) -> AsyncIterator[None]:
        """Hold one outbound slot; ``TimeoutError`` if none frees up within ``timeout``."""
        if timeout is None:
            await self._slots.acquire()
        else:
            await asyncio.wait_for(self._slots.acquire(), max(timeout, 0.0))
        try:
            yield
        finally:
            self._slots.release()

    async def reset(self) -> None:
        """Close the channel and the lane (a hung call made them suspect).

        The next call dials afresh; the next probe round reopens the lane.
        """
        self._drop_lane()
        channel, self._channel = self._channel, None
        self._calls = {}
        if channel is not None:
            _log.warning("worker %s: resetting its channel", self.label)
            await channel.close(grace=None)

    async def close(self) -> None:
        """Close the channel and the lane for good (gateway shutdown)."""
        self._drop_lane()
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close(grace=None)


async def call_message(
    link: WorkerLink,
    path: str,
    request: Message,
    parse: Callable[[bytes], _M],
    *,
    timeout: float,
) -> _M:
    """One typed call over the raw link (fan-out and probes decode what they merge)."""
    return parse(await link.call(path, request.SerializeToString(), timeout=timeout))


def compact_deadline(request_timeout_seconds: float) -> float:
    """Deadline of a CompactMemory call: ``max(request_timeout_seconds, 300 s)``."""
    return max(request_timeout_seconds, _COMPACT_DEADLINE_FLOOR_S)
