"""Per-endpoint shared-memory state: registrations, the SHM-or-inline choice, recovery.

What a server knows about this process's regions is tracked per endpoint (``host:port``):

- every region this client registered there (pools and explicit regions), so a server that
  restarted and forgot them can be told again (one re-registration per failure wave: a
  generation counter coalesces concurrent failures);
- per staging pool, the transport chosen by the ``IsSameIPCNamespace`` probe, and whether the pool
is latched to inline after recovery failed, in which case one
  background thread re-probes every ``reprobe_interval`` seconds until SHM works again.

All server I/O is written as flows (see ``_flow``), so sync and async callers share it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable
from typing import Literal, TypeAlias

import attrs
import grpc

from reactantserver.client._channels import ChannelKey
from reactantserver.client._flow import Exclusive, Flow, Guard, Unary, run_sync
from reactantserver.client._staging import StagingPool
from reactantserver.client._status import status_code, status_details
from reactantserver.core.protocol import INFERENCE_METHODS
from reactantserver.core.protocol import grpc_service_pb2 as pb

__all__ = [
    "ENDPOINTS",
    "PROBE_TIMEOUT_S",
    "REPROBE_TIMEOUT_S",
    "Endpoint",
    "Endpoints",
    "Registration",
    "SharedMemoryMode",
    "is_stale",
    "register_flow",
    "unregister_flow",
]

_log = logging.getLogger("reactantserver.client")

SharedMemoryMode: TypeAlias = Literal["auto", "on", "off"]

PROBE_TIMEOUT_S = 10.0
"""Budget of the first ``IsSameIPCNamespace`` probe of a pool at an endpoint."""
REPROBE_TIMEOUT_S = 3.0
"""Budget of each background re-probe."""
STALE_MESSAGE = "unregistered shared memory region"

_REGISTER = INFERENCE_METHODS["SystemSharedMemoryRegister"]
_UNREGISTER = INFERENCE_METHODS["SystemSharedMemoryUnregister"]
_SAME_NAMESPACE = INFERENCE_METHODS["IsSameIPCNamespace"]


@attrs.frozen
class Registration:
    """A region as registered at a server: ``name`` -> ``key``, ``offset``, ``byte_size``."""

    name: str
    key: str
    offset: int
    byte_size: int
    pool: bool = False
    """A staging pool's (``shutdown`` removes those; explicit regions are the caller's)."""


def is_stale(error: BaseException) -> bool:
    """Whether ``error`` says the server no longer knows a region this request used."""
    if not isinstance(error, grpc.RpcError):
        return False
    code = status_code(error)
    return code is grpc.StatusCode.FAILED_PRECONDITION or STALE_MESSAGE in status_details(error)


def register_flow(key: ChannelKey, registration: Registration, timeout: float) -> Flow[None]:
    """Register ``registration`` at ``key``'s endpoint and remember it there."""
    yield Unary(
        key,
        _REGISTER,
        pb.SystemSharedMemoryRegisterRequest(
            name=registration.name,
            key=registration.key,
            offset=registration.offset,
            byte_size=registration.byte_size,
        ),
        timeout,
    )
    ENDPOINTS.of(key).remember(key, registration)


def unregister_flow(key: ChannelKey, name: str, timeout: float) -> Flow[None]:
    """Unregister ``name`` at ``key``'s endpoint and forget it there."""
    ENDPOINTS.of(key).forget(name)
    yield Unary(key, _UNREGISTER, pb.SystemSharedMemoryUnregisterRequest(name=name), timeout)


def _probe_flow(key: ChannelKey, pool: StagingPool, timeout: float) -> Flow[bool | None]:
    """``IsSameIPCNamespace(pool key)``: ``None`` when the server does not implement it."""
    try:
        reply = yield Unary(
            key, _SAME_NAMESPACE, pb.IsSameIPCNamespaceRequest(name=pool.shm_key or ""), timeout
        )
    except grpc.RpcError as error:
        if status_code(error) is grpc.StatusCode.UNIMPLEMENTED:
            return None
        raise
    return bool(reply.same)


def _pool_registration(pool: StagingPool) -> Registration:
    assert pool.shm_key is not None
    return Registration(pool.name, pool.shm_key, 0, pool.nbytes, pool=True)


def _attach_pool_flow(key: ChannelKey, pool: StagingPool, timeout: float) -> Flow[None]:
    # Best-effort unregister first: a previous process with the same name (pid reuse) or a
    # half-finished attempt must not leave a registration pointing elsewhere.
    with contextlib.suppress(grpc.RpcError):
        yield from unregister_flow(key, pool.name, timeout)
    yield from register_flow(key, _pool_registration(pool), timeout)


class _PoolLink:
    """A pool's standing with one endpoint."""

    def __init__(self) -> None:
        self.decisions: dict[SharedMemoryMode, bool] = {}
        self.latched = False
        self.reprobe: threading.Thread | None = None


