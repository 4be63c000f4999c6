"""``model_aware`` end to end: traffic follows residency until the warm worker's queue costs more.

Both workers run a 1000-byte weight cache, so ``spin`` (900 bytes) fits only alone. It is made
resident on w0 and evicted on w1 (by ``classifier_hooks``) before the gateway starts. One
``spin`` request at a time then always goes to w0 (``E(w0) = T_I < L + T_I = E(w1)``); with
several in flight, w0's reserved compute exceeds the cold-load cost and w1 gets traffic too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import triton_to_np_dtype

from reactantserver.core.protocol import control_pb2, control_pb2_grpc
from tests._e2e_support import worker_env
from tests.worker_e2e._bundles import SPIN
from tests.worker_e2e._harness import Answers, WorkerProcess, model_stats, spin_input

from ._gateway import GatewayProcess, running_gateway

LONG = 2_000_000  # spin iterations: ~0.2 s on the CI cores
SHORT = 200_000
AWARE = {"scheduling": {"mode": "model_aware"}, "startup_wait_seconds": 60}


def _resident(worker: WorkerProcess, model: str) -> bool:
    stub = control_pb2_grpc.WorkerControlStub(grpc.insecure_channel(worker.url))
    status = stub.ModelControlStatus(control_pb2.ModelControlStatusRequest())
    (entry,) = [m for m in status.models if m.name == model]
    return bool(entry.device_resident)


@pytest.fixture(scope="module")
def cached_workers(repo: Path, cache_dir: Path, logs: Path) -> Iterator[list[WorkerProcess]]:
    """Two workers with a 1000-byte weight cache; ``spin`` warm on w0 only."""
    env = worker_env(cache_dir, RUNTIME_WEIGHT_CACHE_MAX_BYTES="1000")
    started: list[WorkerProcess] = []
    try:
        for i in range(2):
            worker = WorkerProcess(repo, logs / f"cached{i}.log", env)
            worker.start()
            started.append(worker)
        for worker in started:
            worker.wait_ready()
        w0, w1 = started
        with grpcclient.InferenceServerClient(w0.url) as direct:
            for _ in range(2):  # warm, and a measured cost per item for the gateway
                direct.infer(SPIN, [spin_input(LONG)])
        with grpcclient.InferenceServerClient(w1.url) as direct:
            meta = direct.get_model_metadata("classifier_hooks")
            inputs = []
            for tensor in meta.inputs:
                shape = [1, *(int(d) for d in tensor.shape[1:])]
                inp = grpcclient.InferInput(tensor.name, shape, tensor.datatype)
                inp.set_data_from_numpy(np.zeros(shape, triton_to_np_dtype(tensor.datatype)))
                inputs.append(inp)
            direct.infer("classifier_hooks", inputs)
        assert _resident(w0, SPIN)
        assert not _resident(w1, SPIN)
        yield started
    finally:
        codes = [worker.stop() for worker in started]
    assert codes == [0, 0]


@pytest.fixture(scope="module")
def aware_gateway(cached_workers: list[WorkerProcess], logs: Path) -> Iterator[GatewayProcess]:
    """A ``model_aware`` gateway over the cached workers."""
    with running_gateway(cached_workers, logs, settings=AWARE, name="aware") as gateway:
        yield gateway


def _counts(workers: list[WorkerProcess]) -> list[int]:
    counts = []
    for worker in workers:
        with grpcclient.InferenceServerClient(worker.url) as direct:
            counts.append(int(model_stats(direct, SPIN).inference_count))
    return counts


def test_traffic_stays_where_the_model_is_resident_while_it_keeps_up(
    aware_gateway: GatewayProcess, cached_workers: list[WorkerProcess]
) -> None:
    before = _counts(cached_workers)
    with grpcclient.InferenceServerClient(aware_gateway.url) as client:
        for _ in range(6):
            client.infer(SPIN, [spin_input(SHORT)])
    after = _counts(cached_workers)
    assert [a - b for a, b in zip(after, before, strict=True)] == [6, 0]
    assert (
        aware_gateway.metric(
            "reactantserver_gateway_model_aware_routes_total", placement="resident"
        )
        >= 6
    )


def test_a_growing_queue_spreads_the_model_to_a_cold_worker(
    aware_gateway: GatewayProcess, cached_workers: list[WorkerProcess]
) -> None:
    before = _counts(cached_workers)
    n = 6
    answers = Answers(n)
    with grpcclient.InferenceServerClient(aware_gateway.url) as client:
        for i in range(n):
            client.async_infer(SPIN, [spin_input(LONG)], answers.callback(str(i)))
        results: dict[str, Any] = answers.wait()
    assert all(error is None for error, _ in results.values()), results
    after = _counts(cached_workers)
    grew = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(grew) == n
    assert grew[1] > 0, grew  # the cold worker took part of the burst
    assert (
        aware_gateway.metric("reactantserver_gateway_model_aware_routes_total", placement="cold")
        >= 1
    )
    control = control_pb2_grpc.GatewayControlStub(grpc.insecure_channel(aware_gateway.url))
    status = control.GetSchedulingStatus(control_pb2.GetSchedulingStatusRequest())
    assert status.mode == "model_aware"
    assert {w.worker for w in status.workers} == {"w0", "w1"}
