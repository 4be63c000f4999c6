"""``inference.GRPCInferenceService`` on the worker: thin handlers over the data plane.

Each handler translates wire messages to the data plane's types and back; errors are
``ReactantError`` subclasses raised deeper down and turned into a status exactly once, here
. Streaming lives in :mod:`reactantserver.worker.transport.stream`::

    service = InferenceService(state)
    server.add_generic_rpc_handlers([inference_service_handler(service.handlers())])
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc

from reactantserver.core import codec
from reactantserver.core.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    ModelUnavailableError,
    ReactantError,
    ShuttingDownError,
    status_message,
    status_of,
)
from reactantserver.core.lane import ADVERT_METADATA_KEY
from reactantserver.core.log_settings import answer_log_settings
from reactantserver.core.protocol import SERVER_EXTENSIONS, SERVER_NAME
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.rest import RestContext
from reactantserver.core.tracing import RequestSpan, answer_trace_settings
from reactantserver.core.types import InferRequest
from reactantserver.worker.dataplane import RequestStats
from reactantserver.worker.registry import ModelEntry, ModelState
from reactantserver.worker.repository import groups
from reactantserver.worker.repository.watcher import RepositoryControl
from reactantserver.worker.scheduler.queue import TraceMarks
from reactantserver.worker.scheduler.stage_clock import StageClock
from reactantserver.worker.state import Runtime, WorkerState
from reactantserver.worker.transport.stream import Serve, stream_infer
from reactantserver.worker.transport.tracing import finish_request_span
from reactantserver.worker.views import model_info

__all__ = ["InferenceService"]

_log = logging.getLogger("reactantserver.worker.grpc")

# Statuses that are the client's doing are logged at debug; the rest at warning.
_CLIENT_STATUSES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    }
)

Handler = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Any]


def log_failure(model: str, request_id: str, code: grpc.StatusCode, message: str) -> None:
    """The ``request failed`` event (warning for server-side statuses, debug otherwise)."""
    level = logging.DEBUG if code in _CLIENT_STATUSES else logging.WARNING
    _log.log(
        level,
        "request failed model=%s id=%s status=%s message=%s",
        model,
        request_id,
        code.name,
        message,
        extra={"model": model, "request_id": request_id},
    )


class InferenceService:
    """Every RPC of the inference service, bound to one :class:`WorkerState`."""

    def __init__(
        self,
        state: WorkerState,
        *,
        repository: Callable[[], RepositoryControl | None] = lambda: None,
    ) -> None:
        self.state = state
        #: Request tracing; ``tracing.active`` is the one test an untraced request pays.
        self.tracing = state.tracing
        #: The repository's lifecycle once start-up is done (``RepositoryModelLoad``/``Unload``).
        self._repository = repository
        #: The forwarding lane's advert, sent with ``ServerReady`` (None: no lane).
        self.lane_advert: str | None = None
        #: Which requests time their decode and encode (thread CPU clocks are system calls).
        self.stage_clock = StageClock()

    def handlers(self) -> dict[str, Handler]:
        """Method name -> async handler, for ``inference_service_handler``."""
        unimplemented = {
            "CudaSharedMemoryStatus": "CUDA shared memory is not supported",
            "CudaSharedMemoryRegister": "CUDA shared memory is not supported",
            "CudaSharedMemoryUnregister": "CUDA shared memory is not supported",
        }
        handlers: dict[str, Handler] = {
            "ServerLive": self.server_live,
            "ServerReady": self.server_ready,
            "ModelReady": self.model_ready,
            "ServerMetadata": self.server_metadata,
            "ModelMetadata": self.model_metadata,
            "ModelConfig": self.model_config,
            "ModelStatistics": self.model_statistics,
            "ModelInfer": self.model_infer,
            "ModelStreamInfer": self.model_stream_infer,
            "LogSettings": self.log_settings,
            "TraceSetting": self.trace_setting,
            "RepositoryIndex": self.repository_index,
            "RepositoryModelLoad": self.repository_control,
            "RepositoryModelUnload": self.repository_control,
            "SystemSharedMemoryStatus": self.shm_status,
            "SystemSharedMemoryRegister": self.shm_register,
            "SystemSharedMemoryUnregister": self.shm_unregister,
            "IsSameIPCNamespace": self.same_ipc_namespace,
        }
        for name, message in unimplemented.items():
            handlers[name] = _unimplemented(message)
        return handlers

    # -- health and metadata -----------------------------------------------------------

    async def server_live(
        self, request: pb.ServerLiveRequest, context: Any
    ) -> pb.ServerLiveResponse:
        """Live while the process serves."""
        return pb.ServerLiveResponse(live=True)

    async def server_ready(
        self, request: pb.ServerReadyRequest, context: Any
    ) -> pb.ServerReadyResponse:
        """Ready once start-up finished with ≥ 1 servable model, until shutdown.

        With a forwarding lane open, its advert goes in the initial metadata.
        """
        if self.lane_advert is not None:
            await context.send_initial_metadata(((ADVERT_METADATA_KEY, self.lane_advert),))
        return pb.ServerReadyResponse(ready=self.state.ready())

    async def model_ready(
        self, request: pb.ModelReadyRequest, context: Any
    ) -> pb.ModelReadyResponse:
        """Never an error: unknown, hidden and bad versions are simply not ready."""
        ready = not self.state.stopping and self.state.model_ready(request.name, request.version)
        return pb.ModelReadyResponse(ready=ready)

    async def server_metadata(
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        """Name, version and the protocol extensions served."""
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=self.state.version, extensions=list(SERVER_EXTENSIONS)
        )

    def _platform(self) -> str:
        runtime = self.state.runtime
        if runtime is not None:
            return runtime.platform
        return self.state.config.runtime.backend.value

    async def model_metadata(
        self, request: pb.ModelMetadataRequest, context: Any
    ) -> pb.ModelMetadataResponse:
        """Client-facing tensors of a visible model (``NOT_FOUND`` otherwise)."""
        entry = await self._find(request.name, request.version, context)
        return model_info.model_metadata(entry, platform=self._platform())

    async def model_config(
        self, request: pb.ModelConfigRequest, context: Any
    ) -> pb.ModelConfigResponse:
        """The Triton-style configuration generated from the manifest."""
        entry = await self._find(request.name, request.version, context)
        runtime = self.state.runtime
        scheduled = entry.scheduled
        residency = "NONE"
        weight_bytes = 0 if entry.loaded is None else entry.loaded.weight_nbytes
        if runtime is not None and entry.meta is not None:
            weights = runtime.weights
            group = groups.group_weights(
                self.state, entry, lambda name: groups.model_weights(weights, name)
            )
            residency, weight_bytes = group.residency.name, group.nbytes
        elif runtime is not None and entry.name in runtime.weights:
            residency = runtime.weights.residency(entry.name).name
        return model_info.model_config(
            entry,
            platform=self._platform(),
            device_ordinal=self.state.config.runtime.device_ordinal,
            max_queue_depth=self.state.config.scheduler.max_queue_depth,
            effective_max_batch=0 if scheduled is None else scheduled.max_batch,
            residency=residency,
            weight_bytes=weight_bytes,
            queue_delay_us=_reported_delay_us(scheduled),
        )

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest, context: Any
    ) -> pb.ModelStatisticsResponse:
        """Cumulative counters of one visible model, or of all of them for an empty name."""
        if request.name:
            entries = [await self._find(request.name, request.version, context)]
        else:
            entries = [e for e in self.state.registry.visible() if e.state is ModelState.READY]
        runtime = self.state.runtime
        if runtime is None:
            return model_info.model_statistics(
                entries, scheduler_stats={}, request_stats=lambda _: RequestStats()
            )
        return model_info.model_statistics(
            entries,
            scheduler_stats=runtime.scheduler.all_stats(),
            request_stats=runtime.dataplane.request_stats,
        )

    async def repository_index(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        """Every visible model with its state; ``ready`` keeps only ``READY`` ones."""
        return model_info.repository_index(
            self.state.registry.visible(),
            ready_only=request.ready,
            unavailable=self.state.unavailable_reason,
        )

    async def repository_control(self, request: Any, context: Any) -> Any:
        """``RepositoryModelLoad``/``Unload`` (the control modes of 06)."""
        if not request.model_name:
            await _abort(context, InvalidArgumentError("model_name must not be empty"))
        refused = _unsupported_parameters(request)
        if refused is not None:
            await _abort(context, InvalidArgumentError(refused))
        mode = self.state.config.model_control_mode.value
        if mode == "static":
            await _abort(context, FailedPreconditionError("model control disabled in static mode"))
        if isinstance(request, pb.RepositoryModelUnloadRequest) and mode == "dynamic":
            await _abort(
                context,
                FailedPreconditionError(
                    "model control in dynamic mode follows the model directories; "
                    f"remove the bundle of '{request.model_name}' to unload it"
                ),
            )
        name = request.model_name
        control = self._repository()
        lifecycle = None if control is None else control.lifecycle
        watcher = None if control is None else control.watcher
        if self.state.stopping:
            await _abort(context, ShuttingDownError(f"server is shutting down; '{name}' untouched"))
        if lifecycle is None:
            await _abort(context, ModelUnavailableError("server is starting; try again when ready"))
        assert lifecycle is not None
        unload = isinstance(request, pb.RepositoryModelUnloadRequest)
        try:
            if unload:
                await asyncio.to_thread(functools.partial(lifecycle.unload, name, keep_groups=True))
            elif watcher is not None:
                await asyncio.to_thread(watcher.force, name)
            else:
                await asyncio.to_thread(lifecycle.load_explicit, name)
        except ReactantError as exc:
            await _abort(context, exc)
        except Exception as exc:
            await context.abort(
                grpc.StatusCode.INTERNAL, f"failed to load model '{name}': {status_message(exc)}"
            )
        if unload:
            return pb.RepositoryModelUnloadResponse()
        return pb.RepositoryModelLoadResponse()

    # -- shared memory -----------------------------------------------------------------

    async def shm_status(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        """Registered system shared-memory regions (all for an empty name)."""
        response = pb.SystemSharedMemoryStatusResponse()
        for name, region in self.state.shm.status(request.name).items():
            response.regions[name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=region.name,
                    key=region.key,
                    offset=region.offset,
                    byte_size=region.byte_size,
                )
            )
        return response

    async def shm_register(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        """Map a client's region (bad arguments or a missing object: ``INVALID_ARGUMENT``)."""
        try:
            self.state.shm.register(request.name, request.key, request.offset, request.byte_size)
        except ReactantError as exc:
            await _abort(context, exc)
        return pb.SystemSharedMemoryRegisterResponse()

    async def shm_unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        """Forget a region (idempotent; empty name: all)."""
        self.state.shm.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def same_ipc_namespace(
        self, request: pb.IsSameIPCNamespaceRequest, context: Any
    ) -> pb.IsSameIPCNamespaceResponse:
        """Whether a client's shared-memory key opens here."""
        return pb.IsSameIPCNamespaceResponse(same=self.state.shm.is_same_namespace(request.name))

    # -- inference ---------------------------------------------------------------------

    async def model_stream_infer(
        self, requests: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Bidirectional streaming (an async generator, as grpc.aio requires).

        While tracing is active each message is traced as its own request, child of the
        stream's ``traceparent``.
        """
        serve: Serve = self.serve
        if self.tracing.active:
            serve = functools.partial(
                self.serve_traced, metadata=context.invocation_metadata(), transport="grpc"
            )
        async for answer in stream_infer(serve, requests, context):
            yield answer

    async def model_infer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ModelInferResponse:
        """One inference request; any failure becomes its status here."""
        try:
            if self.tracing.active:
                transport = "http" if isinstance(context, RestContext) else "grpc"
                return await self.serve_traced(
                    request, context.time_remaining(), context.invocation_metadata(), transport
                )
            return await self.serve(request, context.time_remaining())
        except ReactantError as exc:
            await _abort(context, exc)
            raise AssertionError("unreachable") from exc

    async def serve_traced(
        self,
        message: pb.ModelInferRequest,
        time_remaining: float | None,
        metadata: Iterable[tuple[str, Any]],
        transport: str,
    ) -> pb.ModelInferResponse:
        """:meth:`serve` under a server span, child of the ``traceparent`` in ``metadata``
        (call it while ``tracing.active``; an unsampled request is served untraced)."""
        span = self.tracing.start(
            "ModelInfer",
            metadata,
            model=message.model_name,
            attributes={"reactant.transport": transport, "reactant.request_id": message.id},
        )
        return await self.serve(
            message, time_remaining, span if span.recording else None, http=transport == "http"
        )

    async def serve(
        self,
        message: pb.ModelInferRequest,
        time_remaining: float | None,
        span: RequestSpan | None = None,
        *,
        http: bool = False,
    ) -> pb.ModelInferResponse:
        """Decode, infer, encode; counts the request once with its final status.

        The metrics get the handler's wall time and the event-loop thread's CPU in decoding
        and encoding (``reactantserver_worker_stage_cpu_seconds_total``, timed on one request
        in :data:`~reactantserver.worker.scheduler.SAMPLE_EVERY`). With a ``span``, the
        request's phases and outcome are recorded under it and it is ended here (``http``:
        the request came over REST).
        """
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        decode_ns = encode_ns = 0
        request: InferRequest | None = None
        marks = None if span is None else TraceMarks()
        respond: tuple[int, int] | None = None
        detail = ""
        try:
            runtime = self._serving_runtime(message.model_name)
            runtime.dataplane.limiter.check()  # a full worker refuses before decoding
            timed = self.stage_clock.timed()
            clock = time.thread_time_ns() if timed else 0
            request = codec.decode_request(
                message,
                registry=self.state.shm,
                max_recv_msg_bytes=self.state.config.grpc.max_recv_msg_bytes,
                grpc_time_remaining=time_remaining,
            )
            if timed:
                decode_ns = self.stage_clock.scale(time.thread_time_ns() - clock)
            response = await runtime.dataplane.infer(request, marks)
            clock = time.thread_time_ns() if timed else 0
            mark = 0 if span is None else time.monotonic_ns()
            answer = codec.encode_response(
                response, requested=request.outputs, registry=self.state.shm
            )
            if timed:
                encode_ns = self.stage_clock.scale(time.thread_time_ns() - clock)
            if span is not None:
                respond = (mark, time.monotonic_ns())
            return answer
        except ReactantError as exc:
            code = exc.status
            detail = str(exc)
            log_failure(message.model_name, message.id, code, detail)
            raise
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            detail = "cancelled by the caller"
            raise
        except Exception as exc:
            code = grpc.StatusCode.INTERNAL
            detail = str(exc)
            _log.exception("request failed model=%s id=%s", message.model_name, message.id)
            raise ReactantError(
                f"internal error serving model '{message.model_name}': {exc}"
            ) from exc
        finally:
            if request is not None:
                request.release()
            self.state.requests.observe(
                message.model_name, code, time.perf_counter() - started, decode_ns, encode_ns
            )
            if span is not None and marks is not None:
                finish_request_span(
                    span,
                    marks,
                    model=message.model_name,
                    version=message.model_version or "1",
                    respond=respond,
                    code=code,
                    message=detail,
                    http=http,
                )

    def _serving_runtime(self, model: str) -> Runtime:
        if self.state.stopping:
            raise ShuttingDownError(f"server is shutting down; model '{model}' takes no new work")
        runtime = self.state.runtime
        if runtime is None or (not self.state.started and self.state.registry.get(model) is None):
            raise ModelUnavailableError(f"server is starting; model '{model}' is not ready yet")
        return runtime

    async def log_settings(
        self, request: pb.LogSettingsRequest, context: Any
    ) -> pb.LogSettingsResponse:
        """This process's log settings, changed first by those the request names."""
        try:
            return answer_log_settings(request)
        except ReactantError as exc:
            await _abort(context, exc)
            raise AssertionError("unreachable") from exc

    async def trace_setting(
        self, request: pb.TraceSettingRequest, context: Any
    ) -> pb.TraceSettingResponse:
        """This worker's trace settings (of one model, or global), changed first by those the
        request names."""
        try:
            return answer_trace_settings(self.tracing, request)
        except ReactantError as exc:
            await _abort(context, exc)
            raise AssertionError("unreachable") from exc

    async def _find(self, name: str, version: str, context: Any) -> ModelEntry:
        try:
            return self.state.registry.find(name, version)
        except ReactantError as exc:
            error = exc
            if not self.state.started and self.state.registry.get(name) is None:
                error = ModelUnavailableError(
                    f"server is starting; model '{name}' is not known yet"
                )
            await _abort(context, error)
            raise AssertionError("unreachable") from exc


