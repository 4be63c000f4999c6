"""Meta models in the server: lifecycle changes and load-time rejections.

Real bundles throughout (see ``_meta_fixtures``): metas are installed, reloaded, renamed and
unloaded by ``ModelLifecycle`` on a started runtime, and broken meta bundles are refused by
``boot.load_model``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import grpc
import numpy as np
import pytest
import yaml

from packages.worker.tests._meta_fixtures import (
    Metas,
    constant_source,
    fixed_source,
    infer,
    loaded,
    make_world,
    metas,
)
from packages.worker.tests._world import World
from packages.worker.tests.meta._metaworld import (
    EMBED,
    HOOKED,
    META,
    SCORE,
    entry_of,
    items,
    seen,
    stages,
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
from reactantserver.worker.registry import ModelState
from reactantserver.worker.repository.boot import Booted, load_model
from reactantserver.worker.repository.digest import BundleDigester
from reactantserver.worker.repository.lifecycle import ModelLifecycle
from reactantserver.worker.repository.watcher import start_lifecycle
from reactantserver.worker.runtime import Residency
from reactantserver.worker.state import WorkerState

__all__ = ["loaded", "make_world", "metas"]  # fixtures, imported by name for pytest


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


def test_a_meta_loaded_at_start_up_is_adopted_not_reloaded(
    make_world: Callable[..., World], metas: Metas
) -> None:
    # start_lifecycle hands start-up models to the lifecycle; a meta (nothing scheduled) must
    # be adopted like any model, so an explicit load of the unchanged bundle only pins it.
    exported = metas.exported
    world = make_world(
        [exported.embed, exported.score, exported.pipeline],
        mode=ModelControlMode.EXPLICIT,
        budget=1 << 20,
        model_dirs=[exported.root],
    )
    digester = BundleDigester()
    found = {
        name: seen(path, digester)
        for name, path in (
            (EMBED, exported.embed),
            (SCORE, exported.score),
            (META, exported.pipeline),
        )
    }
    runtime = world.state.runtime
    assert runtime is not None
    changes = start_lifecycle(world.state, runtime, Booted(found, digester)).lifecycle
    assert not changes.known[META].failed
    before = entry_of(world, META)
    changes.load_explicit(META)
    after = entry_of(world, META)
    assert after is before  # same generation: nothing re-imported
    assert after.generation == before.generation
    assert world.state.model_ready(META)


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
