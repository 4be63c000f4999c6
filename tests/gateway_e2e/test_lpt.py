"""``lpt_packing`` end to end: two fifo workers, a gateway that places and repacks models.

After a repack each model's traffic goes to the single worker it is placed on (default
replicas 1), which is what lets its requests coalesce; ``GatewayControl`` reports and changes
the placement, and ``Repack`` runs on the next prober round.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from reactantserver.core.protocol import control_pb2, control_pb2_grpc
from tests._e2e_support import worker_env
from tests.worker_e2e._harness import WorkerProcess, model_stats

from ._gateway import LPT, GatewayProcess, running_gateway

MODELS = ("mlp", "two_io")


@pytest.fixture(scope="module")
def fifo_workers(repo: Path, cache_dir: Path, logs: Path) -> Iterator[list[WorkerProcess]]:
    """Two ready workers on discipline ``fifo`` (lpt_packing refuses ``fair``)."""
    started: list[WorkerProcess] = []
    env = worker_env(cache_dir, SCHEDULER_DISCIPLINE="fifo")
    try:
        for i in range(2):
            worker = WorkerProcess(repo, logs / f"fifo{i}.log", env)
            worker.start()
            started.append(worker)
        for worker in started:
            worker.wait_ready()
        yield started
    finally:
        codes = [worker.stop() for worker in started]
    assert codes == [0, 0]


@pytest.fixture(scope="module")
def lpt_gateway(fifo_workers: list[WorkerProcess], logs: Path) -> Iterator[GatewayProcess]:
    """A gateway in ``lpt_packing`` over the fifo workers."""
    with running_gateway(fifo_workers, logs, settings=LPT, name="lpt") as gateway:
        yield gateway


def _control(gateway: GatewayProcess) -> Any:
    return control_pb2_grpc.GatewayControlStub(grpc.insecure_channel(gateway.url))


def _infer(client: Any, model: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    inputs = []
    if model == "mlp":
        x = grpcclient.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(rng.standard_normal((1, 16)).astype(np.float32))
        inputs.append(x)
    else:
        meta = client.get_model_metadata(model)
        for tensor in meta.inputs:
            shape = [1, *(int(d) for d in tensor.shape[1:])]
            inp = grpcclient.InferInput(tensor.name, shape, tensor.datatype)
            dtype = np.float32 if tensor.datatype == "FP32" else np.int32
            inp.set_data_from_numpy(rng.standard_normal(shape).astype(dtype))
            inputs.append(inp)
    client.infer(model, inputs)


def _executions(workers: list[WorkerProcess], model: str) -> list[int]:
    counts = []
    for worker in workers:
        with grpcclient.InferenceServerClient(worker.url) as direct:
            counts.append(int(model_stats(direct, model).inference_count))
    return counts


def test_a_repack_concentrates_each_model_on_one_worker(
    lpt_gateway: GatewayProcess, fifo_workers: list[WorkerProcess]
) -> None:
    control = _control(lpt_gateway)
    status = control.GetSchedulingStatus(control_pb2.GetSchedulingStatusRequest())
    assert status.mode == "lpt_packing"
    assert status.repack.last_trigger == "startup"
    with grpcclient.InferenceServerClient(lpt_gateway.url) as client:
        for i in range(10):
            for model in MODELS:
                _infer(client, model, i)
        done = control.Repack(control_pb2.RepackRequest(wait_seconds=30))
        assert done.completed, done
        before = {model: _executions(fifo_workers, model) for model in MODELS}
        for i in range(20):
            for model in MODELS:
                _infer(client, model, 100 + i)
    after = {model: _executions(fifo_workers, model) for model in MODELS}
    status = control.GetSchedulingStatus(control_pb2.GetSchedulingStatusRequest())
    placed = {m.name: [r.worker for r in m.replicas] for m in status.models}
    for model in MODELS:
        grew = [a - b for a, b in zip(after[model], before[model], strict=True)]
        assert sorted(grew) == [0, 20], (model, grew, placed)
        assert len(placed[model]) == 1
        chosen = placed[model][0]
        assert grew[int(chosen[1:])] == 20, (model, grew, chosen)
    assert status.repack.repack_count >= 2
    assert status.repack.operator_repacks_completed >= 1
    assert lpt_gateway.metric("reactantserver_gateway_repacks_total", trigger="operator") >= 1


def test_placement_overrides_and_live_knobs(lpt_gateway: GatewayProcess) -> None:
    control = _control(lpt_gateway)
    answer = control.SetModelPlacement(
        control_pb2.SetModelPlacementRequest(name="mlp", replicas=-1, fill_mode="spread")
    )
    assert answer.configured_replicas == -1
    assert answer.effective_replicas == 2
    assert answer.fill_mode == "spread"
    done = control.Repack(control_pb2.RepackRequest(wait_seconds=30))
    assert done.completed
    status = control.GetSchedulingStatus(control_pb2.GetSchedulingStatusRequest())
    (mlp,) = [m for m in status.models if m.name == "mlp"]
    assert sorted(r.worker for r in mlp.replicas) == ["w0", "w1"]
    assert [r.weight for r in mlp.replicas] == [0.5, 0.5]
    with pytest.raises(grpc.RpcError) as unknown:
        control.SetModelPlacement(control_pb2.SetModelPlacementRequest(name="nope", replicas=1))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    policy = control.SetSchedulingPolicy(
        control_pb2.SetSchedulingPolicyRequest(
            update_mask=["hysteresis"], policy=control_pb2.SchedulingPolicy(hysteresis=0.2)
        )
    )
    assert policy.applied.hysteresis == pytest.approx(0.2)
    assert policy.applied.generation == 1
    with pytest.raises(grpc.RpcError) as bad:
        control.SetSchedulingPolicy(
            control_pb2.SetSchedulingPolicyRequest(
                update_mask=["cold_load_penalty"],
                policy=control_pb2.SchedulingPolicy(cold_load_penalty=2.0),
            )
        )
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    control.SetModelPlacement(control_pb2.SetModelPlacementRequest(name="mlp", fill_mode="inherit"))
