"""gRPC health, reflection, WorkerControl and the HTTP port."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from tritonclient.utils import InferenceServerException

from reactantserver.core.protocol import control_pb2, control_pb2_grpc

from ._harness import WorkerProcess, infer_input, rows, sum_samples

pytestmark = pytest.mark.slow

PUBLIC_SERVICES = (
    "inference.GRPCInferenceService",
    "grpc.health.v1.Health",
    "reactantserver.control.v1.WorkerControl",
)


def test_grpc_health(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "inference.GRPCInferenceService"):
        response = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert response.status == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as caught:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
    error: Any = caught.value
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_grpc_health_watch(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
    try:
        first = next(watch)
        assert first.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        watch.cancel()


def test_reflection_lists_and_describes_the_public_services(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert set(PUBLIC_SERVICES) <= services
    assert not any(name.startswith("reactantserver.kserve") for name in services), services
    pool = descriptor_pool.DescriptorPool(database)
    inference = pool.FindServiceByName("inference.GRPCInferenceService")
    methods = {m.name: m for m in inference.methods}
    assert {"ModelInfer", "ModelStreamInfer", "ModelConfig", "RepositoryIndex"} <= set(methods)
    assert methods["ModelInfer"].input_type.full_name == "inference.ModelInferRequest"
    control = pool.FindServiceByName("reactantserver.control.v1.WorkerControl")
    assert {m.name for m in control.methods} == {
        "ModelControlStatus",
        "SetModelResidency",
        "SetModelPolicy",
        "CompactMemory",
    }


def test_worker_control(channel: grpc.Channel) -> None:
    control = control_pb2_grpc.WorkerControlStub(channel)
    status = control.ModelControlStatus(control_pb2.ModelControlStatusRequest())
    assert status.discipline == "fair"
    by_name = {m.name: m for m in status.models}
    mlp, cnn = by_name["mlp"], by_name["cnn"]
    assert (mlp.kind, mlp.max_batch_size, mlp.batch_input_name, mlp.batch_axis) == (
        "model",
        32,
        "x",
        1,
    )
    assert (cnn.max_batch_size, cnn.batch_input_name, cnn.batch_axis) == (32, "image", 1)
    assert mlp.weight_nbytes == (16 * 32 + 32 + 32 * 4 + 4) * 4
    assert mlp.weight == 1.0

    def code(call: Any, request: Any) -> grpc.StatusCode:
        with pytest.raises(grpc.RpcError) as caught:
            call(request)
        error: Any = caught.value
        return error.code()

    invalid = control_pb2.SetModelPolicyRequest(name="mlp", has_weight=True, weight=0.0)
    assert code(control.SetModelPolicy, invalid) == grpc.StatusCode.INVALID_ARGUMENT
    unknown = control_pb2.SetModelPolicyRequest(name="nope", has_weight=True, weight=1.0)
    assert code(control.SetModelPolicy, unknown) == grpc.StatusCode.NOT_FOUND
    residency = control_pb2.SetModelResidencyRequest(name="mlp", target=control_pb2.PINNED_DEVICE)
    assert code(control.SetModelResidency, residency) == grpc.StatusCode.FAILED_PRECONDITION
    compact = control_pb2.CompactMemoryRequest(reload_models=["nope"])
    assert code(control.CompactMemory, compact) == grpc.StatusCode.NOT_FOUND

    control.SetModelPolicy(control_pb2.SetModelPolicyRequest(name="cnn", has_weight=True, weight=2))
    try:
        status = control.ModelControlStatus(control_pb2.ModelControlStatusRequest())
        assert {m.name: m.weight for m in status.models}["cnn"] == 2.0
    finally:
        control.SetModelPolicy(
            control_pb2.SetModelPolicyRequest(name="cnn", has_weight=True, weight=1.0)
        )


def test_http_health_and_readiness(worker: WorkerProcess) -> None:
    assert worker.http_get("/healthz")[::2] == (200, "ok")
    assert worker.http_get("/readyz")[::2] == (200, "ok")
    assert worker.http_get("/no/such/path")[0] == 404


def test_metrics(worker: WorkerProcess, client: Any) -> None:
    status, content_type, text = worker.http_get("/metrics?ignored=1")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    ok = sum_samples(text, "reactantserver_worker_requests_total", model="mlp", status="OK")
    bad = sum_samples(
        text, "reactantserver_worker_requests_total", model="mlp", status="INVALID_ARGUMENT"
    )
    dispatches = sum_samples(text, "reactantserver_worker_dispatch_total", model="mlp")

    client.infer("mlp", [infer_input("x", rows(2, 16, seed=80), "FP32")])
    with pytest.raises(InferenceServerException):
        client.infer("mlp", [infer_input("x", rows(2, 15, seed=81), "FP32")])

    _, _, text = worker.http_get("/metrics")
    assert (
        sum_samples(text, "reactantserver_worker_requests_total", model="mlp", status="OK")
        == ok + 1
    )
    assert (
        sum_samples(
            text, "reactantserver_worker_requests_total", model="mlp", status="INVALID_ARGUMENT"
        )
        == bad + 1
    )
    assert sum_samples(text, "reactantserver_worker_dispatch_total", model="mlp") == dispatches + 1
    assert sum_samples(text, "reactantserver_worker_models_loaded") == 6
    assert sum_samples(text, "reactantserver_worker_model_max_batch_size", model="cnn") == 32
    assert sum_samples(text, "reactantserver_worker_info") == 1
    assert sum_samples(text, "reactantserver_worker_model_load_failures_total", model="broken") >= 1
    for name in (
        "reactantserver_worker_request_latency_seconds_count",
        "reactantserver_worker_inflight_requests",
    ):
        assert name in text, name
