"""Every inference-service RPC through the gateway, against the workers' own answers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from reactantserver.core.protocol import (
    CUDA_SHARED_MEMORY_REGISTER,
    CUDA_SHARED_MEMORY_STATUS,
    CUDA_SHARED_MEMORY_UNREGISTER,
    IS_SAME_IPC_NAMESPACE,
    LOG_SETTINGS,
    MODEL_CONFIG,
    MODEL_METADATA,
    TRACE_SETTING,
)
from reactantserver.core.protocol import grpc_service_pb2 as pb
from tests.worker_e2e._harness import WorkerProcess, infer_input, model_stats, rows, status_of

from ._gateway import GatewayProcess, raw_unary

pytestmark = pytest.mark.slow

PUBLIC_SERVICES = (
    "inference.GRPCInferenceService",
    "grpc.health.v1.Health",
    "reactantserver.control.v1.GatewayControl",
)


@pytest.fixture(scope="module")
def direct(workers: list[WorkerProcess]) -> Iterator[list[Any]]:
    """One ``tritonclient.grpc`` client per session worker (bypassing the gateway)."""
    clients = [grpcclient.InferenceServerClient(worker.url) for worker in workers]
    try:
        yield clients
    finally:
        for each in clients:
            each.close()


def _failure(call: Callable[..., Any], *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return caught.value


def test_server_live_ready_and_metadata(client: Any, direct: list[Any]) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    mine = client.get_server_metadata()
    theirs = direct[0].get_server_metadata()
    assert (mine.name, mine.version) == (theirs.name, theirs.version)
    assert list(mine.extensions) == list(theirs.extensions)


def test_model_ready(client: Any) -> None:
    assert client.is_model_ready("mlp")
    assert client.is_model_ready("two_io")
    assert not client.is_model_ready("no_such_model")


@pytest.mark.parametrize("path", [MODEL_METADATA, MODEL_CONFIG])
@pytest.mark.parametrize("model", ["mlp", "two_io", "classifier_hooks"])
def test_metadata_and_config_are_byte_identical(
    gateway: GatewayProcess, workers: list[WorkerProcess], path: str, model: str
) -> None:
    """The gateway passes one worker's answer through unchanged.

    The workers' answers are equal as messages but need not be equal as bytes (a map's
    serialization order is per process), so the gateway's bytes must be one of theirs.
    """
    body = pb.ModelMetadataRequest(name=model).SerializeToString()
    mine = raw_unary(gateway.url, path, body)
    theirs = [raw_unary(worker.url, path, body) for worker in workers]
    assert mine in theirs
    kind = pb.ModelMetadataResponse if path == MODEL_METADATA else pb.ModelConfigResponse
    assert all(kind.FromString(answer) == kind.FromString(mine) for answer in theirs)


def test_metadata_of_an_unknown_model_is_not_found(client: Any) -> None:
    for call in (client.get_model_metadata, client.get_model_config):
        assert status_of(_failure(call, "no_such_model")) == "NOT_FOUND"


def test_statistics_are_summed_over_the_workers(client: Any, direct: list[Any]) -> None:
    before = [model_stats(each, "mlp").inference_count for each in direct]
    x = rows(2, 16, seed=3)
    for _ in range(6):
        client.infer("mlp", [infer_input("x", x, "FP32")])
    after = [model_stats(each, "mlp") for each in direct]
    grown = [entry.inference_count - old for entry, old in zip(after, before, strict=True)]
    assert grown == [6, 6]  # 3 requests of 2 items each, round robin
    summed = model_stats(client, "mlp")
    assert summed.inference_count == sum(entry.inference_count for entry in after)
    assert summed.execution_count == sum(entry.execution_count for entry in after)
    success = [entry.inference_stats.success for entry in after]
    assert summed.inference_stats.success.count == sum(s.count for s in success)
    assert summed.inference_stats.success.ns == sum(s.ns for s in success)
    assert summed.last_inference == max(entry.last_inference for entry in after)
    every = client.get_inference_statistics()
    assert {entry.name for entry in every.model_stats} >= {"mlp", "two_io", "spin"}


def test_repository_index_is_merged_and_sorted(client: Any, direct: list[Any]) -> None:
    rows_ = client.get_model_repository_index().models
    names = [row.name for row in rows_]
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    assert set(names) == {row.name for row in direct[0].get_model_repository_index().models}
    assert all(row.state == "READY" for row in rows_)
    assert "mlp" in names


def test_load_and_unload_on_static_workers_answer_the_workers_error(
    client: Any, direct: list[Any]
) -> None:
    for action in ("load_model", "unload_model"):
        theirs = _failure(getattr(direct[0], action), "mlp")
        mine = _failure(getattr(client, action), "mlp")
        assert status_of(mine) == status_of(theirs), (mine, theirs)
        assert mine.message() == theirs.message()
    assert client.is_model_ready("mlp")


def test_is_same_ipc_namespace(gateway: GatewayProcess) -> None:
    key = f"/rs_gw_ipc_{os.getpid()}"
    handle = shm.create_shared_memory_region("ipc", key, 64)
    try:
        for name, same in ((key, True), (f"/rs_gw_missing_{os.getpid()}", False)):
            body = pb.IsSameIPCNamespaceRequest(name=name).SerializeToString()
            answer = pb.IsSameIPCNamespaceResponse.FromString(
                raw_unary(gateway.url, IS_SAME_IPC_NAMESPACE, body)
            )
            assert answer.same is same, name
    finally:
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize(
    "path",
    [
        CUDA_SHARED_MEMORY_REGISTER,
        CUDA_SHARED_MEMORY_STATUS,
        CUDA_SHARED_MEMORY_UNREGISTER,
    ],
)
def test_unsupported_rpcs_are_unimplemented(gateway: GatewayProcess, path: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        raw_unary(gateway.url, path, b"")
    assert status_of(caught.value) == "UNIMPLEMENTED"


def test_trace_settings_answer_for_the_gateway_process(gateway: GatewayProcess) -> None:
    # The session gateway runs without tracing: Triton's keys, the level OFF.
    answer = pb.TraceSettingResponse.FromString(raw_unary(gateway.url, TRACE_SETTING, b""))
    assert list(answer.settings["trace_level"].value) == ["OFF"]
    assert list(answer.settings["trace_mode"].value) == ["opentelemetry"]


def test_log_settings_answer_for_the_gateway_process(gateway: GatewayProcess) -> None:
    answer = pb.LogSettingsResponse.FromString(raw_unary(gateway.url, LOG_SETTINGS, b""))
    assert set(answer.settings) == {
        "log_file",
        "log_info",
        "log_warning",
        "log_error",
        "log_verbose_level",
        "log_format",
    }
    assert answer.settings["log_file"].string_param == ""
    bad = pb.LogSettingsRequest()
    bad.settings["log_file"].string_param = "/tmp/gateway.log"
    with pytest.raises(grpc.RpcError) as caught:
        raw_unary(gateway.url, LOG_SETTINGS, bad.SerializeToString())
    assert status_of(caught.value) == "INVALID_ARGUMENT"


def test_cuda_shared_memory_through_the_client_is_unimplemented(client: Any) -> None:
    assert status_of(_failure(client.get_cuda_shared_memory_status)) == "UNIMPLEMENTED"


def test_reflection_lists_the_public_services(gateway: GatewayProcess) -> None:
    with grpc.insecure_channel(gateway.url) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert set(PUBLIC_SERVICES) <= services, services
        found = database.FindFileContainingSymbol("inference.GRPCInferenceService")
        assert found is not None


def test_grpc_health_is_serving(gateway: GatewayProcess) -> None:
    with grpc.insecure_channel(gateway.url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service


def test_raw_stub_and_client_agree_on_inference(gateway: GatewayProcess, client: Any) -> None:
    x = rows(1, 16, seed=4)
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(x.tobytes())
    answer = service_pb2.ModelInferResponse.FromString(
        raw_unary(
            gateway.url, "/inference.GRPCInferenceService/ModelInfer", request.SerializeToString()
        )
    )
    logits = np.frombuffer(answer.raw_output_contents[0], np.float32)
    expected = client.infer("mlp", [infer_input("x", x, "FP32")]).as_numpy("logits")
    np.testing.assert_allclose(logits.reshape(expected.shape), expected, rtol=1e-5, atol=1e-5)
