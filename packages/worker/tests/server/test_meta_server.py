"""Meta models in the server: groups, readiness, control, lifecycle, load-time checks (07).

Real bundles throughout: the pipeline example's jax sub-models, metas written with
``reactantserver.export.write_bundle(kind="meta")``, loaded by ``boot.load_model`` /
``ModelLifecycle`` on a started runtime; ``WorkerControl`` is served by a real ``grpc.aio``
server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import grpc
import numpy as np
import pytest
import yaml

from packages.worker.tests.meta._metaworld import (
    EMBED,
    HOOKED,
    META,
    SCORE,
    Exported,
    entry_of,
    export_bundles,
    items,
    meta_config,
    seen,
    stages,
    start_meta_world,
    write_meta,
)
from reactantserver.core.config import ModelControlMode
from reactantserver.core.errors import (
    BundleError,
    FailedPreconditionError,
    ManifestError,
    ModelNotFoundError,
    ModelUnavailableError,
    status_of,
)
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.protocol import control_pb2, control_pb2_grpc
from reactantserver.core.types import InferRequest, InferResponse
from reactantserver.worker.registry import ModelEntry, ModelRegistry, ModelState
from reactantserver.worker.runtime import Residency
from reactantserver.worker.server.boot import load_model
from reactantserver.worker.server.control import add_control_service
from reactantserver.worker.server.lifecycle import ModelLifecycle
from reactantserver.worker.server.state import WorkerState

from ._world import World

_T = TypeVar("_T")
Stub = Any  # control_pb2_grpc.WorkerControlStub (typing-only in the generated stubs)

EMBED_ONLY = "embed_only"
GHOSTLY = "ghostly"
NESTED = "nested"

CONSTANT_SOURCE = """\
import numpy as np


def run(inputs, call):
    (items,) = inputs
    (emb,) = call("pipeline_embed", [NamedTensor("x", items.data)])
    rows = emb.shape[0]
    return [
        NamedTensor("scores", np.full(rows, {value}, np.float32)),
        NamedTensor("indices", np.arange(rows, dtype=np.int64)),
    ]


register_meta_model("{name}", run=run)
"""
"""A meta calling ``pipeline_embed`` and answering ``value`` for every row."""


def constant_source(name: str, value: float) -> str:
    return CONSTANT_SOURCE.replace("{value}", repr(value)).replace("{name}", name)


def fixed_source(name: str) -> str:
    """A meta that never calls its callees (enough to load it)."""
    return (
        "import numpy as np\n\n\n"
        "def run(inputs, call):\n"
        '    return [NamedTensor("scores", np.zeros(1, np.float32)),\n'
        '            NamedTensor("indices", np.zeros(1, np.int64))]\n\n\n'
        f'register_meta_model("{name}", run=run)\n'
    )


@attrs.frozen
class Metas:
    """The exported bundles plus this module's extra metas (in a directory of their own)."""

    exported: Exported
    embed_only: Path
    ghostly: Path
    nested: Path


@pytest.fixture(scope="module")
def metas(tmp_path_factory: pytest.TempPathFactory) -> Metas:
    exported = export_bundles(tmp_path_factory.mktemp("models"))
    extra = tmp_path_factory.mktemp("metas")
    return Metas(
        exported,
        write_meta(extra, EMBED_ONLY, [EMBED], constant_source(EMBED_ONLY, 7.0)),
        write_meta(extra, GHOSTLY, ["ghost"], fixed_source(GHOSTLY)),
        write_meta(extra, NESTED, [META], fixed_source(NESTED)),
    )


@pytest.fixture
def make_world(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., World]]:
    worlds: list[World] = []

    def make(bundles: Sequence[Path], **settings: Any) -> World:
        config = meta_config(tmp_path_factory.getbasetemp() / "meta-cache", **settings)
        world = start_meta_world(config, bundles)
        worlds.append(world)
        return world

    try:
        yield make
    finally:
        for world in worlds:
            world.close()


