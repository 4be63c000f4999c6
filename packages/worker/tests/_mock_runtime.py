"""A worker runtime over the MockBackend, for server tests that read state but never execute.

The scheduler is not started; the weight cache holds whatever the test adds. ``pool`` is a
fixture: the test modules import it by name and list it in their ``__all__``::

    runtime = state.runtime = mock_runtime(state, pool, enabled=True, budget=SIZE)
    runtime.weights.add_model("m", FakeSource(size=64), Residency.UNPINNED)
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest

from reactantserver.core.weights import PrivateWeightStore
from reactantserver.worker.dataplane import DataPlane
from reactantserver.worker.runtime import ExecutableCache, WeightCache
from reactantserver.worker.scheduler import Scheduler
from reactantserver.worker.state import Runtime, WorkerState
from reactantserver.worker.testing import MockBackend

__all__ = ["mock_runtime", "pool"]


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    """A one-thread executor for the runtime, shut down after the test."""
    executor = concurrent.futures.ThreadPoolExecutor(1)
    yield executor
    executor.shutdown()


def mock_runtime(
    state: WorkerState,
    pool: concurrent.futures.ThreadPoolExecutor,
    *,
    enabled: bool,
    budget: int,
    bytes_limit: int | None = None,
) -> Runtime:
    """A runtime over ``MockBackend(bytes_limit)`` with an on-demand weight ``budget``."""
    backend = MockBackend(bytes_limit=bytes_limit)
    weights = WeightCache(backend, budget=budget, enabled=enabled)
    scheduler = Scheduler(backend, weights)
    return Runtime(
        backend=backend,
        platform="cpu",
        device_kind="mock",
        weights=weights,
        executables=ExecutableCache(None, backend),
        store=PrivateWeightStore(),
        scheduler=scheduler,
        dataplane=DataPlane(state.registry, scheduler, pool, limiter=state.limiter),
        pool=pool,
    )
