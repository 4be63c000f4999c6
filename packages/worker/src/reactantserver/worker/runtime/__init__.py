"""The device side of the worker: compiled executables and the weights on the device.

Everything here talks to the :class:`~reactantserver.worker.runtime.backend.Backend`
protocol; only :mod:`~reactantserver.worker.runtime.jax_backend` imports jax. The dispatch
thread owns the :class:`WeightCache`; the loader thread builds :class:`LoadedModel` s.
"""

from __future__ import annotations

from reactantserver.worker.runtime.backend import (
    Backend,
    CompileSpec,
    CpuArena,
    MemoryStats,
    Signature,
    TensorType,
)
from reactantserver.worker.runtime.budget import (
    BudgetPolicy,
    WeightBudget,
    arena_bytes,
    cache_enabled,
    solve_weight_budget,
)
from reactantserver.worker.runtime.executable_cache import ExecutableCache
from reactantserver.worker.runtime.loader import CompiledModule, LoadedModel, load_bundle
from reactantserver.worker.runtime.probe import (
    CompiledRun,
    ModelRuns,
    ProbeResult,
    RunKey,
    model_runs,
    probe_scratch,
    start_up,
    warm_up,
)
from reactantserver.worker.runtime.residency import Residency, resolve_residency
from reactantserver.worker.runtime.weight_cache import (
    StoreWeightSource,
    WeightCache,
    WeightCacheStats,
    WeightSource,
    is_device_oom,
    run_with_oom_retry,
)

__all__ = [
    "Backend",
    "BudgetPolicy",
    "CompileSpec",
    "CompiledModule",
    "CompiledRun",
    "CpuArena",
    "ExecutableCache",
    "LoadedModel",
    "MemoryStats",
    "ModelRuns",
    "ProbeResult",
    "Residency",
    "RunKey",
    "Signature",
    "StoreWeightSource",
    "TensorType",
    "WeightBudget",
    "WeightCache",
    "WeightCacheStats",
    "WeightSource",
    "arena_bytes",
    "cache_enabled",
    "is_device_oom",
    "load_bundle",
    "model_runs",
    "probe_scratch",
    "resolve_residency",
    "run_with_oom_retry",
    "solve_weight_budget",
    "start_up",
    "warm_up",
]
