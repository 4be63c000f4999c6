"""Hand registration at /inference.GRPCInferenceService/<Method> works with real servers."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
import tritonclient.grpc as tritongrpc
from tritonclient.utils import InferenceServerException

from reactantserver.core import protocol
from reactantserver.core.protocol import grpc_service_pb2 as pb


def _live(request: pb.ServerLiveRequest, context: grpc.ServicerContext) -> pb.ServerLiveResponse:
    del request, context
    return pb.ServerLiveResponse(live=True)


def _same_ipc(
    request: pb.IsSameIPCNamespaceRequest, context: grpc.ServicerContext
) -> pb.IsSameIPCNamespaceResponse:
    del context
    return pb.IsSameIPCNamespaceResponse(same=request.name == "here")


@pytest.fixture
def server_port() -> Iterator[int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        [protocol.inference_service_handler({"ServerLive": _live, "IsSameIPCNamespace": _same_ipc})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(grace=None)


def test_raw_channel_calls_hand_registered_server_live(server_port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server_port}") as channel:
        call = channel.unary_unary(
            protocol.SERVER_LIVE,
            request_serializer=pb.ServerLiveRequest.SerializeToString,
            response_deserializer=pb.ServerLiveResponse.FromString,
        )
        response = call(pb.ServerLiveRequest(), timeout=10)
    assert protocol.SERVER_LIVE == "/inference.GRPCInferenceService/ServerLive"
    assert response.live is True


def test_extra_method_is_reachable(server_port: int) -> None:
    method = protocol.INFERENCE_METHODS["IsSameIPCNamespace"]
    with grpc.insecure_channel(f"127.0.0.1:{server_port}") as channel:
        call: Any = channel.unary_unary(
            method.path,
            request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )
        assert call(pb.IsSameIPCNamespaceRequest(name="here"), timeout=10).same is True
        assert call(pb.IsSameIPCNamespaceRequest(name="elsewhere"), timeout=10).same is False


def test_stock_tritonclient_reaches_the_hand_registered_server(server_port: int) -> None:
    client = tritongrpc.InferenceServerClient(f"127.0.0.1:{server_port}")
    try:
        assert client.is_server_live() is True
        with pytest.raises(InferenceServerException) as excinfo:
            client.is_server_ready()
        assert excinfo.value.status() == "StatusCode.UNIMPLEMENTED"
    finally:
        client.close()


def test_method_table_matches_constants() -> None:
    constants = {
        getattr(protocol, name)
        for name in protocol.__all__
        if name.isupper()
        and isinstance(getattr(protocol, name), str)
        and getattr(protocol, name).startswith("/")
    }
    assert constants == {m.path for m in protocol.INFERENCE_METHODS.values()}
    stream = protocol.INFERENCE_METHODS["ModelStreamInfer"]
    assert stream.client_streaming
    assert stream.server_streaming
    assert stream.request is pb.ModelInferRequest
    assert stream.response is pb.ModelStreamInferResponse


def test_unknown_method_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="ServerAlive"):
        protocol.inference_service_handler({"ServerAlive": _live})