@pytest.fixture(scope="module")
def loaded(metas: Metas, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One world with every bundle loaded (``nested`` compiled while no meta was loaded)."""
    config = meta_config(tmp_path_factory.getbasetemp() / "meta-cache")
    exported = metas.exported
    world = start_meta_world(config, [exported.embed, exported.score, exported.hooked])
    try:
        for path in (metas.nested, exported.pipeline, metas.embed_only, metas.ghostly):
            world.bundles.append(load_model(world.state, world.runtime, path))
        yield world
    finally:
        world.close()


def entry(world: World, name: str) -> ModelEntry:
    """The compiled entry of ``name`` in ``world`` (registered or not)."""
    for bundle in world.bundles:
        if bundle.entry.name == name:
            return bundle.entry
    raise AssertionError(f"{name} was not loaded")


def registry_of(world: World, *names: str, expose: bool = False) -> ModelRegistry:
    registry = ModelRegistry(expose_sub_models=expose)
    for name in names:
        registry.put(entry(world, name))
    return registry


def is_hidden(registry: ModelRegistry, name: str) -> bool:
    """Whether ``name``'s entry (which must exist) is hidden from clients."""
    found = registry.get(name)
    assert found is not None, name
    return found.hidden


def infer(world: World, name: str, x: np.ndarray[Any, Any]) -> InferResponse:
    request = InferRequest(model_name=name, inputs=[NamedTensor("items", x)])
    return asyncio.run(world.runtime.dataplane.infer(request))


# -- registry groups -------------------------------------------------------------------------


def test_a_loaded_meta_owns_its_callees(loaded: World) -> None:
    registry = registry_of(loaded, EMBED, SCORE, HOOKED, META, EMBED_ONLY)
    assert registry.owners(EMBED) == (EMBED_ONLY, META)
    assert registry.owners(SCORE) == (META,)
    assert registry.owners(HOOKED) == ()
    assert registry.owners(META) == ()
    assert [e.name for e in registry.metas()] == [EMBED_ONLY, META]
    assert entry(loaded, META).is_meta
    assert entry(loaded, META).installed
    assert entry(loaded, META).scheduled is None
    assert not entry(loaded, EMBED).is_meta


def test_hidden_flags_follow_every_put_and_remove(loaded: World) -> None:
    registry = registry_of(loaded, EMBED, SCORE, HOOKED)
    assert [e.name for e in registry.visible()] == [HOOKED, EMBED, SCORE]
    registry.put(entry(loaded, META))
    hidden = {name: is_hidden(registry, name) for name in (EMBED, SCORE, HOOKED, META)}
    assert hidden == {EMBED: True, SCORE: True, HOOKED: False, META: False}
    assert [e.name for e in registry.visible()] == [HOOKED, META]
    registry.put(entry(loaded, EMBED_ONLY))
    registry.remove(META)  # embed_only still owns pipeline_embed
    assert [e.name for e in registry.visible()] == [EMBED_ONLY, HOOKED, SCORE]
    assert is_hidden(registry, EMBED)
    registry.remove(EMBED_ONLY)
    assert [e.name for e in registry.visible()] == [HOOKED, EMBED, SCORE]
    assert registry.owners(EMBED) == ()


def test_a_sub_model_put_after_its_meta_is_hidden_on_arrival(loaded: World) -> None:
    registry = registry_of(loaded, META)
    registry.put(entry(loaded, EMBED))
    assert is_hidden(registry, EMBED)
    # A reload replaces the entry whole: the new one is hidden too.
    registry.put(attrs.evolve(entry(loaded, EMBED), reason="reloaded"))
    assert is_hidden(registry, EMBED)


def test_a_hidden_sub_model_is_not_found_to_clients(loaded: World) -> None:
    registry = registry_of(loaded, EMBED, SCORE, META, EMBED_ONLY)
    for lookup in (registry.find, registry.resolve):
        with pytest.raises(ModelNotFoundError) as caught:
            lookup(SCORE)
        assert str(caught.value) == "model 'pipeline_score' is internal to meta 'pipeline'"
        assert status_of(caught.value) is grpc.StatusCode.NOT_FOUND
    with pytest.raises(ModelNotFoundError, match="internal to meta 'embed_only' or 'pipeline'"):
        registry.find(EMBED)
    assert registry.get(EMBED) is not None  # the worker itself still reaches it
    assert registry.resolve(META).name == META


def test_expose_sub_models_hides_nothing_but_keeps_the_groups(loaded: World) -> None:
    registry = registry_of(loaded, EMBED, SCORE, META, expose=True)
    assert registry.owners(EMBED) == (META,)
    assert [e.name for e in registry.visible()] == [META, EMBED, SCORE]
    assert registry.resolve(EMBED).name == EMBED


def test_a_failed_meta_hides_nothing(loaded: World) -> None:
    registry = registry_of(loaded, EMBED, SCORE)
    registry.put(ModelEntry.failed(META, "model.py: import failed"))
    registry.put(ModelEntry.loading(EMBED_ONLY))
    assert registry.owners(EMBED) == ()
    assert registry.metas() == []
    assert [e.name for e in registry.visible()] == [EMBED_ONLY, META, EMBED, SCORE]
    with pytest.raises(ModelUnavailableError, match=r"model\.py: import failed"):
        registry.resolve(META)
    # The failed entry replacing a loaded meta gives its sub-models back.
    registry.put(entry(loaded, META))
    assert is_hidden(registry, SCORE)
    registry.put(ModelEntry.failed(META, "reload failed"))
    assert not is_hidden(registry, SCORE)


def test_a_meta_named_by_another_meta_stays_visible(loaded: World) -> None:
    registry = registry_of(loaded, EMBED, SCORE, META, NESTED)
    assert registry.resolve(META).name == META
    assert not is_hidden(registry, META)


# -- readiness ---------------------------------------------------------------------------------


def state_with(world: World, *names: str) -> WorkerState:
    state = WorkerState(world.state.config, version="0.0.test")
    for name in names:
        state.registry.put(entry(world, name))
    state.started = True
    return state


def test_a_meta_serves_when_every_callee_does(loaded: World) -> None:
    state = state_with(loaded, EMBED, SCORE, META)
    meta = state.registry.get(META)
    assert meta is not None
    assert state.unavailable_reason(meta) is None
    assert state.serving(meta)
    assert state.model_ready(META)
    assert state.model_ready(META, "1")
    assert not state.model_ready(META, "2")
    assert not state.model_ready(EMBED)  # serving, but hidden
    assert state.ready()  # ServerReady: the only visible model is the meta


def test_a_meta_with_a_missing_callee_is_not_ready(loaded: World) -> None:
    state = state_with(loaded, EMBED, META, GHOSTLY)
    for name, missing in ((META, SCORE), (GHOSTLY, "ghost")):
        meta = state.registry.get(name)
        assert meta is not None
        assert state.unavailable_reason(meta) == f"sub-model '{missing}' is not loaded"
        assert not state.model_ready(name)
    state.registry.put(ModelEntry.loading(SCORE))
    meta = state.registry.get(META)
    assert meta is not None
    assert state.unavailable_reason(meta) == "sub-model 'pipeline_score' is not loaded"
    state.registry.put(entry(loaded, SCORE))
    assert state.model_ready(META)


def test_a_meta_calling_a_meta_is_not_ready(loaded: World) -> None:
    state = state_with(loaded, EMBED, SCORE, META, NESTED)
    nested = state.registry.get(NESTED)
    assert nested is not None
    assert state.unavailable_reason(nested) == (
        "sub-model 'pipeline' is a meta model; a meta may call regular models only"
    )
    assert not state.model_ready(NESTED)


def test_server_ready_needs_start_up_and_a_loaded_visible_model(loaded: World) -> None:
    state = state_with(loaded, META)  # no sub-model loaded: the meta does not serve...
    assert not state.model_ready(META)
    assert state.ready()  # ...but ServerReady counts loaded models
    state.started = False
    assert not state.ready()


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


# -- lifecycle -------------------------------------------------------------------------------


Lifecycle = tuple[World, ModelLifecycle, Path]


@pytest.fixture
def lifecycle(make_world: Callable[..., World], metas: Metas, tmp_path: Path) -> Lifecycle:
    """The two stages loaded and adopted; metas are installed from ``tmp_path``."""
    exported = metas.exported
    world = make_world([exported.embed, exported.score])
    changes = ModelLifecycle(world.state, world.runtime)
    for name, path in ((EMBED, exported.embed), (SCORE, exported.score)):
        changes.adopt(entry_of(world, name), seen(path, changes.digester))
    return world, changes, tmp_path


def test_installing_a_meta_hides_its_callees_and_serves_it(lifecycle: Lifecycle) -> None:
    world, changes, root = lifecycle
    bundle = write_meta(root, "glue", [EMBED], constant_source("glue", 1.5))
    installed = changes.install("glue", seen(bundle, changes.digester))
    assert installed.is_meta
    assert world.state.registry.get("glue") is installed
    assert world.state.registry.owners(EMBED) == ("glue",)
    assert entry_of(world, EMBED).hidden
    assert not entry_of(world, SCORE).hidden
    assert world.state.model_ready("glue")
    response = infer(world, "glue", items(3))
    np.testing.assert_array_equal(response.outputs[0].data, np.full(3, 1.5, np.float32))
    assert world.state.loads["glue"].failures == 0


def test_reloading_a_meta_runs_the_new_code(lifecycle: Lifecycle) -> None:
    world, changes, root = lifecycle
    bundle = write_meta(root, "glue", [EMBED], constant_source("glue", 1.0))
    first = changes.install("glue", seen(bundle, changes.digester))
    np.testing.assert_array_equal(infer(world, "glue", items(2)).outputs[0].data, [1.0, 1.0])
    write_meta(root, "glue", [EMBED, SCORE], constant_source("glue", 2.0))
    second = changes.install("glue", seen(bundle, changes.digester))
    assert second.generation > first.generation
    assert second.meta is not None
    assert second.meta.calls == (EMBED, SCORE)
    np.testing.assert_array_equal(infer(world, "glue", items(2)).outputs[0].data, [2.0, 2.0])
    assert world.state.registry.owners(SCORE) == ("glue",)


def test_unloading_a_meta_gives_its_sub_models_back(lifecycle: Lifecycle) -> None:
    world, changes, root = lifecycle
    bundle = write_meta(root, "glue", [EMBED, SCORE], constant_source("glue", 1.0))
    changes.install("glue", seen(bundle, changes.digester))
    changes.unload("glue")
    registry = world.state.registry
    assert registry.get("glue") is None
    assert registry.owners(EMBED) == ()
    assert [e.name for e in registry.visible()] == [EMBED, SCORE]
    assert registry.resolve(EMBED).name == EMBED
    assert "glue" not in changes.known
    with pytest.raises(ModelNotFoundError):
        infer(world, "glue", items(1))


def test_renaming_a_meta_moves_the_group(lifecycle: Lifecycle) -> None:
    world, changes, root = lifecycle
    bundle = write_meta(root, "glue", [EMBED], constant_source("glue", 4.0))
    changes.install("glue", seen(bundle, changes.digester))
    world.state.meta_floors["glue"] = Residency.PINNED_SYSTEM
    moved = bundle.rename(root / "glue2")
    changes.rename("glue", "glue2", seen(moved, changes.digester))
    registry = world.state.registry
    assert registry.get("glue") is None
    renamed = entry_of(world, "glue2")
    assert renamed.meta is not None
    assert renamed.meta.name == "glue2"
    assert registry.owners(EMBED) == ("glue2",)
    assert entry_of(world, EMBED).hidden
    assert world.state.meta_floors == {"glue2": Residency.PINNED_SYSTEM}
    response = infer(world, "glue2", items(2))
    assert response.model_name == "glue2"
    np.testing.assert_array_equal(response.outputs[0].data, [4.0, 4.0])
    with pytest.raises(ModelNotFoundError):
        infer(world, "glue", items(1))


def test_renaming_a_meta_keeps_its_counters(lifecycle: Lifecycle) -> None:
    world, changes, root = lifecycle
    bundle = write_meta(root, "glue", [EMBED], constant_source("glue", 4.0))
    changes.install("glue", seen(bundle, changes.digester))
    for _ in range(2):
        infer(world, "glue", items(1))
    moved = bundle.rename(root / "glue2")
    changes.rename("glue", "glue2", seen(moved, changes.digester))
    scheduler = world.runtime.scheduler
    assert scheduler.stats("glue") is None
    renamed = scheduler.stats("glue2")
    assert renamed is not None
    assert renamed.requests_served == 2


def test_renaming_a_sub_model_a_meta_still_calls_warns(
    lifecycle: Lifecycle, metas: Metas, caplog: pytest.LogCaptureFixture
) -> None:
    world, changes, root = lifecycle
    bundle = write_meta(root, "glue", [EMBED], constant_source("glue", 1.0))
    changes.install("glue", seen(bundle, changes.digester))
    copy = Path(shutil.copytree(metas.exported.embed, root / "embed2"))
    with caplog.at_level("WARNING", logger="reactantserver.worker"):
        changes.rename(EMBED, "embed2", seen(copy, changes.digester))
    assert entry_of(world, "embed2").state is ModelState.READY
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("'glue'" in w and EMBED in w for w in warnings), warnings


def test_a_meta_calling_a_loaded_meta_is_refused(lifecycle: Lifecycle) -> None:
    world, changes, root = lifecycle
    inner = write_meta(root, "inner", [EMBED], constant_source("inner", 1.0))
    changes.install("inner", seen(inner, changes.digester))
    outer = write_meta(root, "outer", ["inner"], fixed_source("outer"))
    with pytest.raises(BundleError, match="calls 'inner', which is a meta model"):
        changes.install("outer", seen(outer, changes.digester))
    failed = entry_of(world, "outer")
    assert failed.state is ModelState.UNAVAILABLE
    assert "which is a meta model" in failed.reason
    assert not entry_of(world, "inner").hidden  # a failed caller owns nothing
    assert world.state.loads["outer"].failures == 1


def test_a_sub_model_of_a_loaded_meta_cannot_be_unloaded_by_request(
    lifecycle: Lifecycle,
) -> None:
    world, changes, root = lifecycle
    bundle = write_meta(root, "glue", [EMBED], constant_source("glue", 1.0))
    changes.install("glue", seen(bundle, changes.digester))
    with pytest.raises(FailedPreconditionError, match="sub-model of loaded meta 'glue'") as caught:
        changes.unload(EMBED, keep_groups=True)
    assert status_of(caught.value) is grpc.StatusCode.FAILED_PRECONDITION
    assert entry_of(world, EMBED).state is ModelState.READY
    changes.unload(SCORE, keep_groups=True)  # not in any group: fine
    assert world.state.registry.get(SCORE) is None
    # The watcher unloads a vanished sub-model anyway; the meta then stops serving.
    changes.unload(EMBED)
    glue = entry_of(world, "glue")
    assert world.state.unavailable_reason(glue) == "sub-model 'pipeline_embed' is not loaded"
    with pytest.raises(ModelUnavailableError, match="sub-model 'pipeline_embed'"):
        infer(world, "glue", items(1))


def test_a_meta_with_a_missing_callee_loads_with_a_warning(
    lifecycle: Lifecycle, caplog: pytest.LogCaptureFixture
) -> None:
    world, changes, root = lifecycle
    bundle = write_meta(root, "lonely", ["absent"], fixed_source("lonely"))
    with caplog.at_level("WARNING", logger="reactantserver.worker.boot"):
        changes.install("lonely", seen(bundle, changes.digester))
    assert any("'absent', which is not loaded" in record.getMessage() for record in caplog.records)
    lonely = entry_of(world, "lonely")
    assert lonely.state is ModelState.READY
    assert world.state.unavailable_reason(lonely) == "sub-model 'absent' is not loaded"


def test_explicit_load_of_a_meta_loads_and_pins_its_sub_models(
    make_world: Callable[..., World], metas: Metas
) -> None:
    exported = metas.exported
    world = make_world(
        [], mode=ModelControlMode.EXPLICIT, budget=1 << 20, model_dirs=[exported.root]
    )
    changes = ModelLifecycle(world.state, world.runtime)
    changes.load_explicit(META)
    registry, weights = world.state.registry, world.runtime.weights
    assert entry_of(world, META).is_meta
    for name in (EMBED, SCORE):
        sub = entry_of(world, name)
        assert sub.state is ModelState.READY
        assert sub.hidden
        assert weights.residency(name) is Residency.PINNED_DEVICE
    assert registry.get(HOOKED) is None  # only what the meta calls
    assert world.state.meta_floors == {META: Residency.PINNED_DEVICE}
    assert world.state.model_ready(META)
    x = items(8)
    scores, indices = infer(world, META, x).outputs
    want_scores, want_indices = stages(world, x)
    np.testing.assert_array_equal(indices.data, want_indices)
    np.testing.assert_allclose(scores.data, want_scores, rtol=1e-6)


# -- load-time rejections ----------------------------------------------------------------------


def _edit_manifest(bundle: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    path = bundle / "manifest.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data))


def _calls_itself(data: dict[str, Any]) -> None:
    data["meta"]["calls"].append("broken")


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda data: data.pop(key)


def _executable_inputs(data: dict[str, Any]) -> None:
    data["executable_inputs"] = [{"name": "x", "dtype": "f32", "shape": "nk", "dims": {"k": 16}}]


REGISTER_MODEL = 'register_model("broken")\n'
REGISTER_TWICE = (
    'register_meta_model("broken", run=lambda inputs, call: inputs)\n'
    'register_meta_model("broken", run=lambda inputs, call: inputs)\n'
)
NO_MODEL_PY = ""


@attrs.frozen
class Broken:
    """One way to break a valid meta bundle and what loading it must then say."""

    error: type[Exception]
    fragment: str
    manifest_edit: Callable[[dict[str, Any]], None] | None = None
    model_py: str | None = None
    """Replaces ``model.py`` (``NO_MODEL_PY``: deletes it)."""


@pytest.mark.parametrize(
    "broken",
    [
        Broken(ManifestError, "must not call itself ('broken')", manifest_edit=_calls_itself),
        Broken(
            ManifestError,
            "client_inputs: required and non-empty",
            manifest_edit=_drop("client_inputs"),
        ),
        Broken(
            ManifestError,
            "client_outputs: required and non-empty",
            manifest_edit=_drop("client_outputs"),
        ),
        Broken(
            ManifestError,
            "executable_inputs: must be absent or empty",
            manifest_edit=_executable_inputs,
        ),
        Broken(BundleError, "which must call register_meta_model()", model_py=REGISTER_MODEL),
        Broken(BundleError, "2 registrations", model_py=REGISTER_TWICE),
        Broken(ManifestError, "a meta model requires model.py", model_py=NO_MODEL_PY),
    ],
    ids=[
        "calls-itself",
        "no-client-inputs",
        "no-client-outputs",
        "executable-inputs",
        "register-model",
        "registers-twice",
        "no-model-py",
    ],
)
def test_a_broken_meta_bundle_is_refused_at_load(
    loaded: World, tmp_path: Path, broken: Broken
) -> None:
    bundle = write_meta(tmp_path, "broken", [EMBED], fixed_source("broken"))
    if broken.manifest_edit is not None:
        _edit_manifest(bundle, broken.manifest_edit)
    if broken.model_py == NO_MODEL_PY:
        (bundle / "model.py").unlink()
    elif broken.model_py is not None:
        (bundle / "model.py").write_text(broken.model_py)
    state = WorkerState(loaded.state.config, version="0.0.test")
    with pytest.raises(broken.error) as caught:
        load_model(state, loaded.runtime, bundle)
    assert type(caught.value) is broken.error
    assert broken.fragment in str(caught.value)
    assert str(bundle) in str(caught.value)  # the message names the bundle's file
