"""The forwarding lane end to end: workers advertise it, the gateway forwards over it, and a
gateway or worker with the lane off falls back to gRPC with the same answers and statuses.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from reactantserver.core.lane import ADVERT_METADATA_KEY, Advert, parse_advert
from reactantserver.core.protocol import SERVER_READY
from reactantserver.core.protocol import grpc_service_pb2 as pb
from tests._e2e_support import worker_env
from tests.worker_e2e._harness import (
    WorkerProcess,
    infer_input,
    message_of,
    model_stats,
    rows,
    running_worker,
    status_of,
)

from ._gateway import GatewayProcess, running_gateway

pytestmark = pytest.mark.slow

X = rows(3, 16, seed=53)


def _advert(url: str) -> Advert | None:
    """The lane advert in the initial metadata of a worker's ``ServerReady`` answer."""
    with grpc.insecure_channel(url) as channel:
        call = channel.unary_unary(
            SERVER_READY,
            request_serializer=pb.ServerReadyRequest.SerializeToString,
            response_deserializer=pb.ServerReadyResponse.FromString,
        )
        answer, rpc = call.with_call(pb.ServerReadyRequest(), timeout=10)
    assert answer.ready
    values = [value for key, value in rpc.initial_metadata() if key == ADVERT_METADATA_KEY]
    assert len(values) <= 1
    return parse_advert(values[0]) if values else None


@pytest.fixture(scope="module")
def grpc_gateway(workers: list[WorkerProcess], logs: Path) -> Iterator[GatewayProcess]:
    """A second gateway over the session workers with ``worker_client.lane`` off."""
    env = {"REACTANTSERVER_GATEWAY_WORKER_CLIENT_LANE": "false"}
    with running_gateway(workers, logs, env=env, name="gateway-grpc") as process:
        yield process


def test_workers_advertise_a_private_socket(workers: list[WorkerProcess]) -> None:
    adverts = [_advert(worker.url) for worker in workers]
    assert all(advert is not None for advert in adverts)
    paths = {advert.path for advert in adverts if advert is not None}
    assert len(paths) == 2  # one lane per worker
    for advert in adverts:
        assert advert is not None
        assert len(advert.token) >= 32
        socket = Path(advert.path)
        assert stat.S_ISSOCK(socket.stat().st_mode)
        assert stat.S_IMODE(socket.parent.stat().st_mode) == 0o700
        assert socket.parent.stat().st_uid == os.getuid()


def test_the_gateway_forwards_over_both_lanes(
    gateway: GatewayProcess, workers: list[WorkerProcess], client: Any
) -> None:
    for label in ("w0", "w1"):
        assert gateway.metric("reactantserver_gateway_worker_lane", worker=label) == 1
    with (
        grpcclient.InferenceServerClient(workers[0].url) as first,
        grpcclient.InferenceServerClient(workers[1].url) as second,
    ):
        before = [model_stats(c, "mlp").inference_count for c in (first, second)]
        expected = first.infer("mlp", [infer_input("x", X, "FP32")]).as_numpy("logits")
        for _ in range(4):
            result = client.infer("mlp", [infer_input("x", X, "FP32")])
            np.testing.assert_array_equal(result.as_numpy("logits"), expected)
        after = [model_stats(c, "mlp").inference_count for c in (first, second)]
    # Round robin over two lanes: both workers served (the direct call counted 3 rows on w0).
    assert after[0] - before[0] >= 3 + 3
    assert after[1] - before[1] >= 3


def test_without_lanes_the_gateway_forwards_over_grpc(
    grpc_gateway: GatewayProcess, client: Any
) -> None:
    for label in ("w0", "w1"):
        assert grpc_gateway.metric("reactantserver_gateway_worker_lane", worker=label) == 0
    with grpcclient.InferenceServerClient(grpc_gateway.url) as plain:
        for _ in range(2):
            over_grpc = plain.infer("mlp", [infer_input("x", X, "FP32")]).as_numpy("logits")
            over_lane = client.infer("mlp", [infer_input("x", X, "FP32")]).as_numpy("logits")
            np.testing.assert_array_equal(over_grpc, over_lane)
        bad = [infer_input("x", rows(2, 15, seed=2), "FP32")]
        errors = []
        for triton in (plain, client):
            with pytest.raises(InferenceServerException) as caught:
                triton.infer("mlp", bad)
            errors.append(caught.value)
        assert status_of(errors[0]) == status_of(errors[1]) == "INVALID_ARGUMENT"
        assert message_of(errors[0]) == message_of(errors[1])
        assert (
            grpc_gateway.metric(
                "reactantserver_gateway_requests_total", rpc="ModelInfer", model="mlp"
            )
            >= 3
        )


def test_a_worker_with_the_lane_off_advertises_none_and_a_stopped_one_removes_its_socket(
    repo: Path, cache_dir: Path, logs: Path
) -> None:
    env = {**worker_env(cache_dir, ENDPOINTS_LANE="false"), "REACTANTSERVER_WORKER_NAME": "nolane"}
    with running_worker(repo, logs / "worker-nolane.log", env) as worker:
        assert _advert(worker.url) is None
    env = {**worker_env(cache_dir), "REACTANTSERVER_WORKER_NAME": "lane"}
    with running_worker(repo, logs / "worker-lane.log", env) as worker:
        advert = _advert(worker.url)
        assert advert is not None
        assert Path(advert.path).exists()
    assert not Path(advert.path).parent.exists()
