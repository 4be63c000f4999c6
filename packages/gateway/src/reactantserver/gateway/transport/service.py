"""The inference service at the gateway, every RPC but ModelInfer.

Forwarded calls carry raw bytes; fan-outs decode only what they merge. Health-style calls are
answered locally, per-model calls go to the model's replicas in routing order with failover
on ``UNAVAILABLE``, fleet calls go to every worker::

    service = GatewayService(links, discovery, proxy, version="0.1.0", timeout_seconds=60)
    server.add_generic_rpc_handlers([service.handler()])
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import Message

from reactantserver.core.errors import ReactantError, status_message
from reactantserver.core.log_settings import answer_log_settings
from reactantserver.core.protocol import (
    INFERENCE_METHODS,
    INFERENCE_SERVICE,
    IS_SAME_IPC_NAMESPACE,
    MODEL_CONFIG,
    MODEL_METADATA,
    MODEL_READY,
    MODEL_STATISTICS,
    REPOSITORY_INDEX,
    REPOSITORY_MODEL_LOAD,
    REPOSITORY_MODEL_UNLOAD,
    SERVER_EXTENSIONS,
    SERVER_NAME,
    SYSTEM_SHARED_MEMORY_REGISTER,
    SYSTEM_SHARED_MEMORY_STATUS,
    SYSTEM_SHARED_MEMORY_UNREGISTER,
)
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.tracing import answer_trace_settings
from reactantserver.gateway.transport.merge import is_same_namespace, merge_index, merge_statistics
from reactantserver.gateway.transport.proxy import ForwardError, Proxy
from reactantserver.gateway.transport.wire import WireError, read_string_field
from reactantserver.gateway.workers.discovery import Discovery
from reactantserver.gateway.workers.link import WorkerLink

__all__ = ["GatewayService", "fan_out"]

_log = logging.getLogger("reactantserver.gateway")

_Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
_Outcome: TypeAlias = bytes | BaseException


async def fan_out(
    links: Sequence[WorkerLink], path: str, body: bytes, *, timeout: float
) -> list[_Outcome]:
    """``body`` to every link concurrently; each answer's bytes or the error it raised."""

    async def one(link: WorkerLink) -> bytes:
        return await link.call(path, body, timeout=timeout)

    return list(await asyncio.gather(*(one(link) for link in links), return_exceptions=True))


def _error_of(outcome: _Outcome) -> ForwardError:
    if isinstance(outcome, grpc.aio.AioRpcError):
        return ForwardError(outcome.code(), outcome.details() or outcome.code().name)
    return ForwardError(grpc.StatusCode.UNAVAILABLE, f"worker call failed: {outcome!r}")


