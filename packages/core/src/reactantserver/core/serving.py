"""gRPC server plumbing shared by the worker and the gateway.

- :func:`front_tls`: TLS / mTLS for the native front (:mod:`.front`) from ``cert_file``,
  ``key_file``, ``client_ca_file``.
- :class:`HealthTracker`: ``grpc.health.v1`` following a readiness callable, ``NOT_SERVING``
  for good once shutdown starts.
- :func:`enable_reflection`: server reflection under the public ``inference`` names, from a
  private descriptor pool (the default pool never holds an ``inference.*`` symbol).

``grpcio-health-checking`` and ``grpcio-reflection`` are dependencies of the worker and the
gateway, not of core, so they are imported where they are used::

    health = HealthTracker(lambda: state.ready())
    health.add_to(server)
    enable_reflection(server, [INFERENCE_SERVICE, HEALTH_SERVICE])
    await server.start()
    await health.start()
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor

from reactantserver.core.front import FrontTls
from reactantserver.core.protocol import (
    INFERENCE_SERVICE,
    control_pb2,
    grpc_service_pb2,
    model_config_pb2,
)

if TYPE_CHECKING:
    from grpc_health.v1.health import aio as health_aio

__all__ = [
    "HEALTH_SERVICE",
    "HEALTH_SERVICES",
    "HealthTracker",
    "RpcRegistry",
    "TlsSettings",
    "enable_reflection",
    "front_tls",
    "public_descriptor_pool",
]

#: Full name of the gRPC health service.
HEALTH_SERVICE = "grpc.health.v1.Health"
#: The service names health answers for (anything else is ``NOT_FOUND``).
HEALTH_SERVICES = ("", INFERENCE_SERVICE)

_PRIVATE_PACKAGE = "reactantserver.kserve.v2"
_PUBLIC_PACKAGE = "inference"
_PRIVATE_DIR = "reactantserver/core/_proto/kserve/v2/"
_REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
_POLL_S = 0.2


class RpcRegistry(Protocol):
    """What method registration needs of a server: ``grpc.aio.Server`` and ``GrpcFront``."""

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        """Serve the methods of generic handlers."""

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        """Serve one service's method handlers."""


class TlsSettings(Protocol):
    """Inbound TLS material: certificate and key, and a client CA for mutual TLS."""

    @property
    def cert_file(self) -> str:
        """PEM certificate chain ("" = plain)."""

    @property
    def key_file(self) -> str:
        """PEM private key."""

    @property
    def client_ca_file(self) -> str:
        """PEM CA that client certificates must chain to ("" = no mTLS)."""


def front_tls(tls: TlsSettings) -> FrontTls | None:
    """The native front's TLS from the same settings (None: plain); checks the files exist."""
    if not tls.cert_file:
        return None
    for path in (tls.cert_file, tls.key_file, tls.client_ca_file):
        if path and not Path(path).is_file():
            raise FileNotFoundError(f"TLS file not found: {path}")
    return FrontTls(tls.cert_file, tls.key_file, tls.client_ca_file)


class HealthTracker:
    """The aio health servicer plus the task that keeps it in step with ``ready()``."""

    def __init__(self, ready: Callable[[], bool]) -> None:
        from grpc_health.v1 import health

        self._ready = ready
        self.servicer: health_aio.HealthServicer = health.aio.HealthServicer()
        self._serving: bool | None = None
        self._task: asyncio.Task[None] | None = None

    def add_to(self, server: RpcRegistry) -> None:
        """Register ``grpc.health.v1.Health`` on ``server``."""
        from grpc_health.v1 import health_pb2_grpc

        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def start(self) -> None:
        """Publish the current state now and follow readiness from then on."""
        await self.sync()
        self._task = asyncio.create_task(self._follow(), name="health-follow")

    async def sync(self) -> None:
        """Publish the current readiness if it changed."""
        from grpc_health.v1 import health_pb2

        serving = self._ready()
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
    proto.name = proto.name.replace(_PRIVATE_DIR, "")
    for i, dep in enumerate(proto.dependency):
        proto.dependency[i] = dep.replace(_PRIVATE_DIR, "")
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
    from grpc_health.v1 import health_pb2
    from grpc_reflection.v1alpha import reflection_pb2

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


def enable_reflection(server: RpcRegistry, services: Iterable[str]) -> None:
    """Serve ``grpc.reflection.v1`` and ``v1alpha`` listing ``services`` (plus reflection)."""
    from grpc_reflection.v1alpha import (
        reflection,
        reflection_pb2,
        reflection_pb2_grpc,
    )

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