def _reported_delay_us(scheduled: Any) -> int:
    """``dynamic_batching.max_queue_delay_microseconds``: the fixed delay, or the adaptive
    wait's bound."""
    from reactantserver.worker.scheduler import ADAPTIVE_MAX_HOLD_NS

    if scheduled is None:
        return 0
    delay = scheduled.queue_delay_ns
    return (ADAPTIVE_MAX_HOLD_NS if delay is None else delay) // 1000


def _unsupported_parameters(request: Any) -> str | None:
    """Why the parameters of a repository request are refused, or ``None``.

    Config overrides and files are not supported: the bundle directory is a model's only
    source. ``unload_dependents: false``, which tritonclient's ``unload_model`` always sends,
    is the behaviour here and passes; ``true`` does not (unload the meta models first).
    """
    parameters = request.parameters
    names = sorted(parameters)
    if isinstance(request, pb.RepositoryModelUnloadRequest) and "unload_dependents" in names:
        value = parameters["unload_dependents"]
        if value.WhichOneof("parameter_choice") == "bool_param" and not value.bool_param:
            names.remove("unload_dependents")
        else:
            return "unload_dependents is not supported; unload the meta models that use it first"
    if not names:
        return None
    rpc = type(request).__name__.removesuffix("Request")
    return (
        f"request parameters are not supported by {rpc} (got: {', '.join(names)}); "
        "the bundle directory is the only source of a model"
    )


async def _abort(context: Any, exc: ReactantError) -> None:
    await context.abort(status_of(exc), status_message(exc))


def _unimplemented(message: str) -> Handler:
    async def handler(request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

    return handler
