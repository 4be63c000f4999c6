"""Start-up scratch probe and warmup on the MockBackend."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import pytest

from reactantserver.core.dtypes import DType
from reactantserver.worker.runtime.backend import CompileSpec, TensorType
from reactantserver.worker.runtime.budget import BudgetPolicy
from reactantserver.worker.runtime.probe import (
    CompiledRun,
    ModelRuns,
    RunKey,
    probe_scratch,
    start_up,
    time_run,
    warm_up,
    zeros_for,
)
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.runtime.weight_cache import WeightCache
from reactantserver.worker.testing import MockBackend

ARENA = 10_000
FEATURES = 4
Array = np.ndarray[Any, Any]


@attrs.define(eq=False)
class ArraySource:
    """Weights held in memory (a WeightSource whose floor is always there)."""

    size: int
    host_resident: bool = True

    @property
    def nbytes(self) -> int:
        return self.size

    def load(self) -> Sequence[Array]:
        return [np.ones(self.size, np.uint8)]

    def keep_host(self) -> None:
        self.host_resident = True

    def drop_host(self) -> None:
        self.host_resident = False


def _identity(x: Array, _w: Array) -> Array:
    return x


def _broken(x: Array, _w: Array) -> Array:
    raise RuntimeError("INTERNAL: kernel failed")


def _run(
    backend: MockBackend, model: str, batch: int, scratch: int, fn: Any = _identity
) -> CompiledRun:
    module = f"{model}.b{batch}".encode()
    backend.register(module, fn, scratch_bytes=scratch)
    data = [TensorType(DType.F32, (batch, FEATURES))]
    return CompiledRun(None, batch, backend.compile(module, CompileSpec()), zeros_for(data))


def _world(
    *, explicit: bool = False, bytes_limit: int | None = ARENA
) -> tuple[MockBackend, WeightCache, list[ModelRuns]]:
    backend = MockBackend(bytes_limit=bytes_limit)
    cache = WeightCache(backend, explicit=explicit)
    cache.add_model("large", ArraySource(3000), Residency.PINNED_SYSTEM)
    cache.add_model("small", ArraySource(1000), Residency.PINNED_SYSTEM)
    cache.add_model("pinned", ArraySource(2000), Residency.PINNED_DEVICE)
    models = [
        ModelRuns("large", (_run(backend, "large", 1, 1000),)),
        ModelRuns("small", (_run(backend, "small", 1, 500), _run(backend, "small", 4, 2000))),
        ModelRuns("pinned", (_run(backend, "pinned", 1, 100),)),
    ]
    return backend, cache, models


POLICY = BudgetPolicy(arena=ARENA, fraction=1.0, wiggle=0.1)


def test_probe_measures_scratch_and_solves_the_budget() -> None:
    backend, cache, models = _world()
    result = probe_scratch(backend, cache, models, POLICY)
    assert result.probed == ("small", "large")  # ascending weight size
    io = 4 * FEATURES * 4  # the batch-4 input and its output, 64 bytes each
    # small at batch 4: peak = P + small + input + scratch + output.
    assert result.max_scratch == io + 2000 + io
    assert result.budget is not None
    assert result.budget.weight_pool == 9000 - result.max_scratch
    assert result.budget.on_demand_budget == 9000 - result.max_scratch - 2000
    assert cache.budget == result.budget.on_demand_budget
    assert cache.stats().max_scratch == result.max_scratch
    assert set(result.costs) == {
        RunKey("small", None, 1),
        RunKey("small", None, 4),
        RunKey("large", None, 1),
    }
    assert all(cost > 0 for cost in result.costs.values())
    assert ("small", None, 4) in result.costs  # a plain tuple finds the key too
    # Non-pinned weights were freed before each load; the pinned model stayed.
    assert cache.lru_order() == ["large"]
    assert cache.is_resident("pinned")
    assert backend.live_buffers == 2  # inputs and outputs of the runs were freed


def test_probe_keeps_a_larger_scratch_measured_before() -> None:
    backend, cache, models = _world()
    result = probe_scratch(backend, cache, models, attrs.evolve(POLICY, max_scratch=5000))
    assert result.max_scratch == 5000


def test_probe_of_a_model_admitted_later() -> None:
    backend, cache, models = _world()
    first = start_up(backend, cache, models, POLICY)
    assert first.budget is not None
    # The allocator's peak (from "large") does not reset; a smaller newcomer must not inflate S.
    cache.add_model("tiny", ArraySource(500), Residency.PINNED_SYSTEM)
    tiny = ModelRuns("tiny", (_run(backend, "tiny", 1, 10),))
    again = probe_scratch(
        backend, cache, [tiny], attrs.evolve(POLICY, max_scratch=first.max_scratch)
    )
    assert again.probed == ("tiny",)
    assert again.max_scratch == first.max_scratch
    assert cache.budget == first.budget.on_demand_budget
    # A newcomer with a larger scratch raises it.
    hungry = ModelRuns("tiny", (_run(backend, "tiny", 2, 6000),))
    third = probe_scratch(
        backend, cache, [hungry], attrs.evolve(POLICY, max_scratch=first.max_scratch)
    )
    assert third.max_scratch > first.max_scratch
    assert cache.budget < first.budget.on_demand_budget


def test_start_up_probes_then_warms_the_rest() -> None:
    backend, cache, models = _world()
    result = start_up(backend, cache, models, POLICY)
    assert result.probed == ("small", "large")
    assert result.warmed == ("pinned",)
    assert set(result.costs) == {
        RunKey("small", None, 1),
        RunKey("small", None, 4),
        RunKey("large", None, 1),
        RunKey("pinned", None, 1),
    }
    assert result.failed == ()
    assert result.budget is not None
    assert result.max_scratch == result.budget.max_scratch > 0


def test_warmup_false_still_probes() -> None:
    backend, cache, models = _world()
    result = start_up(backend, cache, models, POLICY, warmup=False)
    assert result.probed == ("small", "large")
    assert result.warmed == ()
    assert RunKey("pinned", None, 1) not in result.costs


def test_given_budget_skips_the_probe_and_warms_everything() -> None:
    backend, cache, models = _world()
    policy = attrs.evolve(POLICY, max_bytes=1500)
    result = start_up(backend, cache, models, policy)
    assert result.probed == ()
    assert result.warmed == ("large", "small", "pinned")
    assert cache.budget == 1500
    assert result.budget is not None
    assert not result.budget.auto_sized
    assert len(result.costs) == 4


def test_without_the_cache_everything_is_warmed() -> None:
    backend = MockBackend()
    cache = WeightCache(backend, enabled=False)
    cache.add_model("m", ArraySource(100), Residency.UNPINNED)
    models = [ModelRuns("m", (_run(backend, "m", 1, 0), _run(backend, "m", 2, 0)))]
    policy = BudgetPolicy(arena=0, fraction=1.0, wiggle=0.1)
    result = start_up(backend, cache, models, policy)
    assert (result.probed, result.warmed, result.budget) == ((), ("m",), None)
    assert set(result.costs) == {RunKey("m", None, 1), RunKey("m", None, 2)}


def test_explicit_mode_probes_nothing_and_warms_only_pinned() -> None:
    backend, cache, models = _world(explicit=True)
    result = start_up(backend, cache, models, POLICY)
    assert result.probed == ()
    assert result.warmed == ("pinned",)
    assert result.max_scratch == 0


def test_a_failing_run_warns_and_keeps_going(caplog: pytest.LogCaptureFixture) -> None:
    backend, cache, models = _world()
    broken = _run(backend, "small", 8, 0, fn=_broken)
    models[1] = attrs.evolve(models[1], runs=(*models[1].runs, broken))
    with caplog.at_level(logging.WARNING):
        result = start_up(backend, cache, models, POLICY)
    assert result.failed == (RunKey("small", None, 8),)
    assert RunKey("small", None, 8) not in result.costs
    assert len(result.costs) == 4
    assert "kernel failed" in caplog.text
    assert "keeping the default cost" in caplog.text


def test_a_model_that_cannot_load_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    backend, cache, models = _world()
    cache.add_model("huge", ArraySource(ARENA * 2), Residency.UNPINNED)
    models.append(ModelRuns("huge", (_run(backend, "huge", 1, 0),)))
    with caplog.at_level(logging.WARNING):
        result = start_up(backend, cache, models, POLICY)
    assert result.probed == ("small", "large")
    assert "cannot load the weights of 'huge'" in caplog.text
    assert result.warmed == ("pinned",)


def test_models_without_runs_or_unknown_are_skipped() -> None:
    backend, cache, _ = _world()
    extra = [ModelRuns("ghost", (_run(backend, "ghost", 1, 0),)), ModelRuns("small", ())]
    result = warm_up(backend, cache, extra)
    assert result.warmed == ()
    assert result.costs == {}


def test_time_run_frees_inputs_and_outputs_even_on_failure() -> None:
    backend, cache, _ = _world()
    weights = cache.acquire("pinned")
    live = backend.live_buffers
    run = _run(backend, "x", 2, 0)
    assert time_run(backend, run, weights) >= 0
    assert backend.live_buffers == live
    backend.fail_next_execution()
    with pytest.raises(RuntimeError):
        time_run(backend, run, weights)
    assert backend.live_buffers == live


def test_zeros_for() -> None:
    build = zeros_for([TensorType(DType.I32, (2, 3)), TensorType(DType.F16, ())])
    a, b = build()
    assert (a.shape, b.shape) == ((2, 3), ())
    assert a.dtype == np.dtype(np.int32)
    assert b.dtype == np.dtype(np.float16)
    assert not a.any()
    with pytest.raises(ValueError, match="dynamic"):
        zeros_for([TensorType(DType.F32, (-1, 3))])
