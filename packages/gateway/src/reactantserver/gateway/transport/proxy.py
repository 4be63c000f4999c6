"""The ModelInfer path: read the header, pick workers, forward the unchanged bytes, fail over.

The body stays bytes from the inbound handler to the worker and back:
only the model name, id, deadline parameters and, when the policy counts items, the batch
input's shape are read. Failover happens only on ``UNAVAILABLE`` and ``NOT_FOUND``; every other
worker status reaches the client unchanged::

    proxy = Proxy(links, discovery, policy, metrics, settings)
    response_bytes = await proxy.infer(body, context)        # unary handler
    async for message in proxy.stream(requests, context):     # ModelStreamInfer
        yield message
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
import grpc

from reactantserver.core.config import TracingConfig
from reactantserver.core.rest import RestContext
from reactantserver.core.tracing import RequestSpan, Tracing, end_span
from reactantserver.gateway.policies.policy import Policy
from reactantserver.gateway.transport.wire import (
    InferHeader,
    WireError,
    batch_units,
    deadline_ns,
    read_infer_header,
    stream_error,
    stream_response,
)
from reactantserver.gateway.views.metrics import GatewayMetrics
from reactantserver.gateway.workers.discovery import Discovery
from reactantserver.gateway.workers.lane import LaneError
from reactantserver.gateway.workers.link import WorkerLink

__all__ = ["ForwardError", "Proxy", "ProxySettings"]

_log = logging.getLogger("reactantserver.gateway")

_FAILOVER = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND})


class ForwardError(Exception):
    """A request's final status: a worker's, passed through, or the gateway's own."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


@attrs.frozen
class ProxySettings:
    """The ModelInfer path's knobs."""

    request_timeout_seconds: float
    inbound_cap: int  # 0 = none


