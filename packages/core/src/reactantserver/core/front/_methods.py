"""The front's method table: gRPC method handlers registered the way grpc servers take them.

``grpc.method_handlers_generic_handler`` and generated ``add_*Servicer_to_server`` functions
call ``add_generic_rpc_handlers`` / ``add_registered_method_handlers`` on whatever server
they are given; :class:`MethodTable` takes both and resolves a request path to one
:class:`Method` (its kind, behaviour and (de)serializers) once, then from a cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import grpc

__all__ = ["Method", "MethodTable"]


@attrs.frozen
class Method:
    """One registered RPC: how to call it and how to turn bytes into messages and back."""

    path: str
    request_streaming: bool
    response_streaming: bool
    behaviour: Callable[..., Any]
    deserialize: Callable[[bytes], Any] | None
    serialize: Callable[[Any], bytes] | None
    is_coroutine: bool

    @classmethod
    def of(cls, path: str, handler: grpc.RpcMethodHandler) -> Method:
        """The method behind a grpc ``RpcMethodHandler``."""
        behaviour = (
            handler.unary_unary
            or handler.unary_stream
            or handler.stream_unary
            or handler.stream_stream
        )
        if behaviour is None:
            raise ValueError(f"{path}: the method handler has no behaviour")
        return cls(
            path=path,
            request_streaming=bool(handler.request_streaming),
            response_streaming=bool(handler.response_streaming),
            behaviour=behaviour,
            deserialize=handler.request_deserializer,
            serialize=handler.response_serializer,
            is_coroutine=asyncio.iscoroutinefunction(behaviour),
        )


@attrs.frozen
class _CallDetails:
    """What a generic handler is asked about (``grpc.HandlerCallDetails``)."""

    method: str
    invocation_metadata: tuple[tuple[str, str], ...] = ()


class MethodTable:
    """Registered methods by path; generic handlers asked once per path."""

    def __init__(self) -> None:
        self._methods: dict[str, Method] = {}
        self._generic: list[grpc.GenericRpcHandler] = []
        #: Admission gates by path: called before a call's request is read; a text refuses
        #: the call with ``RESOURCE_EXHAUSTED`` (see :meth:`set_gate`).
        self.gates: dict[str, Callable[[], str | None]] = {}

    def set_gate(self, path: str, gate: Callable[[], str | None]) -> None:
        """Let ``gate()`` refuse calls of ``path`` before they cost anything (a full server)."""
        self.gates[path] = gate

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        """Take generic handlers (asked in registration order)."""
        self._generic.extend(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        """Take one service's method handlers by method name."""
        for name, handler in handlers.items():
            path = f"/{service}/{name}"
            self._methods[path] = Method.of(path, handler)

    def find(self, path: str) -> Method | None:
        """The method served at ``path``, or None (an unknown method)."""
        method = self._methods.get(path)
        if method is not None:
            return method
        details = _CallDetails(path)
        for generic in self._generic:
            handler = generic.service(details)
            if handler is not None:
                method = Method.of(path, handler)
                self._methods[path] = method
                return method
        return None  # not cached: a client may probe any number of unknown paths

    def services(self) -> list[str]:
        """Names of the services known so far (from paths and named generic handlers)."""
        names = {path.split("/")[1] for path in self._methods}
        for generic in self._generic:
            service_name = getattr(generic, "service_name", None)
            if callable(service_name):
                names.add(str(service_name()))
        return sorted(names)
