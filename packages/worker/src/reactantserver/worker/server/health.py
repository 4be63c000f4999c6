"""gRPC health (``grpc.health.v1``) and server reflection under the public service names.

Health answers for ``""`` and ``inference.GRPCInferenceService``: ``NOT_SERVING`` until the
worker is ready, ``SERVING`` while it is, ``NOT_SERVING`` for good once shutdown starts
(05 §Health). :class:`HealthTracker` follows :meth:`WorkerState.ready` from a small task on
the event loop, so ``Watch`` streams every change.

Reflection serves copies of our file descriptors from a private pool, with the private
``reactantserver.kserve.v2`` package renamed to the public ``inference`` one, so ``grpcurl``
sees exactly what a Triton client calls. ``v1alpha`` comes from ``grpcio-reflection``; the
``v1`` service has byte-identical messages and is registered on the same servicer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from reactantserver.core.protocol import (
    INFERENCE_SERVICE,
    control_pb2,
    grpc_service_pb2,
    model_config_pb2,
)
from reactantserver.worker.server.state import WorkerState

__all__ = [
    "HEALTH_SERVICES",
    "HealthTracker",
    "enable_reflection",
    "public_descriptor_pool",
]

#: The service names health answers for (anything else is ``NOT_FOUND``).
HEALTH_SERVICES = ("", INFERENCE_SERVICE)

_PRIVATE_PACKAGE = "reactantserver.kserve.v2"
_PUBLIC_PACKAGE = "inference"
_REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
_POLL_S = 0.2


class HealthTracker:
    """The aio health servicer plus the task that keeps it in step with the worker."""

    def __init__(self, state: WorkerState) -> None:
        self._state = state
        self.servicer = health.aio.HealthServicer()
        self._serving: bool | None = None
        self._task: asyncio.Task[None] | None = None

    def add_to(self, server: grpc.aio.Server) -> None:
        """Register ``grpc.health.v1.Health`` on ``server``."""
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def start(self) -> None:
        """Publish ``NOT_SERVING`` now and follow readiness from then on."""
        await self.sync()
        self._task = asyncio.create_task(self._follow(), name="health-follow")

    async def sync(self) -> None:
        """Publish the current readiness if it changed."""
        serving = self._state.ready()
        if serving == self._serving:
            return
        self._serving = serving
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in HEALTH_SERVICES:
            await self.servicer.set(service, status)

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(_POLL_S)
            await self.sync()

    async def shut_down(self) -> None:
        """``NOT_SERVING`` for good (later ``set`` calls are ignored by the servicer)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.servicer.enter_graceful_shutdown()


def _public_copy(file: FileDescriptor) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    if proto.package != _PRIVATE_PACKAGE:
        return proto
    proto.package = _PUBLIC_PACKAGE
    proto.name = proto.name.replace("reactantserver/core/_proto/kserve/v2/", "")
    for i, dep in enumerate(proto.dependency):
        proto.dependency[i] = dep.replace("reactantserver/core/_proto/kserve/v2/", "")
    private, public = f".{_PRIVATE_PACKAGE}.", f".{_PUBLIC_PACKAGE}."

    def rename(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
        for message in messages:
            for field in message.field:
                if field.type_name.startswith(private):
                    field.type_name = public + field.type_name[len(private) :]
            rename(message.nested_type)

    rename(proto.message_type)
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(private, public)
            method.output_type = method.output_type.replace(private, public)
    return proto


def public_descriptor_pool() -> descriptor_pool.DescriptorPool:
    """A new pool holding our services' files under their public names (never the default)."""
    pool = descriptor_pool.DescriptorPool()
    files = [
        model_config_pb2.DESCRIPTOR,
        grpc_service_pb2.DESCRIPTOR,
        control_pb2.DESCRIPTOR,
        health_pb2.DESCRIPTOR,
        reflection_pb2.DESCRIPTOR,
    ]
    added: set[str] = set()

    def add(file: FileDescriptor) -> None:
        if file.name in added:
            return
        for dep in file.dependencies:
            add(dep)
        pool.Add(_public_copy(file))
        added.add(file.name)

    for file in files:
        add(file)
    return pool


def enable_reflection(server: grpc.aio.Server, services: Iterable[str]) -> None:
    """Serve ``grpc.reflection.v1`` and ``v1alpha`` listing ``services`` (plus reflection)."""
    names = [*services, reflection.SERVICE_NAME, _REFLECTION_V1]
    servicer = reflection.aio.ReflectionServicer(names, pool=public_descriptor_pool())
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(_REFLECTION_V1, {"ServerReflectionInfo": v1})]
    )
