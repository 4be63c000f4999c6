"""Start-up scratch probe and warmup: measure ``S``, solve the budget, seed the cost table.

Runs on the dispatch thread before its loop starts. The probe
loads each on-demand model alone, smallest first, runs every compiled size once on zeros and
reads the allocator's ``peak_bytes_in_use``; since the peak only grows, the scratch of the worst
execution is bounded by ``peak - P - largest weights loaded so far``. Warmup runs every size of
the models the probe did not cover::

    runs = [ModelRuns("resnet", (CompiledRun("default", 8, exe, zeros_for(data_inputs)),))]
    result = start_up(backend, cache, runs, policy, warmup=config.runtime.warmup)
    costs.seed(result.costs)
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, TypeAlias

import attrs
import numpy as np

from reactantserver.worker.runtime._weight_source import HostArray
from reactantserver.worker.runtime.backend import (
    Backend,
    DeviceBuffer,
    Executable,
    TensorType,
)
from reactantserver.worker.runtime.budget import BudgetPolicy, WeightBudget
from reactantserver.worker.runtime.loader import LoadedModel
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.runtime.weight_cache import WeightCache, run_with_oom_retry

__all__ = [
    "CompiledRun",
    "ModelRuns",
    "ProbeResult",
    "RunKey",
    "VariantId",
    "model_runs",
    "probe_scratch",
    "start_up",
    "time_run",
    "warm_up",
    "zeros_for",
]

_log = logging.getLogger(__name__)


#: A variant as the loader names it (e.g. its file index, ``None`` for the default module).
VariantId: TypeAlias = int | str | None


class RunKey(NamedTuple):
    """Which cost a measurement seeds: ``(model, variant, batch)``."""

    model: str
    variant: VariantId
    batch: int


@attrs.frozen
class CompiledRun:
    """One compiled (variant, batch size) of a model, with a builder of zero data inputs."""

    variant: VariantId
    batch: int
    executable: Executable
    zero_inputs: Callable[[], Sequence[HostArray]]
    """Host arrays for the data arguments; the model's weights follow them."""


@attrs.frozen
class ModelRuns:
    """Every compiled size of one model (its weights are in the weight cache under ``name``)."""

    name: str
    runs: tuple[CompiledRun, ...]


@attrs.frozen
class ProbeResult:
    """What start-up measured: cost seeds, the scratch ``S`` and the budget solved from it."""

    costs: Mapping[RunKey, float]
    """Seconds of input transfer + execution + output transfer, per compiled size that ran."""
    max_scratch: int
    budget: WeightBudget | None
    """The solved budget (``None`` when the cache is off or no policy was given)."""
    probed: tuple[str, ...] = ()
    warmed: tuple[str, ...] = ()
    failed: tuple[RunKey, ...] = ()
    """Sizes whose run failed; they keep the default cost."""


def zeros_for(types: Sequence[TensorType]) -> Callable[[], list[HostArray]]:
    """A zero-input builder for static argument types."""
    for t in types:
        if not t.static:
            raise ValueError(f"cannot build zeros for dynamic type {t}")

    def build() -> list[HostArray]:
        return [np.zeros(t.shape, dtype=t.dtype.numpy) for t in types]

    return build


def model_runs(loaded: LoadedModel) -> ModelRuns:
    """Every compiled size of ``loaded`` on zero inputs (sizes with dynamic extents skipped)."""
    data_inputs = len(loaded.manifest.executable_inputs)
    runs: list[CompiledRun] = []
    ordered = sorted(
        loaded.modules.items(), key=lambda kv: (-1 if kv[0][0] is None else kv[0][0], kv[0][1])
    )
    for (variant, batch), module in ordered:
        try:
            zeros = zeros_for(module.signature.inputs[:data_inputs])
        except ValueError as exc:  # a dynamic extent: no zeros to run it on
            _log.debug("warm-up of %r skips %s: %s", loaded.name, module.path.name, exc)
            continue
        runs.append(CompiledRun(variant, batch, module.executable, zeros))
    return ModelRuns(loaded.name, tuple(runs))


def time_run(backend: Backend, run: CompiledRun, weights: Sequence[DeviceBuffer]) -> float:
    """Seconds of input transfer + execution + output transfer of ``run`` on zeros: the faster
    of two runs, since an executable's first run pays one-time costs (first allocations,
    page faults) that would make its size look dearer than it is to the planner's pad-up
    and the adaptive wait for as long as the size is not run again.

    Weight loading is excluded (the caller acquired ``weights`` already), as in the scheduler's
    cost measurement. Inputs and outputs are freed before returning.
    """
    return min(_time_once(backend, run, weights) for _ in range(2))


def _time_once(backend: Backend, run: CompiledRun, weights: Sequence[DeviceBuffer]) -> float:
    hosts = run.zero_inputs()
    buffers: list[DeviceBuffer] = []
    try:
        start = time.perf_counter()
        for host in hosts:
            buffers.append(backend.to_device(host))
        inputs = list(buffers)
        outputs = backend.execute(run.executable, [*inputs, *weights])
        buffers.extend(outputs)
        for out in outputs:
            backend.to_host(out)
        return time.perf_counter() - start
    finally:
        for buf in buffers:
            backend.free(buf)


