"""The on-demand weight cache on the real jax CPU backend.

Three small dense models share one compiled shape; each has 4160 bytes of weights and the
budget fits exactly one of them, so every switch is an eviction and a reload.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reactantserver.core.dtypes import DType
from reactantserver.core.errors import ModelUnavailableError
from reactantserver.core.weights import PrivateWeightStore, WeightSpec
from reactantserver.worker.runtime.backend import CompileSpec, Executable
from reactantserver.worker.runtime.jax_backend import JaxBackend
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.runtime.weight_cache import StoreWeightSource, WeightCache

BATCH = 2
OUT = 16
SMALL_IN = 64
BIG_IN = 256
SMALL_BYTES = (SMALL_IN * OUT + OUT) * 4  # 4160
BIG_BYTES = (BIG_IN * OUT + OUT) * 4

Array = np.ndarray[Any, Any]


def _export_dense(in_dim: int) -> bytes:
    def entry(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
        return x @ w + b

    shapes = (
        jax.ShapeDtypeStruct((BATCH, in_dim), jnp.float32),
        jax.ShapeDtypeStruct((in_dim, OUT), jnp.float32),
        jax.ShapeDtypeStruct((OUT,), jnp.float32),
    )
    exported = jax.export.export(jax.jit(entry), platforms=("cpu",))(*shapes)
    return bytes(exported.mlir_module_serialized)


@pytest.fixture(scope="module")
def backend() -> JaxBackend:
    return JaxBackend("cpu")


@pytest.fixture(scope="module")
def executables(backend: JaxBackend) -> dict[int, Executable]:
    return {n: backend.compile(_export_dense(n), CompileSpec()) for n in (SMALL_IN, BIG_IN)}


@attrs.define(eq=False)
class Model:
    """A dense model's reference weights, and a count of how often its file was 'read'."""

    name: str
    w: Array
    b: Array
    exe: Executable
    reads: int = 0

    @property
    def specs(self) -> list[WeightSpec]:
        return [
            WeightSpec("w", DType.F32, tuple(self.w.shape)),
            WeightSpec("b", DType.F32, tuple(self.b.shape)),
        ]

    def fill(self, arrays: list[Array]) -> None:
        self.reads += 1
        arrays[0][...] = self.w
        arrays[1][...] = self.b

    def source(self, store: PrivateWeightStore) -> StoreWeightSource:
        return StoreWeightSource(store, self.name, hash(self.name), self.specs, self.fill)


def _model(name: str, seed: int, in_dim: int, executables: dict[int, Executable]) -> Model:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((in_dim, OUT), dtype=np.float32)
    b = rng.standard_normal((OUT,), dtype=np.float32)
    return Model(name, w, b, executables[in_dim])


@pytest.fixture
def models(executables: dict[int, Executable]) -> dict[str, Model]:
    return {
        "A": _model("A", 1, SMALL_IN, executables),
        "B": _model("B", 2, SMALL_IN, executables),
        "C": _model("C", 3, SMALL_IN, executables),
        "P": _model("P", 4, SMALL_IN, executables),
        "BIG": _model("BIG", 5, BIG_IN, executables),
    }


@pytest.fixture
def store() -> PrivateWeightStore:
    return PrivateWeightStore()


def _serve(backend: JaxBackend, cache: WeightCache, model: Model) -> list[Any]:
    """One execution as the dispatcher does it; checks the result against NumPy."""
    weights = cache.acquire(model.name)
    x = np.random.default_rng(99).standard_normal((BATCH, model.w.shape[0]), dtype=np.float32)
    x_dev = backend.to_device(x)
    (out,) = backend.execute(model.exe, [x_dev, *weights])
    np.testing.assert_allclose(backend.to_host(out), x @ model.w + model.b, rtol=1e-5, atol=1e-5)
    backend.free(x_dev)
    backend.free(out)
    return weights


def _cache(backend: JaxBackend, budget: int, **kwargs: Any) -> WeightCache:
    return WeightCache(backend, budget=budget, **kwargs)


def test_model_sizes() -> None:
    assert SMALL_BYTES == 4160
    assert BIG_BYTES > 2 * SMALL_BYTES


