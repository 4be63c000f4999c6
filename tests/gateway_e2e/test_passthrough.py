"""Status pass-through: worker statuses unchanged, gateway's own codes.

Each bad request is followed by a good one, which must still succeed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from reactantserver.core.protocol import MODEL_INFER
from tests.worker_e2e._bundles import SPIN
from tests.worker_e2e._harness import (
    Answers,
    WorkerProcess,
    infer_input,
    message_of,
    raw_request,
    rows,
    spin_input,
    status_of,
    wait_for,
)

from ._gateway import GatewayProcess, raw_unary, running_gateway

pytestmark = pytest.mark.slow

X = rows(2, 16, seed=31)


@pytest.fixture(scope="module")
def direct(workers: list[WorkerProcess]) -> Iterator[Any]:
    """A ``tritonclient.grpc`` client of the first session worker (bypassing the gateway)."""
    with grpcclient.InferenceServerClient(workers[0].url) as triton:
        yield triton


def _good(client: Any) -> None:
    result = client.infer("mlp", [infer_input("x", X, "FP32")])
    assert result.as_numpy("logits").shape == (2, 4)


def _failure(client: Any, model: str, inputs: list[Any], **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, inputs, **kwargs)
    return caught.value


def _raw_failure(url: str, body: bytes) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        raw_unary(url, MODEL_INFER, body)
    return caught.value


@pytest.mark.parametrize(
    "case",
    ["bad_shape", "bad_datatype", "unknown_input", "missing_input", "bad_version"],
)
def test_worker_errors_pass_through_unchanged(client: Any, direct: Any, case: str) -> None:
    inputs = {
        "bad_shape": [infer_input("x", rows(2, 15, seed=1), "FP32")],
        "bad_datatype": [infer_input("x", X.astype(np.float64), "FP64")],
        "unknown_input": [infer_input("y", X, "FP32")],
        "missing_input": [],
        "bad_version": [infer_input("x", X, "FP32")],
    }[case]
    kwargs = {"model_version": "7"} if case == "bad_version" else {}
    theirs = _failure(direct, "mlp", inputs, **kwargs)
    mine = _failure(client, "mlp", inputs, **kwargs)
    assert status_of(mine) == status_of(theirs), (mine, theirs)
    assert message_of(mine) == message_of(theirs)
    if case != "bad_version":
        assert status_of(mine) == "INVALID_ARGUMENT"
    _good(client)


def test_unregistered_shared_memory_region_passes_through(client: Any, direct: Any) -> None:
    tensor = grpcclient.InferInput("x", list(X.shape), "FP32")
    tensor.set_shared_memory("no_such_region", X.nbytes)
    theirs = _failure(direct, "mlp", [tensor])
    mine = _failure(client, "mlp", [tensor])
    assert (status_of(mine), message_of(mine)) == (status_of(theirs), message_of(theirs))
    _good(client)


def test_unknown_model_is_not_found(client: Any) -> None:
    error = _failure(client, "no_such_model", [infer_input("x", X, "FP32")])
    assert status_of(error) == "NOT_FOUND"
    assert "no_such_model" in message_of(error)
    _good(client)


def test_malformed_body_is_invalid_argument(gateway: GatewayProcess, client: Any) -> None:
    for body in (b"\xff\xff\xff", b"\x0a\x40mlp"):  # a bad tag; a truncated field
        error = _raw_failure(gateway.url, body)
        assert status_of(error) == "INVALID_ARGUMENT", body
        _good(client)


def test_empty_model_name_is_invalid_argument(gateway: GatewayProcess, client: Any) -> None:
    body = raw_request("", [("x", "FP32", [2, 16], X.tobytes())]).SerializeToString()
    error = _raw_failure(gateway.url, body)
    assert status_of(error) == "INVALID_ARGUMENT"
    assert status_of(_raw_failure(gateway.url, b"")) == "INVALID_ARGUMENT"
    _good(client)


def test_spent_budget_is_deadline_exceeded(gateway: GatewayProcess, client: Any) -> None:
    request = raw_request("mlp", [("x", "FP32", [2, 16], X.tobytes())])
    request.parameters["timeout"].int64_param = 1  # one microsecond
    assert status_of(_raw_failure(gateway.url, request.SerializeToString())) == (
        "DEADLINE_EXCEEDED"
    )
    _good(client)


def test_raw_request_without_a_deadline_succeeds(gateway: GatewayProcess) -> None:
    request = raw_request("mlp", [("x", "FP32", [2, 16], X.tobytes())], request_id="raw-1")
    answer = service_pb2.ModelInferResponse.FromString(
        raw_unary(gateway.url, MODEL_INFER, request.SerializeToString())
    )
    assert answer.id == "raw-1"
    assert list(answer.outputs[0].shape) == [2, 4]


def test_inbound_cap_is_resource_exhausted(workers: list[WorkerProcess], logs: Path) -> None:
    """A gateway with a cap of 1 x 2 workers: two held spins fill it, the third is shed."""
    settings = {"grpc": {"max_concurrent_requests_per_worker": 1}}
    with (
        running_gateway(workers, logs, settings=settings, name="gateway-capped") as capped,
        grpcclient.InferenceServerClient(capped.url) as client,
    ):
        spins = Answers(2)
        client.async_infer(SPIN, [spin_input()], spins.callback("a"))
        client.async_infer(SPIN, [spin_input()], spins.callback("b"))
        wait_for(
            lambda: capped.metric("reactantserver_gateway_inflight_requests") == 2, "two in flight"
        )
        error = _failure(client, "mlp", [infer_input("x", X, "FP32")])
        assert status_of(error) == "RESOURCE_EXHAUSTED"
        assert capped.metric("reactantserver_gateway_requests_shed_total") == 1
        assert capped.metric("reactantserver_gateway_max_concurrent_requests") == 2
        for key, (failed, result) in spins.wait().items():
            assert failed is None, (key, failed)
            assert result.as_numpy("y").shape == (1, 16)
        _good(client)