def probe_scratch(
    backend: Backend,
    cache: WeightCache,
    models: Sequence[ModelRuns],
    policy: BudgetPolicy,
) -> ProbeResult:
    """Measure ``S`` over the on-demand models, then solve and install the budget.

    Also for a model admitted later: pass the policy with the ``S`` measured so far, which
    only grows. Device-pinned models, models without runs and (explicit mode) models not
    resident are skipped; the result's ``probed`` lists the ones covered. A failing load or
    run logs a warning and the probe goes on.
    """
    cache.set_budget(policy.provisional_budget())
    candidates = [
        m
        for m in models
        if m.runs
        and m.name in cache
        and cache.residency(m.name).evictable
        and not (cache.explicit and not cache.is_resident(m.name))
    ]
    candidates.sort(key=lambda m: (cache.nbytes(m.name), m.name))
    costs: dict[RunKey, float] = {}
    failed: list[RunKey] = []
    probed: list[str] = []
    scratch = policy.max_scratch
    for model in candidates:
        cache.evict_unpinned()
        try:
            weights = cache.acquire(model.name)
        except Exception as exc:
            _log.warning("probe: cannot load the weights of %r: %s", model.name, exc)
            continue
        probed.append(model.name)
        _run_all(backend, cache, model, weights, stage="probe", costs=costs, failed=failed)
        stats = backend.memory_stats()
        if stats is not None:
            # The peak never resets, so it may stem from an earlier, larger model: subtract the
            # largest weights loaded so far (by this probe or since start-up), not this model's.
            peak = stats.peak_bytes_in_use
            scratch = max(scratch, peak - cache.pinned_bytes - cache.largest_load_bytes)
    solved = cache.set_budget_policy(attrs.evolve(policy, max_scratch=max(0, scratch)))
    _log.info(
        "probe: %d model(s), max scratch %d bytes, on-demand budget %d bytes",
        len(probed),
        solved.max_scratch,
        solved.on_demand_budget,
    )
    return ProbeResult(
        costs=costs,
        max_scratch=solved.max_scratch,
        budget=solved,
        probed=tuple(probed),
        failed=tuple(failed),
    )


def warm_up(backend: Backend, cache: WeightCache, models: Sequence[ModelRuns]) -> ProbeResult:
    """Run every size of ``models`` once on zeros, loading weights through the cache.

    In explicit mode a model that is not resident is skipped (it is warmed when pinned).
    """
    costs: dict[RunKey, float] = {}
    failed: list[RunKey] = []
    warmed: list[str] = []
    for model in models:
        if not model.runs or model.name not in cache:
            continue
        pinned = cache.residency(model.name) is Residency.PINNED_DEVICE
        if cache.explicit and not pinned and not cache.is_resident(model.name):
            continue
        try:
            weights = cache.acquire(model.name)
        except Exception as exc:
            _log.warning("warmup: cannot load the weights of %r: %s", model.name, exc)
            continue
        warmed.append(model.name)
        _run_all(backend, cache, model, weights, stage="warmup", costs=costs, failed=failed)
    return ProbeResult(
        costs=costs, max_scratch=0, budget=None, warmed=tuple(warmed), failed=tuple(failed)
    )


def start_up(
    backend: Backend,
    cache: WeightCache,
    models: Sequence[ModelRuns],
    policy: BudgetPolicy | None,
    *,
    warmup: bool = True,
) -> ProbeResult:
    """Probe (when the budget is auto-sized) and warm up the rest (unless ``warmup`` is off).

    With a ``policy`` whose budget is given (``max_bytes``) the budget is installed without a
    probe; without a policy the cache keeps the budget it has.
    """
    budget: WeightBudget | None = None
    costs: dict[RunKey, float] = {}
    failed: list[RunKey] = []
    probed: tuple[str, ...] = ()
    scratch = 0
    if cache.enabled and policy is not None:
        if policy.auto_sized:
            probe = probe_scratch(backend, cache, models, policy)
            costs.update(probe.costs)
            failed.extend(probe.failed)
            probed, budget, scratch = probe.probed, probe.budget, probe.max_scratch
        else:
            budget = cache.set_budget_policy(policy)
    warmed: tuple[str, ...] = ()
    if warmup:
        warm = warm_up(backend, cache, [m for m in models if m.name not in probed])
        costs.update(warm.costs)
        failed.extend(warm.failed)
        warmed = warm.warmed
    return ProbeResult(
        costs=costs,
        max_scratch=scratch,
        budget=budget,
        probed=probed,
        warmed=warmed,
        failed=tuple(failed),
    )


def _run_all(
    backend: Backend,
    cache: WeightCache,
    model: ModelRuns,
    weights: Sequence[DeviceBuffer],
    *,
    stage: str,
    costs: dict[RunKey, float],
    failed: list[RunKey],
) -> None:
    for run in model.runs:
        key = RunKey(model.name, run.variant, run.batch)
        try:
            costs[key] = run_with_oom_retry(
                cache, model.name, functools.partial(time_run, backend, run, weights)
            )
        except Exception as exc:
            _log.warning(
                "%s: %r variant %r batch %d failed, keeping the default cost: %s",
                stage,
                model.name,
                run.variant,
                run.batch,
                exc,
            )
            failed.append(key)
