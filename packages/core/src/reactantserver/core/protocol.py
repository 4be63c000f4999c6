"""The wire protocol: generated messages, public method paths, hand registration.

The KServe V2 / Triton messages live in the private proto package
``reactantserver.kserve.v2`` (so ``tritonclient.grpc``, which registers ``inference.*``,
can share the interpreter), while the service is served at the public paths
``/inference.GRPCInferenceService/<Method>`` by registering it by hand::

    server.add_generic_rpc_handlers(
        [inference_service_handler({"ServerLive": lambda req, ctx: ServerLiveResponse(live=True)})]
    )

Control services (``reactantserver.control.v1``) are public and use the generated stubs
in :data:`control_pb2_grpc`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import grpc
from google.protobuf.message import Message

from reactantserver.core._proto.control.v1 import control_pb2, control_pb2_grpc
from reactantserver.core._proto.kserve.v2 import grpc_service_pb2, model_config_pb2

__all__ = [
    "CUDA_SHARED_MEMORY_REGISTER",
    "CUDA_SHARED_MEMORY_STATUS",
    "CUDA_SHARED_MEMORY_UNREGISTER",
    "INFERENCE_METHODS",
    "INFERENCE_SERVICE",
    "IS_SAME_IPC_NAMESPACE",
    "LOG_SETTINGS",
    "MODEL_CONFIG",
    "MODEL_INFER",
    "MODEL_METADATA",
    "MODEL_READY",
    "MODEL_STATISTICS",
    "MODEL_STREAM_INFER",
    "REPOSITORY_INDEX",
    "REPOSITORY_MODEL_LOAD",
    "REPOSITORY_MODEL_UNLOAD",
    "SERVER_EXTENSIONS",
    "SERVER_LIVE",
    "SERVER_METADATA",
    "SERVER_NAME",
    "SERVER_READY",
    "SYSTEM_SHARED_MEMORY_REGISTER",
    "SYSTEM_SHARED_MEMORY_STATUS",
    "SYSTEM_SHARED_MEMORY_UNREGISTER",
    "TRACE_SETTING",
    "InferenceMethod",
    "control_pb2",
    "control_pb2_grpc",
    "grpc_service_pb2",
    "inference_service_handler",
    "model_config_pb2",
]

#: ``ServerMetadata.name`` of workers and gateways alike.
SERVER_NAME = "ReactantServer"
#: Protocol extensions listed in ``ServerMetadata`` (a gateway serves the same set).
SERVER_EXTENSIONS = (
    "system_shared_memory",
    "model_repository",
    "model_configuration",
    "statistics",
    "parameters",
    "trace",
)

#: Public (Triton) name of the inference service; clients address it by this name.
INFERENCE_SERVICE = "inference.GRPCInferenceService"

_PREFIX = f"/{INFERENCE_SERVICE}/"

SERVER_LIVE = _PREFIX + "ServerLive"
SERVER_READY = _PREFIX + "ServerReady"
MODEL_READY = _PREFIX + "ModelReady"
SERVER_METADATA = _PREFIX + "ServerMetadata"
MODEL_METADATA = _PREFIX + "ModelMetadata"
MODEL_INFER = _PREFIX + "ModelInfer"
MODEL_STREAM_INFER = _PREFIX + "ModelStreamInfer"
MODEL_CONFIG = _PREFIX + "ModelConfig"
MODEL_STATISTICS = _PREFIX + "ModelStatistics"
REPOSITORY_INDEX = _PREFIX + "RepositoryIndex"
REPOSITORY_MODEL_LOAD = _PREFIX + "RepositoryModelLoad"
REPOSITORY_MODEL_UNLOAD = _PREFIX + "RepositoryModelUnload"
SYSTEM_SHARED_MEMORY_STATUS = _PREFIX + "SystemSharedMemoryStatus"
SYSTEM_SHARED_MEMORY_REGISTER = _PREFIX + "SystemSharedMemoryRegister"
SYSTEM_SHARED_MEMORY_UNREGISTER = _PREFIX + "SystemSharedMemoryUnregister"
CUDA_SHARED_MEMORY_STATUS = _PREFIX + "CudaSharedMemoryStatus"
CUDA_SHARED_MEMORY_REGISTER = _PREFIX + "CudaSharedMemoryRegister"
CUDA_SHARED_MEMORY_UNREGISTER = _PREFIX + "CudaSharedMemoryUnregister"
TRACE_SETTING = _PREFIX + "TraceSetting"
LOG_SETTINGS = _PREFIX + "LogSettings"
#: Not part of Triton; kept for clients of ReactantServer.jl.
IS_SAME_IPC_NAMESPACE = _PREFIX + "IsSameIPCNamespace"


@attrs.frozen
class InferenceMethod:
    """One method of the inference service: its public path and message classes."""

    name: str
    path: str
    request: type[Message]
    response: type[Message]
    client_streaming: bool
    server_streaming: bool

    def rpc_method_handler(self, behaviour: Callable[..., Any]) -> grpc.RpcMethodHandler:
        """Wrap ``behaviour`` (sync or async, as the server expects) for this method."""
        kind: Callable[..., grpc.RpcMethodHandler]
        if self.client_streaming and self.server_streaming:
            kind = grpc.stream_stream_rpc_method_handler
        elif self.client_streaming:
            kind = grpc.stream_unary_rpc_method_handler
        elif self.server_streaming:
            kind = grpc.unary_stream_rpc_method_handler
        else:
            kind = grpc.unary_unary_rpc_method_handler
        return kind(
            behaviour,
            request_deserializer=self.request.FromString,
            response_serializer=self.response.SerializeToString,
        )


def _methods() -> dict[str, InferenceMethod]:
    service = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    methods = {}
    for method in service.methods:
        methods[method.name] = InferenceMethod(
            name=method.name,
            path=_PREFIX + method.name,
            request=getattr(grpc_service_pb2, method.input_type.name),
            response=getattr(grpc_service_pb2, method.output_type.name),
            client_streaming=method.client_streaming,
            server_streaming=method.server_streaming,
        )
    return methods


#: Every inference-service method by name (``"ModelInfer"``), in declaration order.
INFERENCE_METHODS: Mapping[str, InferenceMethod] = _methods()


def inference_service_handler(
    behaviours: Mapping[str, Callable[..., Any]],
) -> grpc.GenericRpcHandler:
    """Register ``behaviours`` (method name -> callable) at the public Triton paths.

    Works for ``grpc.server`` and ``grpc.aio.server`` alike; methods left out answer
    ``UNIMPLEMENTED`` as gRPC does for any unknown method.
    """
    unknown = sorted(set(behaviours) - set(INFERENCE_METHODS))
    if unknown:
        raise ValueError(f"not methods of {INFERENCE_SERVICE}: {', '.join(unknown)}")
    handlers = {
        name: INFERENCE_METHODS[name].rpc_method_handler(fn) for name, fn in behaviours.items()
    }
    return grpc.method_handlers_generic_handler(INFERENCE_SERVICE, handlers)
