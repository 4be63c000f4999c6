"""ModelLifecycle on a running runtime: reload, failed reload, drained unload, rename in place."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

from packages.worker.tests._world import World, start_world, world_config
from packages.worker.tests.conftest import BundleMaker, Tensor
from reactantserver.core.errors import ModelNotFoundError
from reactantserver.core.hooks import NamedTensor
from reactantserver.worker.registry import ModelState
from reactantserver.worker.repository.digest import BundleDigester, dir_identity
from reactantserver.worker.repository.lifecycle import ModelLifecycle
from reactantserver.worker.repository.reconcile import Seen
from reactantserver.worker.scheduler import FutureCompletion

FEATURES = 8
X = Tensor("x", "f32", "nk", {"k": FEATURES})
Y = Tensor("y", "f32", "nk", {"k": FEATURES})
W1 = np.full(FEATURES, 2.0, np.float32)
W2 = np.full(FEATURES, 3.0, np.float32)
ONES = np.ones((1, FEATURES), np.float32)


def _scale(x: jax.Array, w: jax.Array) -> jax.Array:
    return x * w


def _seen(path: Path, digester: BundleDigester) -> Seen:
    return Seen(path, dir_identity(path), digester.digest(path))


def _write_weights(bundle: Path, w: np.ndarray) -> None:
    save_file(
        {"w": w},
        str(bundle / "weights.safetensors"),
        metadata={"argument_order": json.dumps(["w"])},
    )


@pytest.fixture
def setup(make_bundle: BundleMaker, tmp_path: Path) -> Iterator[tuple[World, ModelLifecycle, Path]]:
    bundle = make_bundle(
        "m", _scale, inputs=[X], outputs=[Y], weights=[("w", W1)], batch_sizes=[1, 4]
    )
    world = start_world(world_config(tmp_path / "cache"), [bundle])
    lifecycle = ModelLifecycle(world.state, world.runtime)
    entry = world.state.registry.get("m")
    assert entry is not None
    lifecycle.adopt(entry, _seen(bundle, lifecycle.digester))
    try:
        yield world, lifecycle, bundle
    finally:
        world.close()


def _infer(world: World, name: str) -> np.ndarray:
    out = world.runtime.scheduler.call(name, [NamedTensor("x", ONES)])
    return np.asarray(out[0])


def _weight_keys(world: World) -> list[str]:
    return sorted(world.runtime.weights)


def test_reload_swaps_the_generation_and_frees_the_old_one(
    setup: tuple[World, ModelLifecycle, Path],
) -> None:
    world, lifecycle, bundle = setup
    np.testing.assert_allclose(_infer(world, "m"), ONES * 2.0)
    _write_weights(bundle, W2)
    entry = lifecycle.install("m", _seen(bundle, lifecycle.digester))
    assert entry.generation == 2
    assert world.state.registry.resolve("m") is entry
    np.testing.assert_allclose(_infer(world, "m"), ONES * 3.0)
    # The old generation drained (nothing queued) and its weights left the cache.
    world.runtime.scheduler.control(lambda: None).result()
    assert _weight_keys(world) == ["m"]
    assert lifecycle.known["m"].digest == lifecycle.digester.digest(bundle)


def test_failed_reload_keeps_the_old_generation_serving(
    setup: tuple[World, ModelLifecycle, Path],
) -> None:
    world, lifecycle, bundle = setup
    (bundle / "manifest.yaml").write_text("format_version: [\n")
    seen = _seen(bundle, lifecycle.digester)
    with pytest.raises(Exception, match="manifest"):
        lifecycle.install("m", seen)
    entry = world.state.registry.get("m")
    assert entry is not None
    assert entry.state is ModelState.READY
    assert entry.reason.startswith("reload failed:")
    assert lifecycle.known["m"].failed
    assert lifecycle.known["m"].digest == seen.digest
    assert world.state.loads["m"].failures == 1
    np.testing.assert_allclose(_infer(world, "m"), ONES * 2.0)
    assert _weight_keys(world) == ["m"]


def test_unload_drains_queued_requests_then_frees(
    setup: tuple[World, ModelLifecycle, Path],
) -> None:
    world, lifecycle, _bundle = setup
    scheduler = world.runtime.scheduler
    gate = threading.Event()
    blocked = scheduler.control(gate.wait)  # holds the dispatch thread
    completions = [FutureCompletion() for _ in range(5)]
    for completion in completions:
        scheduler.submit("m", [NamedTensor("x", ONES)], completion=completion)
    unloading = threading.Thread(target=lifecycle.unload, args=("m",))
    unloading.start()
    gate.set()
    blocked.result()
    unloading.join()
    for completion in completions:  # served by the retiring generation, not dropped
        np.testing.assert_allclose(completion.future.result(timeout=10)[0], ONES * 2.0)
    with pytest.raises(ModelNotFoundError):
        world.state.registry.resolve("m")
    with pytest.raises(ModelNotFoundError):
        scheduler.call("m", [NamedTensor("x", ONES)])
    scheduler.control(lambda: None).result()
    assert _weight_keys(world) == []
    assert "m" not in lifecycle.known


def test_rename_in_place_keeps_the_executables(
    setup: tuple[World, ModelLifecycle, Path],
) -> None:
    world, lifecycle, bundle = setup
    before = world.runtime.scheduler.model("m")
    moved = bundle.with_name("n")
    bundle.rename(moved)
    lifecycle.rename("m", "n", _seen(moved, lifecycle.digester))
    assert world.runtime.scheduler.model("n") is before
    assert world.runtime.scheduler.model("m") is None
    entry = world.state.registry.resolve("n")
    assert entry.manifest is not None
    assert entry.manifest.name == "n"
    assert world.state.registry.get("m") is None
    assert _weight_keys(world) == ["n"]
    np.testing.assert_allclose(_infer(world, "n"), ONES * 2.0)
    assert set(lifecycle.known) == {"n"}


def test_first_load_failure_lists_the_model_unavailable(
    make_bundle: BundleMaker, setup: tuple[World, ModelLifecycle, Path]
) -> None:
    world, lifecycle, bundle = setup
    broken = bundle.parent / "b"
    broken.mkdir()
    (broken / "manifest.yaml").write_text("format_version: '3.0'\n")
    with pytest.raises(ValueError, match="manifest"):
        lifecycle.install("b", _seen(broken, lifecycle.digester))
    entry = world.state.registry.get("b")
    assert entry is not None
    assert entry.state is ModelState.UNAVAILABLE
    assert entry.reason
    assert lifecycle.known["b"].failed
    assert not lifecycle.known["b"].serving