class GatewayService:
    """Handlers for the inference service; ModelInfer and ModelStreamInfer go to the proxy."""

    def __init__(
        self,
        links: Sequence[WorkerLink],
        discovery: Discovery,
        proxy: Proxy,
        *,
        version: str,
        timeout_seconds: float,
    ) -> None:
        self.links = list(links)
        self.by_url = {link.url: link for link in links}
        self.discovery = discovery
        self.proxy = proxy
        self.version = version
        self.timeout = timeout_seconds

    def ready(self) -> bool:
        """``ServerReady``: a worker was ready in the last round and we are not stopping."""
        return self.discovery.any_ready() and not self.proxy.stopping

    def handler(self) -> grpc.GenericRpcHandler:
        """Every implemented method at its public path (the rest answer ``UNIMPLEMENTED``)."""
        typed: dict[str, Callable[..., Any]] = {
            "ServerLive": self.server_live,
            "ServerReady": self.server_ready,
            "ServerMetadata": self.server_metadata,
            "ModelReady": self.model_ready,
            "IsSameIPCNamespace": self.same_namespace,
            "LogSettings": self.log_settings,
            "TraceSetting": self.trace_setting,
        }
        raw: dict[str, Callable[..., Any]] = {
            "ModelInfer": self.proxy.infer,
            "ModelMetadata": self._per_model(MODEL_METADATA),
            "ModelConfig": self._per_model(MODEL_CONFIG),
            "ModelStatistics": self.model_statistics,
            "RepositoryIndex": self.repository_index,
            "RepositoryModelLoad": self._load_unload(REPOSITORY_MODEL_LOAD),
            "RepositoryModelUnload": self._load_unload(REPOSITORY_MODEL_UNLOAD),
            "SystemSharedMemoryRegister": self.shm_register,
            "SystemSharedMemoryUnregister": self.shm_unregister,
            "SystemSharedMemoryStatus": self.shm_status,
        }
        handlers = {
            name: INFERENCE_METHODS[name].rpc_method_handler(fn) for name, fn in typed.items()
        }
        for name, fn in raw.items():
            handlers[name] = grpc.unary_unary_rpc_method_handler(_aborting(fn))
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(self.proxy.stream)
        return grpc.method_handlers_generic_handler(INFERENCE_SERVICE, handlers)

    # ------------------------------------------------------------ local answers

    async def log_settings(self, request: pb.LogSettingsRequest, context: _Context) -> Message:
        """The gateway process's own log settings (each worker answers for itself)."""
        try:
            return answer_log_settings(request)
        except ReactantError as exc:
            await context.abort(exc.status, status_message(exc))
            raise AssertionError("unreachable") from exc

    async def trace_setting(self, request: pb.TraceSettingRequest, context: _Context) -> Message:
        """The gateway's own trace settings (each worker answers for its own spans)."""
        try:
            return answer_trace_settings(self.proxy.tracing, request)
        except ReactantError as exc:
            await context.abort(exc.status, status_message(exc))
            raise AssertionError("unreachable") from exc

    async def server_live(self, request: pb.ServerLiveRequest, context: _Context) -> Message:
        """Always live while the process runs."""
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request: pb.ServerReadyRequest, context: _Context) -> Message:
        """Ready iff a worker was ready in the last probe round."""
        return pb.ServerReadyResponse(ready=self.ready())

    async def server_metadata(
        self, request: pb.ServerMetadataRequest, context: _Context
    ) -> Message:
        """The same fields as a worker."""
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=self.version, extensions=list(SERVER_EXTENSIONS)
        )

    # -------------------------------------------------------------- per model

    async def _replicas(self, model: str) -> tuple[str, ...]:
        replicas = self.discovery.replicas(model)
        if not replicas:
            await self.discovery.refresh()
            replicas = self.discovery.replicas(model)
        return replicas

    async def model_ready(self, request: pb.ModelReadyRequest, context: _Context) -> Message:
        """The first replica that says ready wins; no route means not ready."""
        body = request.SerializeToString()
        for url in await self._replicas(request.name):
            try:
                answer = pb.ModelReadyResponse.FromString(
                    await self.by_url[url].call(MODEL_READY, body, timeout=self.timeout)
                )
            except grpc.aio.AioRpcError:
                continue
            if answer.ready:
                return answer
        return pb.ModelReadyResponse(ready=False)

    def _per_model(self, path: str) -> Callable[[bytes, _Context], Any]:
        async def forward(body: bytes, context: _Context) -> bytes:
            model = _name(body)
            replicas = await self._replicas(model)
            if not replicas:
                raise ForwardError(grpc.StatusCode.NOT_FOUND, f"unknown model: '{model}'")
            last: ForwardError | None = None
            for url in replicas:
                try:
                    return await self.by_url[url].call(path, body, timeout=self.timeout)
                except grpc.aio.AioRpcError as error:
                    if error.code() != grpc.StatusCode.UNAVAILABLE:
                        raise _error_of(error) from None
                    last = _error_of(error)
            assert last is not None
            raise last

        return forward

    # -------------------------------------------------------------- fan-outs

    def _ready_links(self) -> list[WorkerLink]:
        return [link for link in self.links if link.ready] or self.links

    async def model_statistics(self, body: bytes, context: _Context) -> bytes:
        """Summed over ready workers; a model no worker knows is ``NOT_FOUND``."""
        outcomes = await fan_out(self._ready_links(), MODEL_STATISTICS, body, timeout=self.timeout)
        answers = [
            pb.ModelStatisticsResponse.FromString(o) for o in outcomes if isinstance(o, bytes)
        ]
        if not answers:
            raise _first_error(outcomes)
        return merge_statistics(answers).SerializeToString()

    async def repository_index(self, body: bytes, context: _Context) -> bytes:
        """Merged by name over every reachable worker; the ``ready`` filter is forwarded."""
        outcomes = await fan_out(self.links, REPOSITORY_INDEX, body, timeout=self.timeout)
        answers = [
            pb.RepositoryIndexResponse.FromString(o) for o in outcomes if isinstance(o, bytes)
        ]
        if not answers:
            raise _first_error(outcomes)
        return merge_index(answers).SerializeToString()

    def _load_unload(self, path: str) -> Callable[[bytes, _Context], Any]:
        async def fan(body: bytes, context: _Context) -> bytes:
            outcomes = await fan_out(self.links, path, body, timeout=self.timeout)
            await self.discovery.refresh_now()
            for outcome in outcomes:
                if not isinstance(outcome, bytes):
                    raise _error_of(outcome)
            first = outcomes[0]
            assert isinstance(first, bytes)
            return first

        return fan

    async def same_namespace(
        self, request: pb.IsSameIPCNamespaceRequest, context: _Context
    ) -> Message:
        """AND of every worker's answer (an error counts false)."""
        outcomes = await fan_out(
            self.links, IS_SAME_IPC_NAMESPACE, request.SerializeToString(), timeout=self.timeout
        )
        answers = [
            pb.IsSameIPCNamespaceResponse.FromString(o).same if isinstance(o, bytes) else None
            for o in outcomes
        ]
        return pb.IsSameIPCNamespaceResponse(same=is_same_namespace(answers))

    # -------------------------------------------------------- shared memory

    async def shm_register(self, body: bytes, context: _Context) -> bytes:
        """Register on every worker under its gate; any failure rolls the others back."""
        name = _name(body)
        if not name:
            raise ForwardError(grpc.StatusCode.INVALID_ARGUMENT, "region name must not be empty")
        async with _gates(self.links):
            outcomes = await fan_out(
                self.links, SYSTEM_SHARED_MEMORY_REGISTER, body, timeout=self.timeout
            )
            failures = [o for o in outcomes if not isinstance(o, bytes)]
            if not failures:
                first = outcomes[0]
                assert isinstance(first, bytes)
                return first
            done = [
                link for link, o in zip(self.links, outcomes, strict=True) if isinstance(o, bytes)
            ]
            undo = pb.SystemSharedMemoryUnregisterRequest(name=name).SerializeToString()
            await fan_out(done, SYSTEM_SHARED_MEMORY_UNREGISTER, undo, timeout=self.timeout)
        error = _error_of(failures[0])
        raise ForwardError(grpc.StatusCode.FAILED_PRECONDITION, error.details)

    async def shm_unregister(self, body: bytes, context: _Context) -> bytes:
        """Unregister everywhere; OK if at least one worker succeeded."""
        async with _gates(self.links):
            outcomes = await fan_out(
                self.links, SYSTEM_SHARED_MEMORY_UNREGISTER, body, timeout=self.timeout
            )
        ok = [o for o in outcomes if isinstance(o, bytes)]
        if not ok:
            raise ForwardError(grpc.StatusCode.UNAVAILABLE, _error_of(outcomes[0]).details)
        if len(ok) < len(outcomes):
            _log.warning(
                "shared-memory unregister succeeded on %d/%d workers", len(ok), len(outcomes)
            )
        return ok[0]

    async def shm_status(self, body: bytes, context: _Context) -> bytes:
        """Regions registered on every reachable worker."""
        outcomes = await fan_out(
            self.links, SYSTEM_SHARED_MEMORY_STATUS, body, timeout=self.timeout
        )
        answers = [
            pb.SystemSharedMemoryStatusResponse.FromString(o)
            for o in outcomes
            if isinstance(o, bytes)
        ]
        if not answers:
            raise _first_error(outcomes)
        common = set(answers[0].regions)
        for answer in answers[1:]:
            common &= set(answer.regions)
        merged = pb.SystemSharedMemoryStatusResponse()
        for name in sorted(common):
            merged.regions[name].CopyFrom(answers[0].regions[name])
        return merged.SerializeToString()


def _name(body: bytes) -> str:
    try:
        return read_string_field(body, 1)
    except WireError as error:
        raise ForwardError(
            grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {error}"
        ) from None


def _first_error(outcomes: Sequence[_Outcome]) -> ForwardError:
    if not outcomes:
        return ForwardError(grpc.StatusCode.UNAVAILABLE, "no workers")
    return _error_of(outcomes[0])


@contextlib.asynccontextmanager
async def _gates(links: Sequence[WorkerLink]) -> AsyncIterator[None]:
    """Hold every worker's register gate for the duration of a fan-out."""
    async with contextlib.AsyncExitStack() as stack:
        for link in links:
            await stack.enter_async_context(link.gate.hold())
        yield


def _aborting(fn: Callable[[bytes, _Context], Any]) -> Callable[[bytes, _Context], Any]:
    """Turn a :class:`ForwardError` into the call's status."""

    async def handler(body: bytes, context: _Context) -> bytes:
        try:
            result: bytes = await fn(body, context)
        except ForwardError as error:
            await context.abort(error.code, error.details)
            raise  # pragma: no cover - abort raises
        return result

    return handler