@pytest.mark.parametrize("residency", [Residency.UNPINNED, Residency.PINNED_SYSTEM])
def test_a_b_a_with_a_budget_of_one_model(
    backend: JaxBackend,
    models: dict[str, Model],
    store: PrivateWeightStore,
    residency: Residency,
) -> None:
    cache = _cache(backend, SMALL_BYTES)
    for name in "ABC":
        cache.add_model(name, models[name].source(store), residency)
        assert cache.nbytes(name) == SMALL_BYTES
    assert cache.resident_bytes == 0
    held: dict[str, list[Any]] = {}
    for step, name in enumerate("ABA", start=1):
        held[f"{name}{step}"] = _serve(backend, cache, models[name])
        assert cache.resident_bytes <= cache.budget
        assert cache.lru_order() == [name]
    assert (cache.loads, cache.evictions) == (3, 2)
    assert cache.load_bytes == 3 * SMALL_BYTES
    assert cache.load_seconds > 0
    # Evicted buffers were deleted eagerly, not left to the garbage collector.
    assert all(buf.is_deleted() for buf in held["A1"] + held["B2"])
    assert not any(buf.is_deleted() for buf in held["A3"])
    if residency is Residency.UNPINNED:
        assert (models["A"].reads, models["B"].reads, models["C"].reads) == (2, 1, 0)
        assert not cache.host_resident("A")
    else:
        # The floor was read once at admission; reloads are host->device copies.
        assert (models["A"].reads, models["B"].reads, models["C"].reads) == (1, 1, 1)
        assert cache.host_resident("A")
    stats = cache.stats()
    assert (stats.loads, stats.evictions, stats.resident_bytes) == (3, 2, SMALL_BYTES)


def test_pinned_device_model_is_never_evicted_and_outside_the_budget(
    backend: JaxBackend, models: dict[str, Model], store: PrivateWeightStore
) -> None:
    cache = _cache(backend, SMALL_BYTES)
    cache.add_model("P", models["P"].source(store), Residency.PINNED_DEVICE)
    for name in "AB":
        cache.add_model(name, models[name].source(store), Residency.UNPINNED)
    assert cache.is_resident("P")
    assert cache.pinned_bytes == SMALL_BYTES
    assert cache.resident_bytes == 0
    pinned = _serve(backend, cache, models["P"])
    for name in "ABAB":
        _serve(backend, cache, models[name])
        assert cache.resident_bytes <= cache.budget
        assert cache.is_resident("P")
        _serve(backend, cache, models["P"])
    assert "P" not in cache.lru_order()
    assert not any(buf.is_deleted() for buf in pinned)
    assert cache.evictions == 3
    assert cache.loads == 1 + 4  # the pinned admission plus four on-demand loads
    assert not cache.host_resident("P")  # PINNED_DEVICE keeps no host copy
    assert cache.evict_unpinned() == 1
    assert cache.is_resident("P")


