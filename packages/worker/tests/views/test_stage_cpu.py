"""``reactantserver_worker_stage_cpu_seconds_total``: real requests through the gRPC handler move
every stage.

A started world (one compiled jax bundle, the scheduler running) serves ``ModelInferRequest``
messages through :meth:`InferenceService.serve`, the path gRPC and REST share; the family is
read back from the rendered exposition. Only which counters move is asserted, never how much.
Decode, encode and admission time one request in ``SAMPLE_EVERY``; :func:`exact` times every
one, for the test that compares the stages with the process's CPU.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from packages.worker.tests._world import World, start_world, world_config
from packages.worker.tests.conftest import BundleMaker, Tensor
from reactantserver.core.errors import InvalidArgumentError, ModelNotFoundError
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.worker.scheduler import SAMPLE_EVERY, StageClock
from reactantserver.worker.transport.inference import InferenceService
from reactantserver.worker.views.metrics import CPU_STAGES, WorkerMetrics

FAMILY = "reactantserver_worker_stage_cpu_seconds"
X = Tensor("x", "f32", "nk", {"k": 2})
Y = Tensor("y", "f32", "nk", {"k": 2})
W = np.array([10.0, 100.0], np.float32)


def _scale(x: jax.Array, w: jax.Array) -> jax.Array:
    return x * w


@pytest.fixture
def world(make_bundle: BundleMaker, tmp_path: Path) -> Iterator[World]:
    """One compiled bundle ("plain", sizes 1 and 4) with the scheduler running."""
    bundle = make_bundle(
        "plain", _scale, inputs=[X], outputs=[Y], weights=[("w", W)], batch_sizes=[1, 4]
    )
    started = start_world(
        world_config(tmp_path / "cache", budget=1 << 20, worker_name="w0"), [bundle]
    )
    try:
        yield started
    finally:
        started.close()


def message(model: str = "plain", *, rows: int = 1, output: str | None = None) -> Any:
    """A ``ModelInferRequest`` of ``rows`` rows of ``x`` (raw contents, as tritonclient sends)."""
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP32", shape=[rows, 2])
    request.raw_input_contents.append(np.ones((rows, 2), np.float32).tobytes())
    if output is not None:
        request.outputs.add(name=output)
    return request


def stages(metrics: WorkerMetrics) -> dict[tuple[str, str], float]:
    """(model, stage) -> seconds, every sample of the family, checking its labels."""
    text = metrics.render().decode()
    found = [f for f in text_string_to_metric_families(text) if f.name == FAMILY]
    if not found:
        return {}
    (family,) = found
    assert family.type == "counter"
    out = {}
    for sample in family.samples:
        assert sample.name == FAMILY + "_total"
        assert set(sample.labels) == {"worker", "model", "stage"}
        assert sample.labels["worker"] == "w0"
        out[sample.labels["model"], sample.labels["stage"]] = sample.value
    return out


def serve_all(service: InferenceService, messages: list[Any]) -> list[Any]:
    """Serve ``messages`` concurrently on one event loop (they coalesce in the scheduler)."""

    async def main() -> list[Any]:
        return list(await asyncio.gather(*(service.serve(m, None) for m in messages)))

    return asyncio.run(main())


def exact(world: World, service: InferenceService) -> None:
    """Time every request's stages, not one in ``SAMPLE_EVERY``."""
    service.stage_clock = StageClock(1)
    world.runtime.scheduler.stage_clock = StageClock(1)


def test_every_stage_moves_for_real_requests(world: World) -> None:
    metrics = WorkerMetrics(world.state, environ={})
    service = InferenceService(world.state)
    exact(world, service)
    assert stages(metrics) == {("plain", s): 0.0 for s in CPU_STAGES}

    spent = time.process_time()
    answers = serve_all(service, [message(rows=1 + k % 2) for k in range(8)])
    spent = time.process_time() - spent
    assert [a.outputs[0].name for a in answers] == ["y"] * 8
    first = stages(metrics)
    assert set(first) == {("plain", s) for s in CPU_STAGES}
    assert all(seconds > 0 for seconds in first.values()), first
    # Parts of some threads' CPU cannot exceed the whole process's over the same span.
    assert sum(first.values()) <= spent

    serve_all(service, [message(rows=3)])
    second = stages(metrics)
    assert all(second[key] > first[key] for key in first), (first, second)


def test_sampled_stages_count_the_timed_request_for_those_it_stands_for(world: World) -> None:
    metrics = WorkerMetrics(world.state, environ={})
    service = InferenceService(world.state)
    serve_all(service, [message()])  # the first request is timed
    first = stages(metrics)
    assert all(seconds > 0 for seconds in first.values()), first
    for _ in range(SAMPLE_EVERY - 1):  # the rest of its sample: not timed
        serve_all(service, [message()])
    untimed = stages(metrics)
    for stage in ("decode", "encode"):
        assert untimed["plain", stage] == first["plain", stage], stage
    # Every execution: the dispatch thread's turn, and waking the caller (queue's other half).
    for stage in ("queue", "dispatch"):
        assert untimed["plain", stage] > first["plain", stage], stage
    serve_all(service, [message()])  # the next sample's first
    assert all(stages(metrics)[key] > untimed[key] for key in untimed)


def test_a_refused_request_counts_its_decode_only(world: World) -> None:
    metrics = WorkerMetrics(world.state, environ={})
    service = InferenceService(world.state)
    with pytest.raises(InvalidArgumentError):
        serve_all(service, [message(output="nope")])
    cpu = stages(metrics)
    assert cpu["plain", "decode"] > 0
    assert cpu["plain", "queue"] == cpu["plain", "dispatch"] == cpu["plain", "encode"] == 0


def test_unknown_and_forgotten_models_have_no_series(world: World) -> None:
    metrics = WorkerMetrics(world.state, environ={})
    service = InferenceService(world.state)
    with pytest.raises(ModelNotFoundError):
        serve_all(service, [message("nope")])
    serve_all(service, [message()])
    assert {model for model, _ in stages(metrics)} == {"plain"}
    world.state.registry.remove("plain")
    metrics.forget_model("plain")
    assert stages(metrics) == {}
    assert metrics.codec_cpu() == {}


def test_without_a_runtime_the_family_is_absent(world: World) -> None:
    runtime, world.state.runtime = world.state.runtime, None
    try:
        assert stages(WorkerMetrics(world.state, environ={})) == {}
    finally:
        world.state.runtime = runtime
