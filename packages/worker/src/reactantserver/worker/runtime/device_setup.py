"""Step 3 of start-up: the backend for ``runtime.backend`` and what it means for the weights.

CUDA falls back to the CPU when ``allow_cpu_fallback`` allows it; the start-up line says how
host floors are kept (page-locked where the backend has it, 03 beyond) and whether transfers
overlap executions (prefetch). The on-demand budget's inputs come from the device arena::

    backend, platform, device_kind = create_backend(config)
    policy = budget_policy(config, backend)
"""

from __future__ import annotations

import logging

from reactantserver.core.config import Backend as BackendName
from reactantserver.core.config import WorkerConfig
from reactantserver.worker.runtime.backend import Backend, CpuArena
from reactantserver.worker.runtime.budget import BudgetPolicy, arena_bytes

__all__ = ["BackendStartError", "budget_policy", "cpu_arena", "create_backend", "floor_kind"]

_log = logging.getLogger("reactantserver.worker.boot")


class BackendStartError(RuntimeError):
    """The configured device cannot be used and CPU fallback is off (the worker exits 1)."""


def create_backend(config: WorkerConfig) -> tuple[Backend, str, str]:
    """The backend, its platform and device kind (step 3; CUDA falls back to CPU if allowed)."""
    # The only jax import of the server: the backend module (the XLA env is set by now).
    from reactantserver.worker.runtime.jax_backend import JaxBackend

    runtime = config.runtime
    wanted = "cuda" if runtime.backend is BackendName.CUDA else "cpu"
    # True means "where the backend has it and it pays" (JaxBackend decides), False never.
    page_locked = None if runtime.page_locked_weights else False
    arena = cpu_arena(config)
    if arena is not None and wanted != "cpu":
        raise BackendStartError("runtime.cpu_arena_bytes is for the cpu backend only")
    try:
        backend = JaxBackend(
            wanted, runtime.device_ordinal, page_locked=page_locked, cpu_arena=arena
        )
    except Exception as exc:
        if wanted == "cpu" or not runtime.allow_cpu_fallback:
            raise BackendStartError(f"cannot start the {wanted} backend: {exc}") from exc
        _log.warning("cuda backend unavailable (%s); falling back to cpu", exc)
        backend = JaxBackend("cpu", 0, page_locked=page_locked)
    if arena is not None:
        _log.info("weights load into a %s", arena.describe())
    _log.info(
        "backend ready platform=%s device_kind=%s arena=%d host_floors=%s async_transfers=%s",
        backend.platform,
        backend.device_kind,
        arena_bytes(backend.memory_stats()),
        floor_kind(runtime.page_locked_weights, runtime.shared_host_weights, backend),
        backend.async_transfers,
    )
    return backend, backend.platform, backend.device_kind


def cpu_arena(config: WorkerConfig) -> CpuArena | None:
    """The CPU arena ``runtime.cpu_arena_bytes`` asks for, or ``None`` (0: off)."""
    runtime = config.runtime
    if runtime.cpu_arena_bytes <= 0:
        return None
    return CpuArena(runtime.cpu_arena_bytes, runtime.cpu_arena_bandwidth_bytes_per_s)


def floor_kind(wanted: bool, shared: bool, backend: Backend) -> str:
    """How host floors are kept: ``page-locked``, ``pageable`` (and why) or ``shared-pageable``."""
    if shared:
        return "shared-pageable"
    if wanted and backend.page_locked_host:
        return "page-locked"
    return "pageable" if not wanted else "pageable (no page-locked memory used on this backend)"


def budget_policy(config: WorkerConfig, backend: Backend) -> BudgetPolicy:
    """The on-demand budget's inputs: the device arena and the configured shares."""
    runtime = config.runtime
    return BudgetPolicy(
        arena=arena_bytes(backend.memory_stats()),
        fraction=runtime.weight_cache_fraction,
        wiggle=runtime.weight_cache_wiggle_fraction,
        max_bytes=runtime.weight_cache_max_bytes,
    )
