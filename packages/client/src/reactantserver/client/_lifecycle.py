"""Registering explicit regions, and ``shutdown()``: leave every server as we found it."""

from __future__ import annotations

import atexit
import contextlib
import logging
import time

import grpc

from reactantserver.client._channels import CHANNELS, ChannelKey
from reactantserver.client._flow import run_sync
from reactantserver.client._model import MAX_RECV_ENV, MAX_SEND_ENV, KServeModel, message_limit
from reactantserver.client._region import ShmRegion
from reactantserver.client._staging import live_pools
from reactantserver.client._transport import (
    ENDPOINTS,
    Registration,
    register_flow,
    unregister_flow,
)
from reactantserver.client._url import parse_url

__all__ = ["SHUTDOWN_JOIN_S", "register_region", "shutdown", "unregister_region"]

_log = logging.getLogger("reactantserver.client")

SHUTDOWN_JOIN_S = 1.0
"""``shutdown`` waits this long, in all, for re-probe threads (a hung probe is abandoned)."""
_UNREGISTER_TIMEOUT_S = 1.0


def _key(model_or_url: KServeModel | str) -> ChannelKey:
    if isinstance(model_or_url, KServeModel):
        return model_or_url.key
    return ChannelKey(
        parse_url(model_or_url),
        message_limit(None, MAX_SEND_ENV),
        message_limit(None, MAX_RECV_ENV),
    )


def register_region(
    model_or_url: KServeModel | str,
    region: ShmRegion,
    name: str | None = None,
    *,
    offset: int = 0,
    byte_size: int | None = None,
    timeout: float = 10.0,
) -> None:
    """Register ``region`` (or ``byte_size`` bytes of it from ``offset``) at a server.

    ``name`` defaults to the region's name and becomes its name for ``InferInput.from_shm``.
    The registration is remembered: if the server restarts and forgets it, the next request
    that uses it registers it again once.
    """
    size = region.nbytes - offset if byte_size is None else byte_size
    if offset < 0 or size < 1 or offset + size > region.nbytes:
        raise ValueError(f"{size} bytes at offset {offset} do not fit {region!r}")
    if name is not None:
        region.name = name
    registration = Registration(region.name, region.key, offset, size)
    run_sync(register_flow(_key(model_or_url), registration, timeout))


def unregister_region(
    model_or_url: KServeModel | str, region: ShmRegion | str, *, timeout: float = 10.0
) -> None:
    """Unregister a region (by object or name) at a server; unknown names are fine."""
    name = region if isinstance(region, str) else region.name
    run_sync(unregister_flow(_key(model_or_url), name, timeout))


def shutdown() -> None:
    """Unregister staging pools everywhere, unlink them, stop re-probes, close channels.

    Also runs at exit. Returns within about a second per unreachable server even if a
    re-probe hangs. The client stays usable: later calls start afresh.
    """
    endpoints = ENDPOINTS.drain()
    pools = live_pools()
    threads = []
    for endpoint in endpoints:
        threads.extend(endpoint.stop())
        for key, registration in endpoint.registrations():
            if not registration.pool:
                continue  # explicit regions belong to the caller
            try:
                run_sync(unregister_flow(key, registration.name, _UNREGISTER_TIMEOUT_S))
            except grpc.RpcError as error:
                _log.debug("could not unregister %s at %s: %s", registration.name, key, error)
    for pool in pools:
        with contextlib.suppress(Exception):
            pool.close()
    # Closing the channels first cancels a re-probe stuck in its RPC, so the joins are short.
    CHANNELS.close_all()
    stop_at = time.monotonic() + SHUTDOWN_JOIN_S
    for thread in threads:
        thread.join(max(0.0, stop_at - time.monotonic()))


atexit.register(shutdown)
