"""WorkerControl over a real grpc.aio server, real jax bundles and a running scheduler."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import grpc
import jax
import numpy as np
import pytest

from packages.worker.tests._world import World, start_world, world_config
from packages.worker.tests.conftest import BundleMaker, Tensor
from reactantserver.core.config import ModelControlMode, SchedulingDiscipline, WorkerConfig
from reactantserver.core.errors import ModelUnavailableError
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.protocol import control_pb2, control_pb2_grpc
from reactantserver.worker.registry import ModelEntry
from reactantserver.worker.runtime import Residency
from reactantserver.worker.state import WorkerState
from reactantserver.worker.transport.control import add_control_service

_T = TypeVar("_T")
Stub = Any  # control_pb2_grpc.WorkerControlAsyncStub (typing-only in the generated stubs)

FEATURES = 256
NBYTES = FEATURES * 4  # one f32 weight vector per model
W = np.linspace(1.0, 2.0, FEATURES, dtype=np.float32)
# alpha: batch axis first ("nk"); beta: batch axis second ("kn"), so its wire axis is 2.
ALPHA_X = Tensor("x", "f32", "nk", {"k": FEATURES})
ALPHA_Y = Tensor("y", "f32", "nk", {"k": FEATURES})
BETA_X = Tensor("x", "f32", "kn", {"k": FEATURES})
BETA_Y = Tensor("y", "f32", "kn", {"k": FEATURES})

UNPINNED = control_pb2.UNPINNED
PINNED_SYSTEM = control_pb2.PINNED_SYSTEM
PINNED_DEVICE = control_pb2.PINNED_DEVICE


def _rows(x: jax.Array, w: jax.Array) -> jax.Array:
    return x * w


def _columns(x: jax.Array, w: jax.Array) -> jax.Array:
    return x * w[:, None]


WorldMaker = Callable[..., World]


@pytest.fixture
def make_world(make_bundle: BundleMaker, tmp_path: Path) -> Iterator[WorldMaker]:
    bundles = [
        make_bundle(
            "alpha", _rows, inputs=[ALPHA_X], outputs=[ALPHA_Y], weights=[("w", W)],
            batch_sizes=[1, 4],
        ),
        make_bundle(
            "beta", _columns, inputs=[BETA_X], outputs=[BETA_Y], weights=[("w", W)],
            batch_sizes=[1, 4],
        ),
    ]  # fmt: skip
    worlds: list[World] = []

    def make(
        *,
        mode: ModelControlMode = ModelControlMode.DYNAMIC,
        discipline: SchedulingDiscipline = SchedulingDiscipline.FAIR,
        cache: bool = True,
        budget: int = 100 * NBYTES,
        residency: Mapping[str, str] | None = None,
        worker_name: str | None = None,
    ) -> World:
        config = world_config(
            tmp_path / "cache",
            mode=mode,
            discipline=discipline,
            budget=budget if cache else 0,
            residency=residency,
            worker_name=worker_name,
        )
        world = start_world(config, bundles)
        worlds.append(world)
        world.state.registry.put(ModelEntry.loading("compiling"))
        world.state.registry.put(ModelEntry.failed("broken", "manifest.yaml: bad dtype"))
        return world

    try:
        yield make
    finally:
        for world in worlds:
            world.close()


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


async def _error(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), caught.value.details()


async def _infer(world: World, name: str, rows: int) -> list[Any]:
    shape = (rows, FEATURES) if name == "alpha" else (FEATURES, rows)
    x = np.ones(shape, np.float32)
    return await world.runtime.scheduler.infer(name, [NamedTensor("x", x)])


def _status(stub: Stub) -> Awaitable[control_pb2.ModelControlStatusResponse]:
    result: Awaitable[control_pb2.ModelControlStatusResponse]
    result = stub.ModelControlStatus(control_pb2.ModelControlStatusRequest())
    return result


def _residency(stub: Stub, name: str, target: int) -> Awaitable[Any]:
    result: Awaitable[Any] = stub.SetModelResidency(
        control_pb2.SetModelResidencyRequest(name=name, target=target)  # type: ignore[arg-type]
    )
    return result


def _by_name(response: control_pb2.ModelControlStatusResponse) -> dict[str, Any]:
    return {m.name: m for m in response.models}


# -- ModelControlStatus ------------------------------------------------------------------------


def test_status_reports_every_ready_model(make_world: WorldMaker) -> None:
    world = make_world(discipline=SchedulingDiscipline.FIFO, budget=10 * NBYTES, worker_name="w0")

    async def body(stub: Stub) -> control_pb2.ModelControlStatusResponse:
        await _infer(world, "alpha", 3)
        return await _status(stub)

    response = serve(world.state, body)
    assert response.residency_mode == "self_managed"
    assert response.discipline == "fifo"
    assert response.weight_cache_max_bytes == 10 * NBYTES
    assert response.weight_load_bytes_total == NBYTES
    assert response.weight_load_seconds_total > 0
    assert response.worker_name == "w0"
    assert response.device_kind == "cpu"
    assert response.pinned_bytes == 0
    # Loading and failed models are left out; the rest sorted by name.
    assert [m.name for m in response.models] == ["alpha", "beta"]
    alpha, beta = response.models
    assert alpha.residency == PINNED_SYSTEM
    assert (alpha.device_resident, alpha.host_resident) == (True, True)
    assert alpha.weight_nbytes == NBYTES
    assert alpha.weight == 1.0
    assert alpha.queue_depth == 0
    assert alpha.total_compute_seconds > 0
    assert (alpha.requests_served, alpha.dispatch_count, alpha.rows_served) == (1, 1, 3)
    assert alpha.max_batch_size == 4
    assert (alpha.batch_input_name, alpha.batch_axis) == ("x", 1)
    assert alpha.kind == "model"
    assert list(alpha.sub_models) == []
    assert alpha.weight_loads == 1  # its one request loaded it on demand
    assert (beta.device_resident, beta.host_resident) == (False, True)
    assert beta.weight_loads == 0
    assert (beta.requests_served, beta.dispatch_count, beta.rows_served) == (0, 0, 0)
    assert (beta.batch_input_name, beta.batch_axis) == ("x", 2)


def test_status_without_the_cache_and_in_explicit_mode(make_world: WorldMaker) -> None:
    cacheless = serve(make_world(cache=False).state, _status)
    assert cacheless.weight_cache_max_bytes == 0
    assert cacheless.discipline == "fair"
    assert cacheless.worker_name == ""
    # Without the cache every model went to the device at admission and stays there.
    assert cacheless.weight_load_bytes_total == 2 * NBYTES
    for model in cacheless.models:
        assert model.residency == UNPINNED
        assert (model.device_resident, model.host_resident) == (True, False)

    explicit = make_world(mode=ModelControlMode.EXPLICIT, discipline=SchedulingDiscipline.EDF)
    response = serve(explicit.state, _status)
    assert response.residency_mode == "externally_managed"
    assert response.discipline == "edf"
    assert response.weight_load_bytes_total == 0
    for model in response.models:
        assert (model.residency, model.device_resident) == (PINNED_SYSTEM, False)


def test_status_reports_configured_floors(make_world: WorldMaker) -> None:
    world = make_world(residency={"alpha": "unpinned", "beta": "device"})
    response = serve(world.state, _status)
    alpha, beta = response.models
    assert (alpha.residency, alpha.device_resident, alpha.host_resident) == (
        UNPINNED,
        False,
        False,
    )
    # A device floor loads at admission and counts as pinned, outside the budget.
    assert (beta.residency, beta.device_resident) == (PINNED_DEVICE, True)
    assert response.pinned_bytes == NBYTES
    assert response.weight_load_bytes_total == NBYTES


# -- SetModelResidency -------------------------------------------------------------------------


def test_pin_and_unpin_round_trip_in_explicit_mode(make_world: WorldMaker) -> None:
    world = make_world(mode=ModelControlMode.EXPLICIT, budget=NBYTES + NBYTES // 2)
    state, scheduler = world.state, world.runtime.scheduler
    assert not state.model_ready("alpha")

    async def body(stub: Stub) -> None:
        pinned = await _residency(stub, "alpha", PINNED_DEVICE)
        assert pinned.residency == PINNED_DEVICE
        alpha = _by_name(await _status(stub))["alpha"]
        assert (alpha.residency, alpha.device_resident, alpha.host_resident) == (
            PINNED_DEVICE,
            True,
            False,
        )
        assert state.model_ready("alpha")
        # Warmed inside the same call: every compiled size has a measured cost.
        assert scheduler.costs.measured("alpha", 1) is not None
        assert scheduler.costs.measured("alpha", 4) is not None
        (y,) = await _infer(world, "alpha", 2)
        np.testing.assert_allclose(y, np.broadcast_to(W, (2, FEATURES)))
        # beta is not resident: the worker never loads it by itself.
        with pytest.raises(ModelUnavailableError, match="not resident"):
            await _infer(world, "beta", 1)
        # Pinned models are outside the budget; explicit mode ignores the reload list.
        compacted = await stub.CompactMemory(
            control_pb2.CompactMemoryRequest(reload_models=["beta"])
        )
        assert (compacted.reloaded_models, compacted.resident_bytes_after) == (0, 0)
        full = await _status(stub)
        assert full.pinned_bytes == NBYTES
        assert _by_name(full)["alpha"].device_resident

        unpinned = await _residency(stub, "alpha", UNPINNED)
        assert unpinned.residency == UNPINNED
        alpha = _by_name(await _status(stub))["alpha"]
        assert (alpha.residency, alpha.device_resident, alpha.host_resident) == (
            UNPINNED,
            False,
            False,
        )
        assert not state.model_ready("alpha")
        system = await _residency(stub, "alpha", PINNED_SYSTEM)
        assert system.residency == PINNED_SYSTEM
        after = await _status(stub)
        assert after.pinned_bytes == 0
        assert _by_name(after)["alpha"].host_resident

    serve(state, body)


def test_set_residency_errors(make_world: WorldMaker) -> None:
    world = make_world(mode=ModelControlMode.EXPLICIT)

    async def body(stub: Stub) -> list[tuple[grpc.StatusCode, str]]:
        return [
            await _error(_residency(stub, "alpha", control_pb2.RESIDENCY_UNSPECIFIED)),
            await _error(_residency(stub, "alpha", 9)),
            await _error(_residency(stub, "nope", PINNED_DEVICE)),
            await _error(_residency(stub, "compiling", PINNED_DEVICE)),
            await _error(_residency(stub, "broken", PINNED_DEVICE)),
        ]

    unspecified, unknown_enum, unknown, loading, failed = serve(world.state, body)
    assert unspecified[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert "'alpha'" in unspecified[1]
    assert unknown_enum[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert unknown[0] is grpc.StatusCode.NOT_FOUND
    assert "'nope'" in unknown[1]
    assert loading[0] is grpc.StatusCode.UNAVAILABLE
    assert failed == (
        grpc.StatusCode.UNAVAILABLE,
        "model 'broken' is unavailable: manifest.yaml: bad dtype",
    )
    assert world.runtime.weights.residency("alpha") is Residency.PINNED_SYSTEM


@pytest.mark.parametrize(
    ("mode", "cache"),
    [
        (ModelControlMode.DYNAMIC, True),
        (ModelControlMode.STATIC, True),
        (ModelControlMode.EXPLICIT, False),
    ],
)
def test_set_residency_needs_explicit_mode_and_the_cache(
    make_world: WorldMaker, mode: ModelControlMode, cache: bool
) -> None:
    world = make_world(mode=mode, cache=cache)

    async def body(stub: Stub) -> tuple[grpc.StatusCode, str]:
        return await _error(_residency(stub, "alpha", PINNED_DEVICE))

    code, message = serve(world.state, body)
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert "'alpha'" in message
    assert "explicit" in message


# -- SetModelPolicy ----------------------------------------------------------------------------


def test_policy_change_is_visible_in_the_status(make_world: WorldMaker) -> None:
    world = make_world()

    async def body(stub: Stub) -> None:
        policy = control_pb2.SetModelPolicyRequest
        await stub.SetModelPolicy(policy(name="beta", has_weight=True, weight=3.5))
        # Without has_weight the weight field is ignored (even an invalid one).
        await stub.SetModelPolicy(policy(name="alpha", weight=0.0))
        models = _by_name(await _status(stub))
        assert (models["alpha"].weight, models["beta"].weight) == (1.0, 3.5)

    serve(world.state, body)
    beta = world.runtime.scheduler.model("beta")
    assert beta is not None
    assert beta.weight == 3.5


def test_policy_errors(make_world: WorldMaker) -> None:
    world = make_world()
    policy = control_pb2.SetModelPolicyRequest
    bad_weights = [0.0, -1.0, math.nan, math.inf]

    async def body(stub: Stub) -> tuple[list[tuple[grpc.StatusCode, str]], ...]:
        invalid = [
            await _error(stub.SetModelPolicy(policy(name="alpha", has_weight=True, weight=w)))
            for w in bad_weights
        ]
        missing = [
            await _error(stub.SetModelPolicy(policy(name="nope", has_weight=True, weight=2.0))),
            await _error(stub.SetModelPolicy(policy(name="nope"))),
            await _error(stub.SetModelPolicy(policy(name=""))),
        ]
        return invalid, missing

    invalid, missing = serve(world.state, body)
    for code, message in invalid:
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert "'alpha'" in message
    for code, _message in missing:
        assert code is grpc.StatusCode.NOT_FOUND
    model = world.runtime.scheduler.model("alpha")
    assert model is not None
    assert model.weight == 1.0


# -- CompactMemory -----------------------------------------------------------------------------


def test_compaction_frees_and_reloads(make_world: WorldMaker) -> None:
    world = make_world()
    weights = world.runtime.weights

    async def body(stub: Stub) -> None:
        await _infer(world, "alpha", 1)
        await _infer(world, "beta", 1)
        before = _by_name(await _status(stub))
        assert before["alpha"].device_resident
        assert before["beta"].device_resident

        request = control_pb2.CompactMemoryRequest
        code, message = await _error(stub.CompactMemory(request(reload_models=["beta", "x1"])))
        assert code is grpc.StatusCode.NOT_FOUND
        assert "'x1'" in message
        assert weights.compactions == 0  # checked before doing anything

        response = await stub.CompactMemory(request(reload_models=["beta"]))
        assert (response.reloaded_models, response.resident_bytes_after) == (1, NBYTES)
        after = _by_name(await _status(stub))
        assert (after["alpha"].device_resident, after["beta"].device_resident) == (False, True)

        empty = await stub.CompactMemory(request())
        assert (empty.reloaded_models, empty.resident_bytes_after) == (0, 0)

    serve(world.state, body)
    assert weights.compactions == 2


# -- start-up and shutdown ---------------------------------------------------------------------


async def _every_rpc(stub: Stub) -> list[tuple[grpc.StatusCode, str]]:
    return [
        await _error(_status(stub)),
        await _error(_residency(stub, "alpha", PINNED_DEVICE)),
        await _error(stub.SetModelPolicy(control_pb2.SetModelPolicyRequest(name="alpha"))),
        await _error(stub.CompactMemory(control_pb2.CompactMemoryRequest())),
    ]


def test_unavailable_while_starting() -> None:
    state = WorkerState(WorkerConfig(), version="0.0.test")
    for code, message in serve(state, _every_rpc):
        assert (code, message) == (grpc.StatusCode.UNAVAILABLE, "worker is starting")


def test_unavailable_while_stopping(make_world: WorldMaker) -> None:
    world = make_world(mode=ModelControlMode.EXPLICIT)
    world.state.stopping = True
    for code, message in serve(world.state, _every_rpc):
        assert code is grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in message