class Proxy:
    """Forwards inference requests to workers by policy, with failover and the inbound cap."""

    def __init__(
        self,
        links: Mapping[str, WorkerLink],
        discovery: Discovery,
        policy: Policy,
        metrics: GatewayMetrics,
        settings: ProxySettings,
        *,
        tracing: Tracing | None = None,
    ) -> None:
        self.links = links
        #: Request tracing (off unless given); ``tracing.active`` is an untraced call's only cost.
        self.tracing = tracing or Tracing(TracingConfig(), service="reactantserver-gateway")
        self.discovery = discovery
        self.policy = policy
        self.metrics = metrics
        self.settings = settings
        self.inflight = 0
        self.stopping = False

    # ------------------------------------------------------------------ unary

    async def infer(self, body: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        """The unary ``ModelInfer`` handler (raw bytes in and out).

        While tracing is active the call gets a server span, child of the client's
        ``traceparent``, that names the worker which answered; its context goes to that worker.
        """
        started = time.perf_counter()
        model = ""
        code = grpc.StatusCode.OK
        span: RequestSpan | None = None
        detail = ""
        try:
            header = self._header(body)
            model = header.model_name
            if self.tracing.active:
                span = self._start_span(header, context)
            return await self.handle(header, body, context.time_remaining(), span)
        except ForwardError as error:
            code = error.code
            detail = error.details
            await context.abort(error.code, error.details)
            raise  # pragma: no cover - abort raises
        finally:
            self.metrics.observe_request("ModelInfer", model, code, time.perf_counter() - started)
            if span is not None:
                end_span(span, code, detail, http=isinstance(context, RestContext))

    def _start_span(self, header: InferHeader, context: Any) -> RequestSpan:
        return self.tracing.start(
            "ModelInfer",
            context.invocation_metadata(),
            model=header.model_name,
            attributes={
                "reactant.transport": "http" if isinstance(context, RestContext) else "grpc",
                "reactant.request_id": header.id,
                "reactant.policy": self.policy.mode,
            },
        )

    def refusal(self) -> str | None:
        """Why a ``ModelInfer`` arriving now is refused before it is read (the front's gate),
        or None: the gateway is at its inbound cap."""
        cap = self.settings.inbound_cap
        if not cap or self.inflight < cap:
            return None
        self.metrics.requests_shed_total.inc()
        return f"gateway at its limit of {cap} concurrent requests"

    def _header(self, body: bytes) -> InferHeader:
        try:
            header = read_infer_header(body)
        except WireError as error:
            raise ForwardError(
                grpc.StatusCode.INVALID_ARGUMENT, f"malformed ModelInferRequest: {error}"
            ) from None
        if not header.model_name:
            raise ForwardError(grpc.StatusCode.INVALID_ARGUMENT, "model_name must not be empty")
        return header

    async def handle(
        self,
        header: InferHeader,
        body: bytes,
        grpc_time_remaining: float | None,
        span: RequestSpan | None = None,
    ) -> bytes:
        """Steps 2-7 of the ModelInfer path for one decoded header (``span``: the call's, when
        traced)."""
        arrival = time.monotonic_ns()
        deadline = deadline_ns(header, now_ns=arrival, grpc_time_remaining=grpc_time_remaining)
        if deadline is not None and deadline <= arrival:
            raise ForwardError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded on arrival")
        if self.stopping:
            raise ForwardError(grpc.StatusCode.UNAVAILABLE, "gateway is shutting down")
        cap = self.settings.inbound_cap
        if cap and self.inflight >= cap:
            self.metrics.requests_shed_total.inc()
            raise ForwardError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"gateway at its limit of {cap} concurrent requests",
            )
        self.inflight += 1
        self.metrics.inflight_requests.set(self.inflight)
        try:
            return await self._route_and_forward(header, body, deadline, span)
        except ForwardError as error:
            _log.info(
                "ModelInfer model=%s id=%s: %s %s",
                header.model_name,
                header.id,
                error.code.name,
                error.details,
            )
            raise
        finally:
            self.inflight -= 1
            self.metrics.inflight_requests.set(self.inflight)

    async def _route_and_forward(
        self, header: InferHeader, body: bytes, deadline: int | None, span: RequestSpan | None
    ) -> bytes:
        model = header.model_name
        replicas = self.discovery.replicas(model)
        if not replicas:
            await self.discovery.refresh()
            replicas = self.discovery.replicas(model)
        if not replicas:
            raise ForwardError(
                grpc.StatusCode.NOT_FOUND, f"model '{model}' is not served by any ready worker"
            )
        units = 1
        locator = self.policy.batch_locator(model)
        if locator is not None:
            units = batch_units(body, *locator)
        choice = self.policy.choose(model, replicas, units)
        try:
            return await self._forward(model, body, deadline, choice.order, span)
        finally:
            choice.release()

    async def _forward(
        self,
        model: str,
        body: bytes,
        deadline: int | None,
        order: tuple[str, ...],
        span: RequestSpan | None,
    ) -> bytes:
        last: ForwardError | None = None
        all_not_found = True
        trace = () if span is None else span.headers()
        for url in order:
            link = self.links[url]
            if span is not None:
                span.set("reactant.worker", link.label)
            await link.gate.passed()
            try:
                async with link.slot(_remaining(deadline)):
                    timeout = _remaining(deadline)
                    if timeout is None:
                        timeout = self.settings.request_timeout_seconds
                    elif timeout <= 0:
                        raise ForwardError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
                    started = time.perf_counter()
                    try:
                        return await link.infer(body, timeout=timeout, trace=trace)
                    finally:
                        self.metrics.observe_worker(
                            "ModelInfer", link.label, time.perf_counter() - started
                        )
            except TimeoutError:
                raise ForwardError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"deadline exceeded waiting for a slot on worker {link.label}",
                ) from None
            except (grpc.aio.AioRpcError, LaneError) as error:
                code = error.code()
                details = error.details() or code.name
                if code not in _FAILOVER:
                    raise ForwardError(code, details) from None
                if code == grpc.StatusCode.NOT_FOUND:
                    self.discovery.refresh_soon()
                else:
                    all_not_found = False
                last = ForwardError(code, details)
                self.metrics.failover(model, link.label, code.name)
                if span is not None:
                    span.event("failover", {"worker": link.label, "status": code.name})
                _log.warning("ModelInfer model=%s worker=%s: %s, failing over", model, url, code)
        if last is None:  # pragma: no cover - order is never empty here
            raise ForwardError(grpc.StatusCode.UNAVAILABLE, "no worker to try")
        final = grpc.StatusCode.NOT_FOUND if all_not_found else grpc.StatusCode.UNAVAILABLE
        raise ForwardError(final, last.details)

    # ---------------------------------------------------------------- streams

    async def stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        """``ModelStreamInfer``: each message routed like a unary call, answered as it completes."""
        results: asyncio.Queue[bytes | None] = asyncio.Queue()
        pending: set[asyncio.Task[None]] = set()

        async def one(body: bytes) -> None:
            started = time.perf_counter()
            model = ""
            code = grpc.StatusCode.OK
            span: RequestSpan | None = None
            detail = ""
            try:
                header = self._header(body)
                model = header.model_name
                if self.tracing.active:  # each message is a request, under the stream's parent
                    span = self._start_span(header, context)
                answer = await self.handle(header, body, context.time_remaining(), span)
                await results.put(stream_response(answer))
            except ForwardError as error:
                code = error.code
                detail = error.details
                await results.put(stream_error(error.details))
            finally:
                self.metrics.observe_request(
                    "ModelStreamInfer", model, code, time.perf_counter() - started
                )
                if span is not None:
                    end_span(span, code, detail, http=False)

        async def read_all() -> None:
            try:
                async for body in requests:
                    task = asyncio.create_task(one(body))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                while pending:
                    await asyncio.gather(*list(pending), return_exceptions=True)
            finally:
                await results.put(None)

        reader = asyncio.create_task(read_all(), name="gateway-stream-reader")
        try:
            while (message := await results.get()) is not None:
                yield message
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


def _remaining(deadline: int | None) -> float | None:
    if deadline is None:
        return None
    return (deadline - time.monotonic_ns()) / 1e9
