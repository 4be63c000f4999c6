"""Bundles on disk through the loader and the LRU weight cache: evict, reload, still correct."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from packages.worker.tests.conftest import BundleMaker, Tensor
from reactantserver.core.weights import PrivateWeightStore
from reactantserver.worker.runtime import (
    ExecutableCache,
    LoadedModel,
    Residency,
    WeightCache,
    load_bundle,
)
from reactantserver.worker.runtime.jax_backend import JaxBackend

X = Tensor("x", "f32", "nk", {"k": 32})
Y = Tensor("y", "f32", "nk", {"k": 32})


def _layer(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w)


@pytest.fixture
def models(
    make_bundle: BundleMaker, tmp_path: Path
) -> dict[str, tuple[LoadedModel, np.ndarray[Any, Any]]]:
    backend = JaxBackend("cpu")
    cache = ExecutableCache(tmp_path / "exe", backend)
    out = {}
    for i, name in enumerate("abc"):
        w = np.random.default_rng(i).standard_normal((32, 32)).astype(np.float32) / 8
        bundle = make_bundle(
            name, _layer, inputs=[X], outputs=[Y], weights=[("w", w)], batch_sizes=[2]
        )
        out[name] = (load_bundle(bundle, backend, cache), w)
    return out


@pytest.mark.parametrize("floor", [Residency.UNPINNED, Residency.PINNED_SYSTEM])
def test_three_models_one_budget(
    models: dict[str, tuple[LoadedModel, np.ndarray[Any, Any]]], floor: Residency
) -> None:
    backend = JaxBackend("cpu")
    one_model = 32 * 32 * 4
    cache = WeightCache(backend, budget=one_model)
    store = PrivateWeightStore()
    for name, (model, _) in models.items():
        cache.add_model(name, model.weight_source(store), floor)
        assert cache.host_resident(name) == (floor is Residency.PINNED_SYSTEM)
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    for step, name in enumerate("aba", start=1):
        model, w = models[name]
        weights = cache.acquire(name)
        (out,) = backend.execute(model.module(None, 2).executable, [backend.to_device(x), *weights])
        np.testing.assert_allclose(backend.to_host(out), np.tanh(x @ w), rtol=1e-5, atol=1e-6)
        assert cache.resident_bytes <= cache.budget
        assert cache.loads == step
    assert cache.evictions == 2
    for model, _ in models.values():
        model.close()
