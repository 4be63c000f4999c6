"""Message-size caps and disabled control services, on a real worker and a real gateway.

The capped worker takes at most 1 MiB per message and the gateway in front of it 2 MiB (see
``conftest.py``): a bigger request gets ``RESOURCE_EXHAUSTED`` from whichever process it
overflows, and both keep serving. With ``endpoints.control_service: false`` (worker) and
``control_service: false`` (gateway) every control RPC is ``UNIMPLEMENTED`` while inference
works; there is no separate control address to bind (docs/security.md: disable the services
or restrict the port with network policy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from reactantserver.core.protocol import control_pb2, control_pb2_grpc
from tests.gateway_e2e._gateway import GatewayProcess
from tests.worker_e2e._harness import WorkerProcess, infer_input, open_channel, status_of

from .conftest import GATEWAY_CAP, WORKER_CAP

ROW_BYTES = 16 * 4
"""One ``mlp`` input row: 16 FP32 features."""


def _rows_for(nbytes: int) -> int:
    return nbytes // ROW_BYTES + 1


def _infer(url: str, rows: int) -> Any:
    x = np.random.default_rng(rows).standard_normal((rows, 16)).astype(np.float32)
    with grpcclient.InferenceServerClient(url) as client:
        return client.infer("mlp", [infer_input("x", x, "FP32")], client_timeout=30)


def _refused(url: str, rows: int) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        _infer(url, rows)
    return caught.value


def _assert_serves(url: str) -> None:
    result = _infer(url, 3)
    assert result.as_numpy("logits").shape[0] == 3


def test_a_request_over_the_worker_cap_is_resource_exhausted(capped: WorkerProcess) -> None:
    error = _refused(capped.url, _rows_for(WORKER_CAP))
    assert status_of(error) == "RESOURCE_EXHAUSTED", error
    _assert_serves(capped.url)
    assert capped.proc is not None
    assert capped.proc.poll() is None


def test_the_gateway_enforces_its_own_cap_and_relays_the_workers(
    gateway: GatewayProcess, capped: WorkerProcess
) -> None:
    # Over the gateway's 2 MiB: refused at the gateway's own listener.
    own = _refused(gateway.url, _rows_for(GATEWAY_CAP))
    assert status_of(own) == "RESOURCE_EXHAUSTED", own
    _assert_serves(gateway.url)
    # Under the gateway's cap, over the worker's 1 MiB: the worker refuses, the gateway relays.
    relayed = _refused(gateway.url, _rows_for(WORKER_CAP + (GATEWAY_CAP - WORKER_CAP) // 2))
    assert status_of(relayed) == "RESOURCE_EXHAUSTED", relayed
    _assert_serves(gateway.url)
    _assert_serves(capped.url)


WORKER_CONTROL: dict[str, Callable[[Any], Any]] = {
    "ModelControlStatus": lambda stub: stub.ModelControlStatus(
        control_pb2.ModelControlStatusRequest(), timeout=10
    ),
    "SetModelResidency": lambda stub: stub.SetModelResidency(
        control_pb2.SetModelResidencyRequest(), timeout=10
    ),
    "SetModelPolicy": lambda stub: stub.SetModelPolicy(
        control_pb2.SetModelPolicyRequest(), timeout=10
    ),
    "CompactMemory": lambda stub: stub.CompactMemory(
        control_pb2.CompactMemoryRequest(), timeout=10
    ),
}

GATEWAY_CONTROL: dict[str, Callable[[Any], Any]] = {
    "GetSchedulingStatus": lambda stub: stub.GetSchedulingStatus(
        control_pb2.GetSchedulingStatusRequest(), timeout=10
    ),
    "SetSchedulingPolicy": lambda stub: stub.SetSchedulingPolicy(
        control_pb2.SetSchedulingPolicyRequest(), timeout=10
    ),
    "SetModelPlacement": lambda stub: stub.SetModelPlacement(
        control_pb2.SetModelPlacementRequest(), timeout=10
    ),
    "Repack": lambda stub: stub.Repack(control_pb2.RepackRequest(), timeout=10),
}


def _statuses(url: str, stub_type: Any, calls: dict[str, Callable[[Any], Any]]) -> dict[str, str]:
    codes: dict[str, str] = {}
    with open_channel(url) as channel:
        stub = stub_type(channel)
        for name, call in calls.items():
            try:
                call(stub)
            except grpc.RpcError as error:
                codes[name] = status_of(error)
            else:
                codes[name] = "OK"
    return codes


def test_worker_control_disabled_is_unimplemented_while_inference_works(
    capped: WorkerProcess,
) -> None:
    codes = _statuses(capped.url, control_pb2_grpc.WorkerControlStub, WORKER_CONTROL)
    assert codes == dict.fromkeys(WORKER_CONTROL, "UNIMPLEMENTED")
    _assert_serves(capped.url)


def test_gateway_control_disabled_is_unimplemented_while_inference_works(
    gateway: GatewayProcess,
) -> None:
    codes = _statuses(gateway.url, control_pb2_grpc.GatewayControlStub, GATEWAY_CONTROL)
    assert codes == dict.fromkeys(GATEWAY_CONTROL, "UNIMPLEMENTED")
    # The gateway's CompactMemory fan-out belongs to its control services too.
    fan_out = {"CompactMemory": WORKER_CONTROL["CompactMemory"]}
    codes = _statuses(gateway.url, control_pb2_grpc.WorkerControlStub, fan_out)
    assert codes == {"CompactMemory": "UNIMPLEMENTED"}
    _assert_serves(gateway.url)


def test_reflection_does_not_list_disabled_control_services(capped: WorkerProcess) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with open_channel(capped.url) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (answer,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
    names = {service.name for service in answer.list_services_response.service}
    assert "inference.GRPCInferenceService" in names
    assert not any("Control" in name for name in names), names
