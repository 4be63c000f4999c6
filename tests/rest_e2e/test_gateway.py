"""REST through the gateway: ``round_robin`` spreads inference over both workers, and a killed
worker is failed over exactly as on gRPC."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.gateway_e2e._gateway import GatewayProcess, running_gateway
from tests.worker_e2e._harness import WorkerProcess, rows

from ._target import Target, explicit_env, grpc_input, http_input

pytestmark = pytest.mark.slow

REQUESTS = 8


def _served(worker: WorkerProcess) -> float:
    return worker.metric("reactantserver_worker_requests_total", model="mlp", status="OK")


def _infer(client: Any, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    answer: np.ndarray[Any, Any] = client.infer(
        "mlp", [http_input("x", x, "FP32", binary=True)]
    ).as_numpy("logits")
    return answer


def test_round_robin_reaches_both_workers(
    gateway: GatewayProcess, workers: list[WorkerProcess]
) -> None:
    x = rows(2, 16, seed=31)
    before = [_served(w) for w in workers]
    target = Target("gateway", gateway.http_port, gateway.grpc_port)
    with target.clients() as (rest, rpc):
        want = rpc.infer("mlp", [grpc_input("x", x, "FP32")])
        for _ in range(REQUESTS):
            np.testing.assert_array_equal(_infer(rest, x), want.as_numpy("logits"))
    after = [_served(w) for w in workers]
    gained = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(gained) == REQUESTS + 1
    assert all(g >= 2 for g in gained), gained


def test_failover_when_a_worker_is_killed(
    repo: Path, cache_dir: Path, logs: Path, workers: list[WorkerProcess]
) -> None:
    x = rows(1, 16, seed=32)
    spare = WorkerProcess(repo, logs / "spare.log", explicit_env(cache_dir, "spare"))
    spare.start()
    try:
        spare.wait_ready()
        # A slow prober keeps the dead worker's routes: requests must fail over, not avoid it.
        settings = {"health": {"interval_seconds": 30}}
        with running_gateway(
            [workers[0], spare], logs, settings=settings, name="failover"
        ) as gateway:
            client = httpclient.InferenceServerClient(f"127.0.0.1:{gateway.http_port}")
            try:
                want = _infer(client, x)
                for _ in range(4):
                    np.testing.assert_array_equal(_infer(client, x), want)
                spare.signal(signal.SIGKILL)
                spare.wait(30)
                for _ in range(REQUESTS):  # every other one is routed to the dead worker
                    np.testing.assert_array_equal(_infer(client, x), want)
                failovers = gateway.metric("reactantserver_gateway_failovers_total")
                assert failovers >= 1
            finally:
                client.close()
    finally:
        spare.stop()
