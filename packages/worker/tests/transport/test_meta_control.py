"""Meta models in the server: ``WorkerControl`` status, residency, policy and compaction.

Real bundles throughout (see ``_meta_fixtures``); ``WorkerControl`` is served by a real
``grpc.aio`` server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import numpy as np
import pytest

from packages.worker.tests._meta_fixtures import EMBED_ONLY, Metas, infer, make_world, metas
from packages.worker.tests._world import World
from packages.worker.tests.meta._metaworld import (
    EMBED,
    HOOKED,
    META,
    SCORE,
    entry_of,
    items,
    stages,
)
from reactantserver.core.config import ModelControlMode
from reactantserver.core.protocol import control_pb2, control_pb2_grpc
from reactantserver.worker.runtime import Residency
from reactantserver.worker.state import WorkerState
from reactantserver.worker.transport.control import add_control_service

__all__ = ["make_world", "metas"]  # fixtures, imported by name for pytest

_T = TypeVar("_T")
Stub = Any  # control_pb2_grpc.WorkerControlStub (typing-only in the generated stubs)


# -- WorkerControl -----------------------------------------------------------------------------


async def _serve(state: WorkerState, body: Callable[[Stub], Awaitable[_T]]) -> _T:
    server = grpc.aio.server()
    add_control_service(server, state)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            return await body(control_pb2_grpc.WorkerControlStub(channel))
    finally:
        await server.stop(None)


def serve(state: WorkerState, body: Callable[[Stub], Awaitable[_T]]) -> _T:
    """Run ``body(stub)`` against a fresh WorkerControl server for ``state``."""
    return asyncio.run(_serve(state, body))


async def _status(stub: Stub) -> dict[str, Any]:
    response = await stub.ModelControlStatus(control_pb2.ModelControlStatusRequest())
    return {model.name: model for model in response.models}


async def _residency(stub: Stub, name: str, target: int) -> int:
    response = await stub.SetModelResidency(
        control_pb2.SetModelResidencyRequest(name=name, target=target)  # type: ignore[arg-type]
    )
    return int(response.residency)


async def _error(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), caught.value.details() or ""


def group_world(make_world: Callable[..., World], metas: Metas, **settings: Any) -> World:
    exported = metas.exported
    bundles = [
        exported.embed,
        exported.score,
        exported.hooked,
        exported.pipeline,
        metas.embed_only,
    ]
    return make_world(bundles, budget=1 << 20, **settings)


def test_status_reports_a_meta_as_one_group(make_world: Callable[..., World], metas: Metas) -> None:
    world = group_world(make_world, metas)
    for _ in range(2):
        infer(world, META, items(4))
    weights = world.runtime.weights

    models = serve(world.state, _status)
    assert sorted(models) == [EMBED_ONLY, HOOKED, META]  # no row for a hidden sub-model
    group = models[META]
    assert group.kind == "meta"
    assert list(group.sub_models) == [EMBED, SCORE]
    assert group.weight_nbytes == weights.nbytes(EMBED) + weights.nbytes(SCORE) > 0
    assert (group.max_batch_size, group.batch_input_name, group.batch_axis) == (0, "", 0)
    assert (group.requests_served, group.dispatch_count, group.rows_served) == (2, 2, 2)
    assert group.total_compute_seconds > 0
    assert models[EMBED_ONLY].weight_nbytes == weights.nbytes(EMBED)
    assert list(models[EMBED_ONLY].sub_models) == [EMBED]
    assert models[HOOKED].kind == "model"
    assert list(models[HOOKED].sub_models) == []


def test_set_residency_on_a_meta_moves_every_sub_model(
    make_world: Callable[..., World], metas: Metas
) -> None:
    world = group_world(make_world, metas, mode=ModelControlMode.EXPLICIT)
    state, weights = world.state, world.runtime.weights
    meta = entry_of(world, META)
    assert state.unavailable_reason(meta) == "sub-model 'pipeline_embed' is not resident"
    assert not state.model_ready(META)

    async def body(stub: Stub) -> dict[str, Any]:
        assert await _residency(stub, META, control_pb2.PINNED_DEVICE) == control_pb2.PINNED_DEVICE
        return await _status(stub)

    models = serve(state, body)
    assert weights.residency(EMBED) is Residency.PINNED_DEVICE
    assert weights.residency(SCORE) is Residency.PINNED_DEVICE
    assert state.meta_floors[META] is Residency.PINNED_DEVICE
    assert (models[META].residency, models[META].device_resident) == (
        control_pb2.PINNED_DEVICE,
        True,
    )
    assert models[EMBED_ONLY].residency == control_pb2.PINNED_DEVICE  # shares the embed stage
    assert state.model_ready(META)
    x = items(5)
    scores, indices = infer(world, META, x).outputs
    want_scores, want_indices = stages(world, x)
    np.testing.assert_array_equal(indices.data, want_indices)
    np.testing.assert_allclose(scores.data, want_scores, rtol=1e-6)


def test_lowering_one_meta_keeps_the_floor_another_meta_holds(
    make_world: Callable[..., World], metas: Metas
) -> None:
    world = group_world(make_world, metas, mode=ModelControlMode.EXPLICIT)
    weights = world.runtime.weights

    async def body(stub: Stub) -> list[int]:
        return [
            await _residency(stub, EMBED_ONLY, control_pb2.PINNED_DEVICE),
            await _residency(stub, META, control_pb2.PINNED_DEVICE),
            await _residency(stub, META, control_pb2.UNPINNED),
            await _residency(stub, EMBED_ONLY, control_pb2.PINNED_SYSTEM),
        ]

    answers = serve(world.state, body)
    assert answers[:2] == [control_pb2.PINNED_DEVICE, control_pb2.PINNED_DEVICE]
    # pipeline lowered: its own stage drops, the shared one stays at embed_only's floor,
    # and the group reports its least-resident sub-model.
    assert answers[2] == control_pb2.UNPINNED
    assert weights.residency(SCORE) is Residency.UNPINNED
    # embed_only lowered to system: pipeline (unpinned) holds nothing higher.
    assert answers[3] == control_pb2.PINNED_SYSTEM
    assert weights.residency(EMBED) is Residency.PINNED_SYSTEM


def test_policy_takes_regular_models_only_and_sub_models_are_not_found(
    make_world: Callable[..., World], metas: Metas
) -> None:
    world = group_world(make_world, metas, mode=ModelControlMode.EXPLICIT)

    async def body(stub: Stub) -> list[tuple[grpc.StatusCode, str]]:
        policy = control_pb2.SetModelPolicyRequest(name=META, has_weight=True, weight=2.0)
        return [
            await _error(stub.SetModelPolicy(policy)),
            await _error(_residency(stub, EMBED, control_pb2.PINNED_DEVICE)),
        ]

    policy, residency = serve(world.state, body)
    assert policy == (
        grpc.StatusCode.NOT_FOUND,
        "model 'pipeline' is a meta model; this RPC takes models only",
    )
    assert residency[0] is grpc.StatusCode.NOT_FOUND
    assert "internal to meta" in residency[1]
    assert world.runtime.weights.residency(EMBED) is Residency.PINNED_SYSTEM


def test_compact_memory_reloads_the_sub_models_of_a_meta(
    make_world: Callable[..., World], metas: Metas
) -> None:
    world = group_world(make_world, metas)
    weights = world.runtime.weights

    async def body(stub: Stub) -> tuple[int, tuple[grpc.StatusCode, str]]:
        compacted = await stub.CompactMemory(control_pb2.CompactMemoryRequest(reload_models=[META]))
        hidden = await _error(
            stub.CompactMemory(control_pb2.CompactMemoryRequest(reload_models=[SCORE]))
        )
        return int(compacted.reloaded_models), hidden

    reloaded, hidden = serve(world.state, body)
    assert reloaded == 2  # pipeline_embed and pipeline_score
    assert weights.is_resident(EMBED)
    assert weights.is_resident(SCORE)
    assert not weights.is_resident(HOOKED)
    assert hidden[0] is grpc.StatusCode.NOT_FOUND
    assert "internal to meta 'pipeline'" in hidden[1]
