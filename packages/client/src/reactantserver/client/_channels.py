"""gRPC channels, one per (endpoint, TLS settings, message limits), and per event loop for aio.

Every :class:`~reactantserver.client.KServeModel` on the same endpoint shares one blocking
channel and, per running loop, one ``grpc.aio`` channel. A channel is closed when the last
model using it closes, or by :func:`~reactantserver.client.shutdown`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import attrs
import grpc
import grpc.aio

from reactantserver.client._url import Target

__all__ = ["CHANNELS", "KEEPALIVE_OPTIONS", "ChannelKey", "Channels"]

KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
"""Ping every 30 s with a 20 s timeout, even when no call is in flight."""


@attrs.frozen
class ChannelKey:
    """Everything that makes two channels different; models with equal keys share one."""

    target: Target
    max_send_message_length: int
    max_receive_message_length: int
    root_certificates: bytes | None = None
    private_key: bytes | None = attrs.field(default=None, repr=False)
    certificate_chain: bytes | None = None

    @property
    def endpoint(self) -> str:
        """``host:port``, what server-side state (registrations) is keyed by."""
        return self.target.address

    def options(self) -> list[tuple[str, int]]:
        """Channel arguments: message limits and keepalive."""
        return [
            ("grpc.max_send_message_length", self.max_send_message_length),
            ("grpc.max_receive_message_length", self.max_receive_message_length),
            *KEEPALIVE_OPTIONS,
        ]

    def credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials for ``grpcs://`` targets, ``None`` for plain ones."""
        if not self.target.tls:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )


class _Stubs:
    """A channel and its unary callables by method path (built once each)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._calls: dict[str, Any] = {}

    def unary(
        self, path: str, serialize: Callable[[Any], bytes], parse: Callable[[bytes], Any]
    ) -> Any:
        call = self._calls.get(path)
        if call is None:
            call = self.channel.unary_unary(
                path, request_serializer=serialize, response_deserializer=parse
            )
            self._calls[path] = call
        return call


class Channels:
    """The process's channel cache (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users: dict[ChannelKey, int] = {}
        self._sync: dict[ChannelKey, _Stubs] = {}
        self._aio: dict[tuple[ChannelKey, asyncio.AbstractEventLoop], _Stubs] = {}

    def attach(self, key: ChannelKey) -> None:
        """Count one more user (a model) of ``key``'s channels."""
        with self._lock:
            self._users[key] = self._users.get(key, 0) + 1

    def detach(self, key: ChannelKey) -> None:
        """Count one user fewer; the last one closes ``key``'s channels."""
        with self._lock:
            left = self._users.get(key, 0) - 1
            if left > 0:
                self._users[key] = left
                return
            self._users.pop(key, None)
            doomed_sync = self._sync.pop(key, None)
            doomed_aio = [k for k in self._aio if k[0] == key]
            doomed = [(loop, self._aio.pop((k, loop))) for k, loop in doomed_aio]
        if doomed_sync is not None:
            doomed_sync.channel.close()
        for loop, stubs in doomed:
            _close_aio(loop, stubs.channel)

    def blocking(self, key: ChannelKey) -> _Stubs:
        """The blocking channel for ``key``."""
        with self._lock:
            stubs = self._sync.get(key)
            if stubs is None:
                credentials = key.credentials()
                target, options = key.target.address, key.options()
                channel = (
                    grpc.insecure_channel(target, options=options)
                    if credentials is None
                    else grpc.secure_channel(target, credentials, options=options)
                )
                stubs = self._sync[key] = _Stubs(channel)
            return stubs

    def for_loop(self, key: ChannelKey) -> _Stubs:
        """The ``grpc.aio`` channel for ``key`` bound to the running loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            stale = [k for k in self._aio if k[1].is_closed()]
            for k in stale:
                del self._aio[k]
            stubs = self._aio.get((key, loop))
            if stubs is None:
                credentials = key.credentials()
                target, options = key.target.address, key.options()
                channel = (
                    grpc.aio.insecure_channel(target, options=options)
                    if credentials is None
                    else grpc.aio.secure_channel(target, credentials, options=options)
                )
                stubs = self._aio[(key, loop)] = _Stubs(channel)
            return stubs

    def close_all(self) -> None:
        """Close every channel (``shutdown``); later calls open new ones."""
        with self._lock:
            sync, aio = list(self._sync.values()), list(self._aio.items())
            self._sync.clear()
            self._aio.clear()
            self._users.clear()
        for stubs in sync:
            stubs.channel.close()
        for (_, loop), stubs in aio:
            _close_aio(loop, stubs.channel)


def _close_aio(loop: asyncio.AbstractEventLoop, channel: grpc.aio.Channel) -> None:
    # An aio channel closes on its own loop; from elsewhere it can only be scheduled there.
    if loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        loop.create_task(channel.close())
    elif loop.is_running():
        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(channel.close(), loop)
    else:
        with contextlib.suppress(RuntimeError):
            loop.run_until_complete(channel.close())


CHANNELS = Channels()
"""The process-wide cache."""