def test_model_larger_than_the_budget_still_serves(
    backend: JaxBackend,
    models: dict[str, Model],
    store: PrivateWeightStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    cache = _cache(backend, 2 * SMALL_BYTES, clock=lambda: now[0])
    for name in ("A", "B", "BIG"):
        cache.add_model(name, models[name].source(store), Residency.PINNED_SYSTEM)
    held = [*_serve(backend, cache, models["A"]), *_serve(backend, cache, models["B"])]
    assert cache.resident_bytes == 2 * SMALL_BYTES
    with caplog.at_level(logging.WARNING):
        _serve(backend, cache, models["BIG"])
    assert cache.lru_order() == ["BIG"]
    assert all(buf.is_deleted() for buf in held)
    assert cache.evictions == 2
    oversize = [r for r in caplog.records if "exceed the on-demand budget" in r.getMessage()]
    assert len(oversize) == 1
    assert "'BIG'" in oversize[0].getMessage()
    # Rate-limited per model: a reload soon after does not warn again, a later one does.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _serve(backend, cache, models["A"])
        _serve(backend, cache, models["BIG"])
        assert not caplog.records
        now[0] += 3600
        _serve(backend, cache, models["A"])
        _serve(backend, cache, models["BIG"])
    assert len(caplog.records) == 1


def test_explicit_mode_serves_only_resident_models(
    backend: JaxBackend, models: dict[str, Model], store: PrivateWeightStore
) -> None:
    cache = _cache(backend, 10 * SMALL_BYTES, explicit=True)
    cache.add_model("A", models["A"].source(store), Residency.PINNED_SYSTEM)
    cache.add_model("P", models["P"].source(store), Residency.PINNED_DEVICE)
    assert not cache.is_resident("A")
    with pytest.raises(ModelUnavailableError, match="not resident"):
        cache.acquire("A")
    _serve(backend, cache, models["P"])
    assert cache.set_residency("A", Residency.PINNED_DEVICE) is Residency.PINNED_SYSTEM
    weights = _serve(backend, cache, models["A"])
    assert cache.pinned_bytes == 2 * SMALL_BYTES
    # Leaving PINNED_DEVICE in explicit mode frees the device copy at once.
    cache.set_residency("A", Residency.PINNED_SYSTEM)
    assert all(buf.is_deleted() for buf in weights)
    assert cache.host_resident("A")
    with pytest.raises(ModelUnavailableError, match="not resident"):
        cache.acquire("A")
    assert cache.compact(reload=["A"]) == 0  # the reload list is ignored in explicit mode


def test_busy_models_are_evicted_last(
    backend: JaxBackend, models: dict[str, Model], store: PrivateWeightStore
) -> None:
    busy: set[str] = set()
    cache = _cache(backend, 2 * SMALL_BYTES, busy=busy.__contains__)
    for name in "ABC":
        cache.add_model(name, models[name].source(store), Residency.PINNED_SYSTEM)
    _serve(backend, cache, models["A"])
    _serve(backend, cache, models["B"])
    assert cache.lru_order() == ["A", "B"]
    busy.add("A")  # A is least recently used but has queued requests
    _serve(backend, cache, models["C"])
    assert cache.lru_order() == ["A", "C"]
    # When every candidate is busy, plain LRU order decides.
    busy.update("AC")
    _serve(backend, cache, models["B"])
    assert cache.lru_order() == ["C", "B"]
    assert cache.evictions == 2


def test_compaction_frees_everything_unpinned_and_reloads_the_listed(
    backend: JaxBackend,
    models: dict[str, Model],
    store: PrivateWeightStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = _cache(backend, 2 * SMALL_BYTES)
    cache.add_model("P", models["P"].source(store), Residency.PINNED_DEVICE)
    for name in "AB":
        cache.add_model(name, models[name].source(store), Residency.PINNED_SYSTEM)
    old_a = _serve(backend, cache, models["A"])
    old_b = _serve(backend, cache, models["B"])
    pinned = cache.acquire("P")
    with caplog.at_level(logging.INFO):
        assert cache.compact(reload=["B", "gone"]) == 1
    assert all(buf.is_deleted() for buf in old_a + old_b)
    assert not any(buf.is_deleted() for buf in pinned)
    assert cache.lru_order() == ["B"]
    assert not cache.is_resident("A")
    assert cache.host_resident("A")  # host floors are untouched
    assert (cache.compactions, cache.loads_since_compaction) == (1, 0)
    assert cache.evictions == 0  # compaction is not eviction
    assert any("compaction freed 2 model(s), reloaded 1" in r.getMessage() for r in caplog.records)
    assert any("no model 'gone'" in r.getMessage() for r in caplog.records)
    for name in "BAP":
        _serve(backend, cache, models[name])


def test_remove_model_frees_device_and_host(
    backend: JaxBackend, models: dict[str, Model], store: PrivateWeightStore
) -> None:
    cache = _cache(backend, SMALL_BYTES)
    cache.add_model("A", models["A"].source(store), Residency.PINNED_SYSTEM)
    weights = _serve(backend, cache, models["A"])
    cache.remove_model("A")
    assert all(buf.is_deleted() for buf in weights)
    assert "A" not in cache
    assert cache.resident_bytes == 0
