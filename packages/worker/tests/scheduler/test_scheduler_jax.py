"""A real bundle on the jax CPU backend behind a started scheduler: every caller gets its row.

``y = x @ W + b`` compiled at batch sizes [1, 4, 8], loaded through the executable and
weight caches. A control command holds the dispatch thread while the burst is queued, so
coalescing is certain (not a race), then results are compared with NumPy per caller.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import jax
import numpy as np
import pytest

from packages.worker.tests.conftest import BundleMaker, Tensor
from reactantserver.core.config import SchedulerConfig, SchedulingDiscipline
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.weights import PrivateWeightStore
from reactantserver.worker.runtime import ExecutableCache, Residency, WeightCache, load_bundle
from reactantserver.worker.runtime.jax_backend import JaxBackend
from reactantserver.worker.scheduler import ScheduledModel, Scheduler

from ._fake import WAIT_S, wait_for

Array = np.ndarray[Any, Any]

X = Tensor("x", "f32", "nk", {"k": 4})
Y = Tensor("y", "f32", "nm", {"m": 3})


def _affine(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    return x @ w + b


@attrs.define
class Served:
    """A started scheduler serving the affine model ``name``."""

    scheduler: Scheduler
    name: str
    w: Array
    b: Array

    def expected(self, x: Array) -> Array:
        return x @ self.w + self.b

    def hold(self) -> threading.Event:
        """Block the dispatch thread in a control command until the event is set."""
        release = threading.Event()
        self.scheduler.control(lambda: release.wait(WAIT_S))
        return release


@pytest.fixture
def served(make_bundle: BundleMaker, tmp_path: Path) -> Iterator[Served]:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal((3,)).astype(np.float32)
    bundle = make_bundle(
        "affine",
        _affine,
        inputs=[X],
        outputs=[Y],
        weights=[("w", w), ("b", b)],
        batch_sizes=[1, 4, 8],
    )
    backend = JaxBackend("cpu")
    loaded = load_bundle(bundle, backend, ExecutableCache(tmp_path / "exe", backend))
    cache = WeightCache(backend, budget=1 << 20)
    cache.add_model(loaded.name, loaded.weight_source(PrivateWeightStore()), Residency.UNPINNED)
    scheduler = Scheduler(backend, cache, SchedulerConfig(discipline=SchedulingDiscipline.FAIR))
    model = ScheduledModel.from_loaded(loaded)
    assert model.sizes == {None: (1, 4, 8)}
    assert model.weights == "affine"
    scheduler.add_model(model)
    scheduler.start()
    try:
        yield Served(scheduler, loaded.name, w, b)
    finally:
        scheduler.stop(grace_s=5.0)
        loaded.close()


def _inputs(n: int, rows: int = 1, seed: int = 0) -> list[Array]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((rows, 4)).astype(np.float32) + i for i in range(n)]


def test_concurrent_event_loop_callers_each_get_their_own_row(served: Served) -> None:
    xs = _inputs(32)
    release = served.hold()

    async def burst() -> list[list[Array]]:
        tasks = [
            asyncio.ensure_future(served.scheduler.infer(served.name, [NamedTensor("x", x)]))
            for x in xs
        ]
        await asyncio.sleep(0)  # every task has queued its request
        assert served.scheduler.queue_depth(served.name) == 32
        release.set()
        return await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)

    results = asyncio.run(burst())
    for x, outputs in zip(xs, results, strict=True):
        assert len(outputs) == 1
        assert outputs[0].shape == (1, 3)
        np.testing.assert_allclose(outputs[0], served.expected(x), rtol=1e-5, atol=1e-5)
    stats = served.scheduler.stats(served.name)
    assert stats is not None
    assert stats.dispatch_count < 32
    assert stats.batch_histogram == {8: 4}
    assert (stats.requests_served, stats.rows_served) == (32, 32)


def test_concurrent_threads_each_get_their_own_row(served: Served) -> None:
    xs = _inputs(16, seed=1)
    results: dict[int, list[Array]] = {}
    errors: list[BaseException] = []
    release = served.hold()

    def caller(i: int) -> None:
        try:
            results[i] = served.scheduler.call(served.name, [NamedTensor("x", xs[i])])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    wait_for(lambda: served.scheduler.queue_depth(served.name) == 16)
    release.set()
    for thread in threads:
        thread.join(WAIT_S)
        assert not thread.is_alive()
    assert errors == []
    for i, x in enumerate(xs):
        np.testing.assert_allclose(results[i][0], served.expected(x), rtol=1e-5, atol=1e-5)
    stats = served.scheduler.stats(served.name)
    assert stats is not None
    assert stats.dispatch_count < 16
    assert stats.batch_histogram == {8: 2}


def test_multi_row_requests_are_sliced_back_correctly(served: Served) -> None:
    xs = [x for i in range(12) for x in _inputs(1, rows=1 + i % 3, seed=10 + i)]

    async def burst() -> list[list[Array]]:
        return await asyncio.wait_for(
            asyncio.gather(
                *(served.scheduler.infer(served.name, [NamedTensor("x", x)]) for x in xs)
            ),
            WAIT_S,
        )

    results = asyncio.run(burst())
    for x, (out,) in zip(xs, results, strict=True):
        assert out.shape == (x.shape[0], 3)
        np.testing.assert_allclose(out, served.expected(x), rtol=1e-5, atol=1e-5)
    stats = served.scheduler.stats(served.name)
    assert stats is not None
    assert stats.rows_served == sum(x.shape[0] for x in xs)
    assert served.scheduler.costs.of_model(served.name)