class Endpoint:
    """What one server (``host:port``) has been told about this process's memory."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.guard = Guard()
        self.generation = 0
        self._lock = threading.Lock()
        self._regions: dict[str, Registration] = {}
        self._keys: dict[str, ChannelKey] = {}
        self._links: dict[str, _PoolLink] = {}
        self._stop = threading.Event()

    # -- registrations ------------------------------------------------------------------------

    def remember(self, key: ChannelKey, registration: Registration) -> None:
        """Record a successful registration (and how to reach the server again)."""
        with self._lock:
            self._regions[registration.name] = registration
            self._keys[registration.name] = key

    def forget(self, name: str) -> None:
        """Drop a registration from the record."""
        with self._lock:
            self._regions.pop(name, None)
            self._keys.pop(name, None)

    def known(self, names: Iterable[str]) -> list[Registration]:
        """The recorded registrations among ``names``."""
        with self._lock:
            return [self._regions[n] for n in names if n in self._regions]

    def registrations(self) -> list[tuple[ChannelKey, Registration]]:
        """Every recorded registration with the channel that made it."""
        with self._lock:
            return [(self._keys[n], r) for n, r in self._regions.items()]

    def reregister_flow(
        self, key: ChannelKey, names: Iterable[str], seen: int, timeout: float
    ) -> Flow[bool]:
        """Register ``names`` again unless another caller already did since generation ``seen``.

        Run under :class:`Exclusive` on :attr:`guard`. True when the registrations are (now)
        in place, False when re-registering failed or there was nothing to re-register.
        """
        if self.generation != seen:
            return True
        wanted = self.known(names)
        if not wanted:
            return False
        try:
            for registration in wanted:
                yield from register_flow(key, registration, timeout)
        except grpc.RpcError as error:
            _log.warning("re-registering shared memory at %s failed: %s", self.address, error)
            return False
        self.generation += 1
        return True

    # -- staging pools ------------------------------------------------------------------------

    def _link(self, pool: StagingPool) -> _PoolLink:
        with self._lock:
            link = self._links.get(pool.name)
            if link is None:
                link = self._links[pool.name] = _PoolLink()
            return link

    def use_shm_flow(
        self, key: ChannelKey, pool: StagingPool, mode: SharedMemoryMode, timeout: float
    ) -> Flow[bool]:
        """Whether requests through ``key`` should reference ``pool`` in place."""
        if mode == "off" or not pool.shm:
            return False
        link = self._link(pool)
        if link.latched:
            return False
        decided = link.decisions.get(mode)
        if decided is not None:
            return decided
        result: bool = yield Exclusive(
            self.guard, lambda: self._decide_flow(key, pool, link, mode, timeout)
        )
        return result

    def _decide_flow(
        self,
        key: ChannelKey,
        pool: StagingPool,
        link: _PoolLink,
        mode: SharedMemoryMode,
        timeout: float,
    ) -> Flow[bool]:
        decided = link.decisions.get(mode)
        if decided is not None:
            return decided
        same = yield from _probe_flow(key, pool, min(PROBE_TIMEOUT_S, timeout))
        if same is False and mode == "on":
            raise RuntimeError(
                f"shared_memory='on' but {self.address} cannot open {pool.shm_key} "
                "(not the same IPC namespace)"
            )
        use = same is True or (same is None and mode == "on")
        if use:
            yield from _attach_pool_flow(key, pool, timeout)
        link.decisions[mode] = use
        return use

    def latch_inline(self, key: ChannelKey, pool: StagingPool, interval: float) -> None:
        """Send ``pool``'s requests inline from now on, and re-probe in the background."""
        link = self._link(pool)
        with self._lock:
            if link.latched:
                return
            link.latched = True
            _log.warning(
                "%s forgot shared memory pool %s and re-registering did not help; "
                "sending inline and re-probing every %.0f s",
                self.address,
                pool.name,
                interval,
            )
            thread = threading.Thread(
                target=self._reprobe,
                args=(key, pool, link, interval),
                name=f"reactantserver-client-reprobe-{self.address}",
                daemon=True,
            )
            link.reprobe = thread
        thread.start()

    def _reprobe(
        self, key: ChannelKey, pool: StagingPool, link: _PoolLink, interval: float
    ) -> None:
        while not self._stop.wait(interval):
            if pool.closed:
                return
            try:
                if run_sync(_probe_flow(key, pool, REPROBE_TIMEOUT_S)) is False:
                    continue
                run_sync(_attach_pool_flow(key, pool, REPROBE_TIMEOUT_S))
            except Exception as error:  # a re-probe must never kill anything
                _log.debug("re-probe of %s at %s failed: %s", pool.name, self.address, error)
                continue
            with self._lock:
                link.latched = False
                link.reprobe = None
            _log.info("shared memory pool %s works again at %s", pool.name, self.address)
            return

    def latched(self, pool: StagingPool) -> bool:
        """Whether ``pool`` is latched to inline at this endpoint."""
        return self._link(pool).latched

    def stop(self) -> list[threading.Thread]:
        """Stop re-probing; the re-probe threads (daemons) that were running."""
        self._stop.set()
        with self._lock:
            return [link.reprobe for link in self._links.values() if link.reprobe is not None]


class Endpoints:
    """Every endpoint this process talked shared memory with."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_address: dict[str, Endpoint] = {}

    def of(self, key: ChannelKey) -> Endpoint:
        """The state of ``key``'s endpoint (created on first use)."""
        with self._lock:
            endpoint = self._by_address.get(key.endpoint)
            if endpoint is None:
                endpoint = self._by_address[key.endpoint] = Endpoint(key.endpoint)
            return endpoint

    def drain(self) -> list[Endpoint]:
        """Remove and return every endpoint (``shutdown``)."""
        with self._lock:
            endpoints = list(self._by_address.values())
            self._by_address.clear()
            return endpoints


ENDPOINTS = Endpoints()
"""The process-wide record."""
