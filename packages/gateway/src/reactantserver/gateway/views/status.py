"""The gateway's status document (``GET /status``) and the status page (``GET /``), issue 16.

:class:`StatusSource` builds the gateway document of :mod:`reactantserver.core.status` on demand:
the policy, the placement (``lpt_packing``: the installed assignment; ``round_robin`` and
``model_aware``: the discovery routing table, model -> its ready workers), the last repack
(``lpt_packing`` only) and every worker's own ``/status`` document, fetched concurrently from
its HTTP port with a 2 s timeout. A worker without an HTTP endpoint, or whose fetch fails, gets
``status: null`` and an ``error`` string; the document itself is always answered.
``last_repack.generation`` counts the repacks so far (0 with ``seconds_ago``/``reason`` null
before the first); placement rows name workers by label, sorted by model::

    source = StatusSource(version="0.1.0", policy=policy, routes=lambda: discovery.routes,
                          workers=links, http_endpoints=config.metrics_endpoints,
                          ready=service.ready)
    add_status_routes(app, source, session=lambda request: request.app[_SESSION])
    document = await source.document(session)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, cast

import aiohttp
from aiohttp import web

from reactantserver.core.status import (
    PAGE_CONTENT_TYPE,
    PAGE_PATH,
    STATUS_PATH,
    GatewayStatus,
    GatewayWorker,
    LastRepack,
    PlacementRow,
    WorkerStatus,
    page,
)
from reactantserver.gateway.policies.lpt.policy import LptPolicy
from reactantserver.gateway.policies.policy import Policy, Routes

__all__ = ["STATUS_FETCH_TIMEOUT_SECONDS", "StatusSource", "WorkerView", "add_status_routes"]

STATUS_FETCH_TIMEOUT_SECONDS = 2.0
"""Timeout of one fetch of a worker's ``/status`` (a slow worker must not stall the page)."""

_NO_STORE = {"Cache-Control": "no-store"}


class WorkerView(Protocol):
    """What the status document reads of a worker link (:class:`~._workers.WorkerLink`)."""

    @property
    def label(self) -> str:
        """The worker's name (``worker_names``, else its endpoint)."""

    @property
    def url(self) -> str:
        """``host:port`` of its gRPC port."""

    @property
    def ready(self) -> bool:
        """Whether it was ready in the last probe round."""


class StatusSource:
    """Everything the gateway's ``/status`` document is built from, read when it is asked.

    ``http_endpoints`` are the workers' HTTP ports (``metrics_endpoints``), aligned with
    ``workers``; it may be shorter (the rest have none). ``clock`` is monotonic and ``wall``
    the Unix time (seams for tests).
    """

    def __init__(
        self,
        *,
        version: str,
        policy: Policy,
        routes: Callable[[], Routes],
        workers: Sequence[WorkerView],
        http_endpoints: Sequence[str],
        ready: Callable[[], bool],
        timeout_seconds: float = STATUS_FETCH_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.version = version
        self.policy = policy
        self.routes = routes
        self.workers = tuple(workers)
        self.http_endpoints = tuple(http_endpoints)
        self.ready = ready
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._clock = clock
        self._wall = wall
        self._started = clock()

    async def document(self, session: aiohttp.ClientSession) -> GatewayStatus:
        """The gateway document, with every worker's document fetched now (concurrently)."""
        endpoints = [
            self.http_endpoints[i] if i < len(self.http_endpoints) else None
            for i in range(len(self.workers))
        ]
        fetched = await asyncio.gather(*(self._fetch(session, endpoint) for endpoint in endpoints))
        workers: list[GatewayWorker] = [
            {
                "name": worker.label,
                "endpoint": worker.url,
                "ready": worker.ready,
                "status": status,
                "error": error,
            }
            for worker, (status, error) in zip(self.workers, fetched, strict=True)
        ]
        return {
            "kind": "gateway",
            "version": self.version,
            "ready": self.ready(),
            "uptime_seconds": max(0.0, self._clock() - self._started),
            "policy": self.policy.mode,
            "last_repack": self._last_repack(),
            "placement": self._placement(),
            "workers": workers,
        }

    def _placement(self) -> list[PlacementRow]:
        labels = {worker.url: worker.label for worker in self.workers}
        policy = self.policy
        if isinstance(policy, LptPolicy):
            placed: Mapping[str, Sequence[str]] = {
                name: p.workers for name, p in policy.placement.items()
            }
        else:
            # The routing table lists replicas in discovery order; show the configured order.
            ready = [worker.url for worker in self.workers if worker.ready]
            placed = {
                name: [url for url in ready if url in urls] for name, urls in self.routes().items()
            }
        return [
            {"model": name, "workers": [labels.get(url, url) for url in placed[name]]}
            for name in sorted(placed)
        ]

    def _last_repack(self) -> LastRepack | None:
        policy = self.policy
        if not isinstance(policy, LptPolicy):
            return None
        last = policy.last
        if last.count == 0:
            return {"generation": 0, "seconds_ago": None, "reason": None}
        return {
            "generation": last.count,
            "seconds_ago": max(0.0, self._wall() - last.unix_seconds),
            "reason": last.trigger,
        }

    async def _fetch(
        self, session: aiohttp.ClientSession, endpoint: str | None
    ) -> tuple[WorkerStatus | None, str | None]:
        """``(document, None)``, or ``(None, why not)``."""
        if endpoint is None:
            return None, "no HTTP endpoint configured (metrics_endpoints)"
        url = f"http://{endpoint}{STATUS_PATH}"
        try:
            return _worker_document(await self._get(session, url)), None
        except _FetchError as error:
            return None, f"GET {url}: {error}"

    async def _get(self, session: aiohttp.ClientSession, url: str) -> bytes:
        try:
            async with session.get(url, timeout=self.timeout) as response:
                if response.status != 200:
                    raise _FetchError(f"HTTP {response.status}")
                return await response.read()
        except TimeoutError:
            raise _FetchError(f"no answer within {self.timeout.total} s") from None
        except (aiohttp.ClientError, OSError, ValueError) as error:
            raise _FetchError(f"{type(error).__name__}: {error}") from None


class _FetchError(Exception):
    """Why a worker's document could not be had (the message goes into ``error``)."""


def _worker_document(body: bytes) -> WorkerStatus:
    try:
        document = json.loads(body)
    except ValueError as error:
        raise _FetchError(f"not JSON ({error})") from None
    if not isinstance(document, dict) or document.get("kind") != "worker":
        raise _FetchError("not a worker status document")
    return cast(WorkerStatus, document)


def add_status_routes(
    app: web.Application,
    source: StatusSource,
    session: Callable[[web.Request], aiohttp.ClientSession],
) -> None:
    """Mount ``GET /`` (the page) and ``GET /status`` (the document) on ``app``.

    ``session(request)`` is the client session to fetch the workers' documents with (the app's
    shared one).
    """

    async def get_page(request: web.Request) -> web.Response:
        return web.Response(body=page(), headers={"Content-Type": PAGE_CONTENT_TYPE, **_NO_STORE})

    async def get_status(request: web.Request) -> web.Response:
        document = await source.document(session(request))
        return web.json_response(document, headers=_NO_STORE)

    app.router.add_get(PAGE_PATH, get_page)
    app.router.add_get(STATUS_PATH, get_status)
