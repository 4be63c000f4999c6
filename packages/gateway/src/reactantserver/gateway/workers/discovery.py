"""Discovery and health probing: which workers are ready and which models each one serves.

Every ``health.interval_seconds`` the prober asks all workers ``ServerReady`` concurrently
(call deadline 5 s, watchdog 8 s; a timed-out call resets that worker's channel), then
``RepositoryIndex(ready=true)`` on the ready ones, and swaps in a new routing table
(model -> sorted worker URLs). Policies that need worker state then get one concurrent
``ModelControlStatus`` poll. A ready worker's ``ServerReady``
answer may advertise its forwarding lane; each link follows that advert
(:meth:`WorkerLink.adopt_lane`).

:meth:`Discovery.refresh` is the on-demand path (an unknown model): single-flight and at most
one scan per second; :meth:`Discovery.refresh_soon` does the same in the background (a worker
said ``NOT_FOUND``). A dead worker keeps its routes until the next successful round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import grpc

from reactantserver.core.protocol import (
    REPOSITORY_INDEX,
    control_pb2,
    grpc_service_pb2,
)
from reactantserver.gateway.policies.policy import Policy, Routes
from reactantserver.gateway.workers.link import WorkerLink, call_message

__all__ = ["PROBE_DEADLINE_S", "PROBE_WATCHDOG_S", "Discovery", "poll_status"]

_log = logging.getLogger("reactantserver.gateway")

#: Deadline of each probe call, and the watchdog around it (a hung call resets the channel).
PROBE_DEADLINE_S = 5.0
PROBE_WATCHDOG_S = 8.0
_MIN_SCAN_INTERVAL_S = 1.0
_CONTROL_STATUS = "/reactantserver.control.v1.WorkerControl/ModelControlStatus"


class _Timeout(Exception):
    """A probe call that hit its deadline or watchdog."""


async def poll_status(
    links: Sequence[WorkerLink],
) -> tuple[dict[str, control_pb2.ModelControlStatusResponse], list[str]]:
    """One concurrent ``ModelControlStatus`` of ``links``: answers by URL and timed-out URLs."""
    results = await asyncio.gather(*(_guarded(link, _status_call(link)) for link in links))
    polls: dict[str, control_pb2.ModelControlStatusResponse] = {}
    timed_out: list[str] = []
    for link, result in zip(links, results, strict=True):
        if isinstance(result, control_pb2.ModelControlStatusResponse):
            polls[link.url] = result
        elif isinstance(result, _Timeout):
            timed_out.append(link.url)
    return polls, timed_out


def _status_call(link: WorkerLink) -> Awaitable[control_pb2.ModelControlStatusResponse]:
    return call_message(
        link,
        _CONTROL_STATUS,
        control_pb2.ModelControlStatusRequest(),
        control_pb2.ModelControlStatusResponse.FromString,
        timeout=PROBE_DEADLINE_S,
    )


async def _guarded(link: WorkerLink, call: Awaitable[object]) -> object:
    """The answer, a :class:`_Timeout` (channel reset), or the ``AioRpcError``."""
    try:
        return await asyncio.wait_for(call, PROBE_WATCHDOG_S)
    except TimeoutError:
        await link.reset()
        return _Timeout()
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            await link.reset()
            return _Timeout()
        return error


class Discovery:
    """The prober: readiness per worker, the routing table, and the policy's status feed."""

    def __init__(
        self,
        links: Sequence[WorkerLink],
        policy: Policy,
        *,
        interval_seconds: float,
        wedge_exit_rounds: int,
        on_wedged: Callable[[], None],
        on_round: Callable[[], None] = lambda: None,
    ) -> None:
        self.links = list(links)
        self.policy = policy
        self.interval_seconds = interval_seconds
        self.wedge_exit_rounds = wedge_exit_rounds
        self._on_wedged = on_wedged
        self._on_round = on_round
        self.routes: Routes = {}
        self.rounds = 0
        self._wedged_rounds = 0
        self._scan: asyncio.Task[None] | None = None
        self._last_scan = -float("inf")
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.last_polls: dict[str, control_pb2.ModelControlStatusResponse] = {}

    def any_ready(self) -> bool:
        """Whether at least one worker was ready in the last probe round."""
        return any(link.ready for link in self.links)

    def replicas(self, model: str) -> tuple[str, ...]:
        """The sorted URLs serving ``model`` (empty when none)."""
        return self.routes.get(model, ())

    async def probe_round(self) -> None:
        """One full round: readiness, then the routing table, then the status poll."""
        answers = await asyncio.gather(
            *(_guarded(link, link.probe_ready(timeout=PROBE_DEADLINE_S)) for link in self.links)
        )
        timeouts = 0
        adopt = []
        for link, answer in zip(self.links, answers, strict=True):
            was_ready = link.ready
            if isinstance(answer, tuple):
                ready, advert = answer
                link.ever_answered = True
                link.ready = ready.ready
                if link.ready:
                    adopt.append(link.adopt_lane(advert))
            else:
                link.ready = False
                timeouts += isinstance(answer, _Timeout)
            if was_ready != link.ready:
                _log.info("worker %s: %s", link.label, "ready" if link.ready else "not ready")
        self._check_wedged(timeouts)
        await asyncio.gather(*adopt)
        await self._index()
        if self.policy.needs_status:
            ready = [link for link in self.links if link.ready]
            polls, _ = await poll_status(ready)
            self.last_polls = polls
            self.policy.observe(polls)
        self.rounds += 1
        self._on_round()

    def _check_wedged(self, timeouts: int) -> None:
        if not self.links or self.wedge_exit_rounds <= 0:
            return
        ever = any(link.ever_answered for link in self.links)
        if ever and timeouts == len(self.links):
            self._wedged_rounds += 1
            _log.warning(
                "every worker probe timed out (%d/%d rounds)",
                self._wedged_rounds,
                self.wedge_exit_rounds,
            )
            if self._wedged_rounds >= self.wedge_exit_rounds:
                self._on_wedged()
        else:
            self._wedged_rounds = 0

    async def _index(self) -> None:
        ready = [link for link in self.links if link.ready]
        request = grpc_service_pb2.RepositoryIndexRequest(ready=True)
        answers = await asyncio.gather(
            *(
                _guarded(
                    link,
                    call_message(
                        link,
                        REPOSITORY_INDEX,
                        request,
                        grpc_service_pb2.RepositoryIndexResponse.FromString,
                        timeout=PROBE_DEADLINE_S,
                    ),
                )
                for link in ready
            )
        )
        table: dict[str, list[str]] = {}
        answered = False
        for link, answer in zip(ready, answers, strict=True):
            if not isinstance(answer, grpc_service_pb2.RepositoryIndexResponse):
                continue
            answered = True
            for model in answer.models:
                if model.state in ("", "READY"):
                    table.setdefault(model.name, []).append(link.url)
        if not answered and self.routes:
            return  # a dead fleet keeps its routes; failover covers the gap
        self.routes = {name: tuple(sorted(urls)) for name, urls in sorted(table.items())}
        self._last_scan = time.monotonic()

    async def refresh(self) -> None:
        """A synchronous, single-flight, rate-limited (1/s) re-scan of the fleet."""
        if self._scan is not None and not self._scan.done():
            await asyncio.shield(self._scan)
            return
        if time.monotonic() - self._last_scan < _MIN_SCAN_INTERVAL_S:
            return
        self._scan = asyncio.create_task(self._rescan(), name="gateway-refresh")
        await asyncio.shield(self._scan)

    async def _rescan(self) -> None:
        self._last_scan = time.monotonic()
        try:
            await self.probe_round()
        except Exception:
            _log.exception("route refresh failed")

    async def refresh_now(self) -> None:
        """A re-scan that is not rate-limited (after a load or unload changed the fleet)."""
        if self._scan is not None and not self._scan.done():
            await asyncio.shield(self._scan)
        self._scan = asyncio.create_task(self._rescan(), name="gateway-refresh")
        await asyncio.shield(self._scan)

    def refresh_soon(self) -> None:
        """Start :meth:`refresh` in the background (a worker answered ``NOT_FOUND``)."""
        if self._scan is not None and not self._scan.done():
            return
        if time.monotonic() - self._last_scan < _MIN_SCAN_INTERVAL_S:
            return
        self._scan = asyncio.create_task(self._rescan(), name="gateway-refresh")

    def wake(self) -> None:
        """Run the next prober round now (an operator repack)."""
        self._wake.set()

    def start(self) -> None:
        """Start the prober task (after the synchronous start-up round)."""
        self._task = asyncio.create_task(self._run(), name="gateway-prober")

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_seconds)
            self._wake.clear()
            try:
                await self.probe_round()
            except Exception:
                _log.exception("probe round failed")

    async def stop(self) -> None:
        """Stop the prober and any refresh in flight."""
        for task in (self._task, self._scan):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
